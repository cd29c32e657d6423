"""Client datasets that TFF's `worker_binary` iterates without stalling: tf.data autotuning off.

Why (issue 22, measured in docs/benchmarks.md §4 "Where the slow rounds came from"): a client's
`tf.data` iterator with autotuning on (TF's default) starts a model thread
(`tensorflow::data::model::Model::OptimizeLoop`) that sleeps between optimizations for a period
that doubles up to 60 s. Inside TFF 0.87's worker, when the client's computation ends, the
iterator's destructor (`RootDataset::Iterator::~Iterator`, joining that thread) waits until the
sleep runs out: stack dumps of the worker during a stall show exactly these two threads, and both
processes idle. Rounds of 10 `lstm-paper` clients took 13-42 s for the same work (spread 2.9);
with autotuning off they take 11.5-13.5 s (spread 1.17) and use 1.9 of 2 cores instead of 1.2.

Autotuning only chooses parallelism and buffer sizes of `map`/`prefetch`-style stages, so turning
it off changes no element and no number: fedmf's client pipelines (`from_tensor_slices` +
`batch`) have no such stage to tune. The option is part of the dataset's graph, so it reaches the
worker through TFF's serialization (`DatasetToGraphV2`); tests/tff/test_client_data.py checks
that it survives the round trip.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ['worker_dataset', 'worker_datasets']


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.autotune.enabled = False
  return options


def worker_dataset(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with tf.data autotuning off: the same elements, no stall at the end of each client
  computation in TFF's worker (see the module docstring). Use it on the client datasets you pass to
  a TFF computation, e.g. `process.next(state, [worker_dataset(d) for d in datasets])`."""
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(f'worker_dataset expects a tf.data.Dataset, got {type(dataset).__name__}')
  return dataset.with_options(_options())


def worker_datasets(client_data: Any) -> Any:
  """A list (or tuple: a tuple comes back) of client values with every `tf.data.Dataset` in it
  passed through `worker_dataset`; other values, and anything that is not a list or tuple, are
  returned as given."""
  if not isinstance(client_data, (list, tuple)):
    return client_data
  out = [worker_dataset(d) if isinstance(d, tf.data.Dataset) else d for d in client_data]
  return out if isinstance(client_data, list) else tuple(out)
