"""Aggregation-only round time and memory of the fedmf DP aggregators vs TFF's.

Measures `process.next(state, client_updates)` of each aggregation process for
10 synthetic client updates with the variable shapes of the StackOverflow
next-word LSTM (embedding 10004×96, LSTM 670, dense 96, dense 10004;
4,050,748 parameters), all in one run:

  tff-gaussian-fixed   tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed
  tff-tree             ...DifferentiallyPrivateFactory.tree_aggregation (efficient)
  gaussian             fedmf build_dp_aggregator({'mechanism': 'dpsgd'})
  blt-4                fedmf BLT with 4 buffers
  tree                 fedmf tree, online Honaker
  bandmf-<b>           fedmf BandMF with b bands (n = 2052)

Each mechanism gets a fresh owned local C++ context (fedmf.tff.context), so the
worker's peak RSS (VmHWM) is per mechanism. Times are the median of
--rounds timed calls after one warm-up call.

Usage:
  .venv/bin/python benchmarks/aggregator_benchmark.py [--rounds 3]
      [--bands 64,128] [--only blt-4,tff-gaussian-fixed]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top
import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

from fedmf.aggregators import build_dp_aggregator  # pylint: disable=g-import-not-at-top
from fedmf.tff import context  # pylint: disable=g-import-not-at-top

VOCAB = 10004
SHAPES = [
    (VOCAB, 96),  # embedding
    (96, 4 * 670),  # LSTM kernel
    (670, 4 * 670),  # LSTM recurrent kernel
    (4 * 670,),  # LSTM bias
    (670, 96),  # dense kernel
    (96,),  # dense bias
    (96, VOCAB),  # output kernel
    (VOCAB,),  # output bias
]
N_ROUNDS = 2052
SIGMA, CLIP, CPR = 1.0, 1.0, 10


def _bandmf(bands: int) -> dict:
  # Truncated square-root Toeplitz columns (mechanisms.md warm start); the
  # loader normalizes them.
  c = np.ones(bands)
  for j in range(1, bands):
    c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
  return {'mechanism': 'bandmf', 'n': N_ROUNDS, 'bands': bands,
          'columns': [c[:min(bands, N_ROUNDS - j)].tolist()
                      for j in range(N_ROUNDS)]}


def _factories(bands_list):
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  out = {
      'tff-gaussian-fixed': lambda: tff.aggregators.DifferentiallyPrivateFactory
      .gaussian_fixed(SIGMA, CPR, CLIP),
      'tff-tree': lambda: tff.aggregators.DifferentiallyPrivateFactory
      .tree_aggregation(SIGMA, CPR, CLIP, specs, noise_seed=1,
                        use_efficient=True),
      'gaussian': lambda: build_dp_aggregator(
          {'mechanism': 'dpsgd'}, noise_multiplier=SIGMA, clip_norm=CLIP,
          clients_per_round=CPR, noise_seed=1),
      'blt-4': lambda: build_dp_aggregator(
          {'mechanism': 'blt', 'buf_decay': [0.99, 0.9, 0.6, 0.2],
           'output_scale': [0.2, 0.1, 0.05, 0.02]},
          noise_multiplier=SIGMA, clip_norm=CLIP, clients_per_round=CPR,
          noise_seed=1),
      'tree': lambda: build_dp_aggregator(
          {'mechanism': 'tree', 'variant': 'online-honaker'},
          noise_multiplier=SIGMA, clip_norm=CLIP, clients_per_round=CPR,
          noise_seed=1),
  }
  for b in bands_list:
    out[f'bandmf-{b}'] = (lambda b=b: build_dp_aggregator(
        _bandmf(b), noise_multiplier=SIGMA, clip_norm=CLIP,
        clients_per_round=CPR, noise_seed=1))
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--bands', default='64')
  parser.add_argument('--only', default='')
  args = parser.parse_args(argv)
  bands = [int(b) for b in args.bands.split(',') if b]
  factories = _factories(bands)
  names = [n for n in factories if not args.only or n in args.only.split(',')]

  value_type = tff.StructWithPythonType(
      [tff.TensorType(np.float32, s) for s in SHAPES], list)
  rng = np.random.default_rng(0)
  clients = [[(rng.standard_normal(s, dtype=np.float32) * 1e-3)
              for s in SHAPES] for _ in range(args.clients)]
  num_params = sum(int(np.prod(s)) for s in SHAPES)
  print(f'model: {num_params:,} parameters in {len(SHAPES)} tensors; '
        f'{args.clients} clients; median of {args.rounds} rounds after 1 warm-up',
        flush=True)

  rows = []
  for name in names:
    with context.local_execution_context() as ctx:
      t0 = time.perf_counter()
      process = factories[name]().create(value_type)
      state = process.initialize()
      build_s = time.perf_counter() - t0
      state = process.next(state, clients).state  # Warm-up.
      times = []
      for _ in range(args.rounds):
        t = time.perf_counter()
        state = process.next(state, clients).state
        times.append(time.perf_counter() - t)
      worker_mib = _vm_hwm_mib(ctx.worker_pid)
      rows.append((name, statistics.median(times), min(times), build_s,
                   _state_bytes(state) / 2**20, worker_mib))
      print(f'{name:20s} median {rows[-1][1]:7.3f} s  min {rows[-1][2]:7.3f} s  '
            f'state {rows[-1][4]:8.1f} MiB  worker peak {worker_mib:8.0f} MiB',
            flush=True)
      del state, process

  base = dict((r[0], r[1]) for r in rows).get('tff-gaussian-fixed')
  py_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
  print()
  print('| mechanism | median s/round | × tff gaussian_fixed | server state MiB '
        '| worker peak RSS MiB |')
  print('|---|---:|---:|---:|---:|')
  for name, med, _, _, state_mib, worker_mib in rows:
    ratio = f'{med / base:.3f}' if base else 'n/a'
    print(f'| {name} | {med:.3f} | {ratio} | {state_mib:.1f} | {worker_mib:.0f} |')
  print(f'\nPython process peak RSS: {py_peak:.0f} MiB')
  return 0


if __name__ == '__main__':
  sys.exit(main())
