"""Round time and memory of the fedmf DP aggregators vs TFF's.

Two modes, on the StackOverflow next-word LSTM (embedding 10004×96, LSTM 670,
dense 96, dense 10004; 4,050,748 parameters), all mechanisms in one run:

  agg     `process.next(state, client_updates)` of each aggregation process
          for 10 synthetic client updates with the model's variable shapes.
  fedavg  `process.next(state, client_data)` of
          `tff.learning.algorithms.build_unweighted_fed_avg` (client SGD lr 1,
          server SGD lr 1 momentum 0.95) with the aggregator as
          `model_aggregator`, on the Keras model wrapped by
          `tff.learning.models.from_keras_model`; each client holds
          --batches batches of --batch-size random token sequences of length
          --seq-len and trains 1 local epoch. BandMF is skipped in this mode
          unless named in --only.

Mechanisms:

  tff-gaussian-fixed   tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed
  tff-tree             ...DifferentiallyPrivateFactory.tree_aggregation (efficient)
  gaussian             fedmf build_dp_aggregator({'mechanism': 'dpsgd'})
  blt-4                fedmf BLT with 4 buffers
  tree                 fedmf tree, online Honaker
  bandmf-<b>           fedmf BandMF with b bands (n = 2052)

Each mechanism gets a fresh owned local C++ context (fedmf.tff.context), so the
worker's peak RSS (VmHWM) is per mechanism. Times are the median (and min) of
--rounds (agg) or --fedavg-rounds (fedavg) timed calls after one warm-up call.
The Python column is the process's ru_maxrss when that mechanism finished
(monotone over the run, so it only says something where it jumps).

Usage:
  .venv/bin/python benchmarks/aggregator_benchmark.py [--mode agg,fedavg]
      [--rounds 5] [--fedavg-rounds 3] [--bands 64,128]
      [--only blt-4,tff-gaussian-fixed] [--tiny]

--tiny shrinks the model (vocab 200, embedding 8, LSTM 16, dense 8) for smoke
tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

from fedmf.tff import build_dp_aggregator  # pylint: disable=g-import-not-at-top
from fedmf.tff import context  # pylint: disable=g-import-not-at-top

FULL_DIMS = dict(vocab=10004, emb=96, lstm=670, dense=96)
TINY_DIMS = dict(vocab=200, emb=8, lstm=16, dense=8)


def _shapes(vocab, emb, lstm, dense):
  """Trainable variable shapes of the LSTM, in Keras' trainable_weights order."""
  return [
    (vocab, emb),  # embedding
    (emb, 4 * lstm),  # LSTM kernel
    (lstm, 4 * lstm),  # LSTM recurrent kernel
    (4 * lstm,),  # LSTM bias
    (lstm, dense),  # dense kernel
    (dense,),  # dense bias
    (dense, vocab),  # output kernel
    (vocab,),  # output bias
  ]


SHAPES = _shapes(**FULL_DIMS)
N_ROUNDS = 2052
SIGMA, CLIP, CPR = 1.0, 1.0, 10


def _bandmf(bands: int) -> dict:
  # Truncated square-root Toeplitz columns (docs/mechanisms.md warm start); the
  # loader normalizes them.
  c = np.ones(bands)
  for j in range(1, bands):
    c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
  return {
    'mechanism': 'bandmf',
    'n': N_ROUNDS,
    'bands': bands,
    'columns': [c[: min(bands, N_ROUNDS - j)].tolist() for j in range(N_ROUNDS)],
  }


