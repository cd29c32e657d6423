"""Client datasets for TFF's worker: tf.data autotuning off, the same elements, and the option
survives TFF's serialization (how it reaches the worker)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.executors import value_serialization

from fedmf.tasks import stackoverflow
from fedmf.tasks.synthetic import SyntheticTask
from fedmf.tff import client_data
from fedmf.tff.host_noise import HostNoiseFedAvg


def _batches():
  x = np.arange(40, dtype=np.int32).reshape(10, 4)
  return tf.data.Dataset.from_tensor_slices((x, x + 1)).batch(3)


def _elements(dataset):
  return [tuple(t.numpy().tolist() for t in element) for element in dataset]


def test_autotuning_is_on_by_default_and_off_in_worker_datasets():
  plain = _batches()
  assert plain.options().autotune.enabled is not False  # TF's default: the stalling case
  assert client_data.worker_dataset(plain).options().autotune.enabled is False


def test_the_elements_are_unchanged():
  assert _elements(client_data.worker_dataset(_batches())) == _elements(_batches())


def test_the_option_survives_tffs_serialization():
  """TFF sends a client dataset to its worker as a graph (DatasetToGraphV2): the option is in it."""
  element_type = tff.types.tensorflow_to_type(_batches().element_spec)
  for dataset, turned_off in ((_batches(), False), (client_data.worker_dataset(_batches()), True)):
    graph_def = value_serialization._serialize_dataset(dataset)  # pylint: disable=protected-access
    received = value_serialization._deserialize_dataset_from_graph_def(  # pylint: disable=protected-access
      graph_def, element_type
    )
    assert (received.options().autotune.enabled is False) is turned_off  # None: TF's default, on
    assert _elements(received) == _elements(_batches())


def test_worker_datasets_maps_lists_and_tuples_and_keeps_other_values():
  values = [_batches(), {'a': 1}, _batches()]
  out = client_data.worker_datasets(values)
  assert isinstance(out, list) and out[1] is values[1]
  assert [d.options().autotune.enabled for d in (out[0], out[2])] == [False, False]
  assert isinstance(client_data.worker_datasets(tuple(values)), tuple)
  # A tuple subclass (a namedtuple cannot be rebuilt from one list): a plain tuple comes back.
  pair = collections.namedtuple('Pair', 'a b')(_batches(), 3)
  assert client_data.worker_datasets(pair)[0].options().autotune.enabled is False
  not_a_list = object()
  assert client_data.worker_datasets(not_a_list) is not_a_list


def test_worker_dataset_refuses_what_is_not_a_dataset():
  with pytest.raises(TypeError, match='expects a tf.data.Dataset, got list'):
    client_data.worker_dataset([1, 2])


def test_fedmf_client_datasets_have_autotuning_off():
  task = SyntheticTask(
    num_clients=2,
    vocab_size=30,
    preset='lstm-small',
    sequence_length=6,
    batch_size=4,
    max_sentences=8,
    test_sentences=4,
    seed=1,
  )
  assert task.client_dataset(0).options().autotune.enabled is False
  x = np.zeros((5, 3), np.int64)
  assert stackoverflow.as_batched_dataset(x, x).options().autotune.enabled is False


class _Noise:
  round = 0  # The round whose noise `next` returns (HostNoise.round).

  def next(self):
    return 'noise'

  def prefetch(self):
    pass


class _State(tuple):
  def _replace(self, **kwargs):
    return kwargs


class _Process:
  def next(self, state, data):
    self.received = data
    return state


def test_the_host_noise_loop_turns_autotuning_off_for_the_callers_datasets():
  process = _Process()
  loop = HostNoiseFedAvg(process, _Noise(), shapes=[(1,)])
  assert loop.next(_State(), [_batches(), _batches()]) == {'aggregator': 'noise'}
  assert [d.options().autotune.enabled for d in process.received] == [False, False]