def _factories(bands_list, shapes=SHAPES):
  specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
  out = {
    'tff-gaussian-fixed': lambda: tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      SIGMA, CPR, CLIP
    ),
    'tff-tree': lambda: tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
      SIGMA, CPR, CLIP, specs, noise_seed=1, use_efficient=True
    ),
    'gaussian': lambda: build_dp_aggregator(
      {'mechanism': 'dpsgd'},
      noise_multiplier=SIGMA,
      clip_norm=CLIP,
      clients_per_round=CPR,
      noise_seed=1,
    ),
    'blt-4': lambda: build_dp_aggregator(
      {
        'mechanism': 'blt',
        'buf_decay': [0.99, 0.9, 0.6, 0.2],
        'output_scale': [0.2, 0.1, 0.05, 0.02],
      },
      noise_multiplier=SIGMA,
      clip_norm=CLIP,
      clients_per_round=CPR,
      noise_seed=1,
    ),
    'tree': lambda: build_dp_aggregator(
      {'mechanism': 'tree', 'variant': 'online-honaker'},
      noise_multiplier=SIGMA,
      clip_norm=CLIP,
      clients_per_round=CPR,
      noise_seed=1,
    ),
  }
  for b in bands_list:
    out[f'bandmf-{b}'] = lambda b=b: build_dp_aggregator(
      _bandmf(b), noise_multiplier=SIGMA, clip_norm=CLIP, clients_per_round=CPR, noise_seed=1
    )
  return out


def _vm_hwm_mib(pid) -> float:
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return float('nan')


def _state_bytes(state) -> int:
  return sum(np.asarray(x).nbytes for x in tf.nest.flatten(state))


def _keras_lstm(vocab, emb, lstm, dense, seq_len):
  """The StackOverflow next-word LSTM (TFF's stackoverflow baseline shape)."""
  return tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(seq_len,), dtype=tf.int32),
      tf.keras.layers.Embedding(vocab, emb, mask_zero=True),
      tf.keras.layers.LSTM(lstm, return_sequences=True),
      tf.keras.layers.Dense(dense),
      tf.keras.layers.Dense(vocab),
    ]
  )


def _client_datasets(num_clients, batches, batch_size, seq_len, vocab, seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num_clients):
    n = batches * batch_size
    tokens = rng.integers(1, vocab, size=(n, seq_len + 1), dtype=np.int32)
    out.append(
      tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:])).batch(batch_size)
    )
  return out


def _run(name, build, data, rounds, agg_state=lambda state: state):
  """Times `next` of the process `build()` in a fresh owned context."""
  with context.local_execution_context() as ctx:
    t0 = time.perf_counter()
    process = build()
    state = process.initialize()
    build_s = time.perf_counter() - t0
    t = time.perf_counter()
    state = process.next(state, data).state  # Warm-up.
    warm_s = time.perf_counter() - t
    times = []
    for _ in range(rounds):
      t = time.perf_counter()
      state = process.next(state, data).state
      times.append(time.perf_counter() - t)
    row = dict(
      name=name,
      finished=time.strftime('%Y-%m-%dT%H:%M:%S'),
      load_after=os.getloadavg(),
      median=statistics.median(times),
      min=min(times),
      times=times,
      build=build_s,
      warmup=warm_s,
      worker_mib=_vm_hwm_mib(ctx.worker_pid),
      state_mib=_state_bytes(agg_state(state)) / 2**20,
      py_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    )
    del state, process
  return row


def _print_row(mode, row):
  print(
    f'{time.strftime("%H:%M:%S")} [{mode}] {row["name"]:20s} '
    f'median {row["median"]:7.3f} s  '
    f'min {row["min"]:7.3f} s  warm-up {row["warmup"]:7.3f} s  '
    f'build {row["build"]:6.1f} s  state {row["state_mib"]:7.1f} MiB  '
    f'worker peak {row["worker_mib"]:8.0f} MiB  '
    f'python peak {row["py_mib"]:6.0f} MiB  '
    f'times {[round(t, 3) for t in row["times"]]}',
    flush=True,
  )


def _table(rows):
  base = dict((r['name'], r['median']) for r in rows).get('tff-gaussian-fixed')
  head = '| mechanism | median s/round | min s/round | × tff gaussian_fixed (median) |'
  sep = '|---|---:|---:|---:|'
  head += ' aggregator state MiB | worker peak RSS MiB | Python peak RSS MiB (cumulative) |'
  sep += '---:|---:|---:|'
  print(head)
  print(sep)
  for r in rows:
    ratio = f'{r["median"] / base:.3f}' if base else 'n/a'
    line = f'| {r["name"]} | {r["median"]:.3f} | {r["min"]:.3f} | {ratio} |'
    line += f' {r["state_mib"]:.1f} | {r["worker_mib"]:.0f} | {r["py_mib"]:.0f} |'
    print(line)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--mode', default='agg', help='comma-separated: agg, fedavg')
  parser.add_argument('--rounds', type=int, default=3, help='timed rounds in agg mode')
  parser.add_argument('--fedavg-rounds', type=int, default=3, help='timed rounds in fedavg mode')
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument(
    '--batches', type=int, default=2, help='fedavg: batches per client (1 local epoch)'
  )
  parser.add_argument('--batch-size', type=int, default=16)
  parser.add_argument('--seq-len', type=int, default=20)
  parser.add_argument('--bands', default='64')
  parser.add_argument('--only', default='')
  parser.add_argument('--tiny', action='store_true', help='tiny model for smoke tests')
  parser.add_argument('--json', default='', help='also write the rows to this JSON file')
  args = parser.parse_args(argv)
  modes = [m for m in args.mode.split(',') if m]
  for m in modes:
    if m not in ('agg', 'fedavg'):
      parser.error(f'unknown mode {m!r}')
  dims = TINY_DIMS if args.tiny else FULL_DIMS
  shapes = _shapes(**dims)
  bands = [int(b) for b in args.bands.split(',') if b]
  factories = _factories(bands, shapes)
  only = [n for n in args.only.split(',') if n]
  names = [n for n in factories if not only or n in only]
  num_params = sum(int(np.prod(s)) for s in shapes)
  load_start = os.getloadavg()
  print(
    f'model: {num_params:,} parameters in {len(shapes)} tensors; '
    f'{args.clients} clients; load average at start '
    f'{" ".join(f"{x:.2f}" for x in load_start)}; '
    f'{os.cpu_count()} CPUs',
    flush=True,
  )

  results = {}
  if 'agg' in modes:
    value_type = tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in shapes], list)
    rng = np.random.default_rng(0)
    clients = [
      [(rng.standard_normal(s, dtype=np.float32) * 1e-3) for s in shapes]
      for _ in range(args.clients)
    ]
    print(f'[agg] median of {args.rounds} rounds after 1 warm-up', flush=True)
    rows = []
    for name in names:
      row = _run(name, lambda name=name: factories[name]().create(value_type), clients, args.rounds)
      rows.append(row)
      _print_row('agg', row)
    results['agg'] = rows

  if 'fedavg' in modes:
    seq_len = args.seq_len

    def model_fn():
      return tff.learning.models.from_keras_model(
        _keras_lstm(**dims, seq_len=seq_len),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(
          tf.TensorSpec([None, seq_len], tf.int32),
          tf.TensorSpec([None, seq_len], tf.int32),
        ),
      )

    keras_shapes = [tuple(w.shape) for w in _keras_lstm(**dims, seq_len=seq_len).trainable_weights]
    if keras_shapes != [tuple(s) for s in shapes]:
      raise AssertionError(f'Keras shapes {keras_shapes} != {shapes}')
    data = _client_datasets(
      args.clients, args.batches, args.batch_size, seq_len, dims['vocab'], seed=0
    )
    fed_names = [n for n in names if not n.startswith('bandmf') or n in only]
    print(
      f'[fedavg] {args.clients} clients × {args.batches} batches × '
      f'{args.batch_size} sequences of {seq_len} tokens, 1 local epoch; '
      f'median of {args.fedavg_rounds} rounds after 1 warm-up',
      flush=True,
    )

    def build(name):
      return tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn,
        client_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
        server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.95),
        model_aggregator=factories[name](),
      )

    rows = []
    for name in fed_names:
      row = _run(
        name,
        lambda name=name: build(name),
        data,
        args.fedavg_rounds,
        agg_state=lambda state: state.aggregator,
      )
      rows.append(row)
      _print_row('fedavg', row)
    results['fedavg'] = rows

  for mode, rows in results.items():
    print(f'\n{mode}:')
    _table(rows)
  py_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
  print(
    f'\nPython process peak RSS: {py_peak:.0f} MiB; load average at end '
    f'{" ".join(f"{x:.2f}" for x in os.getloadavg())}'
  )
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(
        {
          'argv': sys.argv,
          'num_params': num_params,
          'load_start': load_start,
          'load_end': os.getloadavg(),
          'python_peak_mib': py_peak,
          'results': results,
        },
        f,
        indent=1,
      )
  return 0


if __name__ == '__main__':
  sys.exit(main())
