"""Cost of correlated noise in a DP FedAvg round, fedmf's paths against TFF's (issue 11).

On the StackOverflow next-word LSTM of the papers (`fedmf.tasks.models`, preset lstm-paper at
10,000 words: embedding 10004×96, FastLSTM 670, projection 96, output 10004; 4,050,748
parameters in 8 tensors), with σ = 1, ζ = 1, 10 clients per round, each training one local epoch
on --batches batches of --batch-size random token sequences of length 20.

Sections (every ratio is against `tff-gaussian-fixed` measured in the same process):

  round   full FedAvg rounds. Arms run round-robin (arm 1 round 1, arm 2 round 1, ...), so a load
          change hits every arm alike; each arm's first round is a warm-up and not timed.
            tff-gaussian-fixed  tff.learning FedAvg + DifferentiallyPrivateFactory.gaussian_fixed
            tff-tree            ... + DifferentiallyPrivateFactory.tree_aggregation (efficient)
            factory-<mech>      ... + fedmf's drop-in factory `fedmf.tff.build_dp_aggregator`
            host-<mech>         the users'-loop API `fedmf.tff.build_dp_fed_avg(noise_on_host=True)`:
                                tff.learning FedAvg whose aggregator takes the round's noise
                                (computed on the host) as its state
            split-<mech>        fedmf's own path (`fedmf simulate`): the federated part in TFF
                                (`fedmf.tff.rounds`, weights in, clipped sum out), the noise on the
                                host (`fedmf.tff.host_noise.HostNoise`, computed during the TFF
                                call) and the DP mean and server SGDM in numpy (`server_update`)
          Split arms also report their parts: the TFF call, the wait for the noise, the update.
  noise   the host noise alone (no TFF), one subprocess per mechanism (so its peak RSS is its
          own): `HostNoise.next()` per round, the Philox draws alone (z), the arithmetic (step −
          z), against the memory-bandwidth limit of reading and writing the mechanism's buffers
          once, measured on those buffers in the same process (`x *= 1` in place, best of 3,
          between the rounds).

mech: dpsgd, blt-4 (θ 0.99 0.9 0.6 0.2, ω 0.2 0.1 0.05 0.02), tree (online Honaker; the noise
section times rounds 64..127 at least), bandmf-<b̂> (n = 2052, square-root-Toeplitz columns).

Memory: "python" and "worker" are the peak RSS (VmHWM) of this process and of TFF's worker_binary
(one owned worker, `fedmf.tff.context`, killed at the end); their sum bounds the peak of all
processes together. Run BandMF b̂ = 342 on its own (second command below) to read its peak.

  python benchmarks/aggregator_benchmark.py --rounds 4 --json /tmp/agg.json
  python benchmarks/aggregator_benchmark.py --section round \\
      --arms tff-gaussian-fixed,split-dpsgd,split-bandmf-342 --rounds 4
  python benchmarks/aggregator_benchmark.py --tiny          # smoke test (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top

SIGMA, CLIP, CPR = 1.0, 1.0, 10
N_ROUNDS = 2052
SEQ_LEN = 20
SEED = 1234
LEARNING_RATE = 0.1  # client and server (SGDM, momentum 0.95); small so 10+ DP rounds stay finite.
FULL = dict(preset='lstm-paper', vocab=10000)
TINY = dict(preset='lstm-small', vocab=50)
BLT = {
  'mechanism': 'blt',
  'buf_decay': [0.99, 0.9, 0.6, 0.2],
  'output_scale': [0.2, 0.1, 0.05, 0.02],
}
DEFAULT_ARMS = (
  'tff-gaussian-fixed,split-dpsgd,split-blt-4,split-tree,split-bandmf-64,'
  'factory-dpsgd,factory-blt-4,factory-tree,tff-tree'
)
TINY_ARMS = 'tff-gaussian-fixed,split-dpsgd,split-blt-4,split-bandmf-4,factory-blt-4,tff-tree'


def _bandmf(bands: int) -> dict:
  """Truncated square-root-Toeplitz columns (the BandMF warm start); the loader normalizes them."""
  c = np.ones(bands)
  for j in range(1, bands):
    c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
  cols = [c[: min(bands, N_ROUNDS - j)].tolist() for j in range(N_ROUNDS)]
  return {'mechanism': 'bandmf', 'n': N_ROUNDS, 'bands': bands, 'columns': cols}


def strategy(mech: str) -> dict:
  if mech == 'dpsgd':
    return {'mechanism': 'dpsgd'}
  if mech == 'blt-4':
    return BLT
  if mech == 'tree':
    return {'mechanism': 'tree', 'variant': 'online-honaker'}
  if mech.startswith('bandmf-'):
    return _bandmf(int(mech.split('-')[1]))
  raise ValueError(f'unknown mechanism {mech!r}')


def _status_mib(key: str, pid='self') -> float:
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith(key):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return float('nan')


def _load() -> str:
  return ' '.join(f'{x:.2f}' for x in os.getloadavg())


def _shapes(model: dict) -> list[tuple[int, ...]]:
  from fedmf.tasks import models  # pylint: disable=g-import-not-at-top

  return models.trainable_shapes(models.build_keras_model(model['preset'], model['vocab'], SEQ_LEN))


# ---------------------------------------------------------------------------------------------
# Noise alone.


def _bound_seconds(buffers) -> float:
  """Best of 3 in-place `x *= 1` over the buffers: reading and writing them once."""
  best = float('inf')
  one = np.float32(1)
  for _ in range(3):
    t = time.perf_counter()
    for b in buffers:
      np.multiply(b, one, out=b)
    best = min(best, time.perf_counter() - t)
  return best


def noise_child(mech: str, rounds: int, model: dict) -> dict:
  """One mechanism's host noise, timed in this (fresh) process."""

  from fedmf.mf import strategies as st  # pylint: disable=g-import-not-at-top
  from fedmf.mf import streaming  # pylint: disable=g-import-not-at-top
  from fedmf.tff import host_noise  # pylint: disable=g-import-not-at-top

  shapes = _shapes(model)
  rss_start = _status_mib('VmRSS:')
  host = host_noise.HostNoise(st.load_strategy(strategy(mech)).noise_stream(N_ROUNDS), shapes, SEED)
  warm = 64 if mech == 'tree' else 1
  if mech == 'tree':
    rounds = max(rounds, 64)  # Rounds 64..127: heights 0..6, 2 draws a round on average.
  for _ in range(warm):
    host.next()
  steps, zs, bounds = [], [], []
  for _ in range(rounds):
    t = host.round
    h = streaming.NUMPY.trailing_zeros(t + 1) if mech == 'tree' else 0
    start = time.perf_counter()
    draw = host._z(t)  # pylint: disable=protected-access
    for j in range(h + 1):  # The draws round t consumes (the tree: its h + 1 new nodes).
      draw(j)
    zs.append(time.perf_counter() - start)
    start = time.perf_counter()
    host.next()
    steps.append(time.perf_counter() - start)
    buffers = host._kernel.buffers()  # pylint: disable=protected-access
    if buffers:
      bounds.append(_bound_seconds(buffers))
  buffers = host._kernel.buffers()  # pylint: disable=protected-access
  nbytes = sum(b.nbytes for b in buffers)
  step, z = statistics.median(steps), statistics.median(zs)
  arith = statistics.median(max(s - d, 0.0) for s, d in zip(steps, zs))  # Per round: the tree's
  bound = min(bounds) if bounds else float('nan')  # draws vary with the round.
  return dict(
    mech=mech,
    rounds=[warm, warm + rounds],
    step_s=step,
    z_s=z,
    arith_s=arith,
    bound_s=bound,
    bound_gbps=2 * nbytes / bound / 1e9 if bounds else float('nan'),
    step_x_bound=step / bound if bounds else float('nan'),
    arith_x_bound=arith / bound if bounds else float('nan'),
    zs=zs,
    buffers_mib=nbytes / 2**20,
    rss_start_mib=rss_start,
    peak_rss_mib=_status_mib('VmHWM:'),
    steps=steps,
    load=os.getloadavg(),
  )


def run_noise(mechs: list[str], rounds: int, tiny: bool) -> list[dict]:
  rows = []
  for mech in mechs:
    cmd = [
      sys.executable,
      os.path.abspath(__file__),
      '--noise-child',
      mech,
      '--rounds',
      str(rounds),
    ]
    cmd += ['--tiny'] if tiny else []
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    rows.append(row)
    print(
      f'{time.strftime("%H:%M:%S")} [noise] {mech:11s} step {row["step_s"]:.3f} s  '
      f'z {row["z_s"]:.3f} s  arith {row["arith_s"]:.3f} s  bound {row["bound_s"]:.3f} s '
      f'({row["bound_gbps"]:.1f} GB/s)  buffers {row["buffers_mib"]:.0f} MiB  '
      f'peak RSS {row["peak_rss_mib"]:.0f} MiB  load {_load()}',
      flush=True,
    )
  return rows


# ---------------------------------------------------------------------------------------------
# Full rounds.


class _FedAvgArm:
  """A tff.learning FedAvg process with a model aggregator; one `next` per round."""

  def __init__(self, name, model_fn, aggregator):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    self.name = name
    self.process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE, 0.95),
      model_aggregator=aggregator,
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
    )
    self.state = self.process.initialize()
    self.parts = {}

  def round(self, data) -> float:
    start = time.perf_counter()
    self.state = self.process.next(self.state, data).state
    return time.perf_counter() - start


class _HostNoiseArm(_FedAvgArm):
  """The users'-loop API: tff.learning FedAvg with the noise on the host (`fedmf.tff.host_noise`)."""

  def __init__(self, name, model_fn, mech):  # pylint: disable=super-init-not-called
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    from fedmf.tff import learning  # pylint: disable=g-import-not-at-top

    self.name = name
    self.process = learning.build_host_noise_fed_avg(
      model_fn,
      strategy(mech),
      noise_multiplier=SIGMA,
      clip_norm=CLIP,
      clients_per_round=CPR,
      noise_seed=SEED,
      num_rounds=N_ROUNDS,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(LEARNING_RATE, 0.95),
      loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
    )
    self.state = self.process.initialize()
    self.parts = {}

  def close(self):
    self.process.close()


class _SplitArm:
  """fedmf's path: TFF client round, host noise (prefetched during the call), numpy server step."""

  def __init__(self, name, runner, weights, noise):
    from fedmf.program import server  # pylint: disable=g-import-not-at-top

    self.name = name
    self.runner = runner
    self.server = server.initial_server_state(weights)
    self.noise = noise
    self.parts = {'tff': [], 'wait': [], 'update': []}

  def round(self, data) -> float:
    from fedmf.program import server  # pylint: disable=g-import-not-at-top

    start = time.perf_counter()
    self.noise.prefetch()
    result = self.runner.run(self.server.weights, data)
    called = time.perf_counter()
    noise = self.noise.next()
    noised = time.perf_counter()
    server.server_update(
      self.server, result.clipped_sum, noise, CLIP * SIGMA, CPR, LEARNING_RATE, 0.95
    )
    end = time.perf_counter()
    self.parts['tff'].append(called - start)
    self.parts['wait'].append(noised - called)
    self.parts['update'].append(end - noised)
    return end - start

  def close(self):
    self.noise.close()


def _client_data(clients, batches, batch_size, vocab, seed=0):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from fedmf.tasks import model_sizes  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  classes = model_sizes.num_classes(vocab)
  out = []
  for _ in range(clients):
    tokens = rng.integers(1, classes, size=(batches * batch_size, SEQ_LEN + 1), dtype=np.int32)
    out.append(
      tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:])).batch(batch_size)
    )
  return out


def _build_arm(name, model, shapes, model_fn, runner):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  from fedmf.mf import strategies as st  # pylint: disable=g-import-not-at-top
  from fedmf.tasks import models  # pylint: disable=g-import-not-at-top
  from fedmf.tff import build_dp_aggregator  # pylint: disable=g-import-not-at-top
  from fedmf.tff import host_noise  # pylint: disable=g-import-not-at-top

  factories = tff.aggregators.DifferentiallyPrivateFactory
  if name == 'tff-gaussian-fixed':
    return _FedAvgArm(name, model_fn, factories.gaussian_fixed(SIGMA, CPR, CLIP))
  if name == 'tff-tree':
    # The FunctionalModel's update is a tuple of tensors; the record specs must match it.
    specs = tuple(tf.TensorSpec(s, tf.float32) for s in shapes)
    agg = factories.tree_aggregation(SIGMA, CPR, CLIP, specs, noise_seed=1, use_efficient=True)
    return _FedAvgArm(name, model_fn, agg)
  kind, mech = name.split('-', 1)
  if kind == 'factory':
    agg = build_dp_aggregator(
      strategy(mech),
      noise_multiplier=SIGMA,
      clip_norm=CLIP,
      clients_per_round=CPR,
      noise_seed=SEED,
    )
    return _FedAvgArm(name, model_fn, agg)
  if kind == 'host':
    return _HostNoiseArm(name, model_fn, mech)
  if kind == 'split':
    weights = models.initial_weights(model['preset'], model['vocab'], SEQ_LEN, seed=0)
    stream = st.load_strategy(strategy(mech)).noise_stream(N_ROUNDS)
    noise = host_noise.HostNoise(stream, shapes, SEED, overlap=True)
    return _SplitArm(name, runner, weights, noise)
  raise ValueError(f'unknown arm {name!r}')


def run_rounds(arm_names, rounds, model, clients, batches, batch_size) -> dict:
  from fedmf.tasks import models  # pylint: disable=g-import-not-at-top
  from fedmf.tff import context  # pylint: disable=g-import-not-at-top
  from fedmf.tff import rounds as rounds_lib  # pylint: disable=g-import-not-at-top
  from fedmf.tff.runner import RoundRunner  # pylint: disable=g-import-not-at-top

  shapes = _shapes(model)
  # Every arm trains the same FunctionalModel with the same client loop (TFF's dataset iterator),
  # as fedmf's simulation does, so the arms differ only in their aggregation.
  model_fn = models.tff_functional_model(model['preset'], model['vocab'], SEQ_LEN)
  data = _client_data(clients, batches, batch_size, model['vocab'])
  times = {name: [] for name in arm_names}
  with context.local_execution_context() as ctx:
    runner = None
    if any(n.startswith('split-') for n in arm_names):
      client_round, _ = rounds_lib.build_client_round(
        model_fn, client_learning_rate=LEARNING_RATE, clip_norm=CLIP
      )
      runner = RoundRunner(client_round, shapes)
    arms = []
    for name in arm_names:
      start = time.perf_counter()
      arms.append(_build_arm(name, model, shapes, model_fn, runner))
      print(
        f'{time.strftime("%H:%M:%S")} [round] built {name} in {time.perf_counter() - start:.1f} s',
        flush=True,
      )
    for r in range(rounds + 1):  # Round 0 of every arm is its warm-up.
      for arm in arms:
        seconds = arm.round(data)
        if r:
          times[arm.name].append(seconds)
        else:
          for part in arm.parts.values():
            part.clear()
        print(
          f'{time.strftime("%H:%M:%S")} [round] {r} {arm.name:18s} {seconds:7.3f} s  '
          f'load {_load()}',
          flush=True,
        )
    worker_mib = _status_mib('VmHWM:', ctx.worker_pid)
    for arm in arms:
      if hasattr(arm, 'close'):
        arm.close()
  base = times.get('tff-gaussian-fixed')
  rows = []
  for arm in arms:
    t = times[arm.name]
    row = dict(name=arm.name, median=statistics.median(t), min=min(t), times=t)
    if base:
      row['x_gaussian_fixed'] = row['median'] / statistics.median(base)
      row['x_paired'] = statistics.median(a / b for a, b in zip(t, base))
    for part, values in arm.parts.items():
      row[part] = statistics.median(values)
    if isinstance(arm, _SplitArm):
      row['noise_buffers_mib'] = sum(b.nbytes for b in arm.noise._kernel.buffers()) / 2**20  # pylint: disable=protected-access
    rows.append(row)
  return dict(
    arms=rows,
    python_peak_mib=_status_mib('VmHWM:'),
    worker_peak_mib=worker_mib,
    clients=clients,
    batches=batches,
    batch_size=batch_size,
  )


# ---------------------------------------------------------------------------------------------
# Report.


def _round_table(result) -> list[str]:
  lines = [
    '| arm | median s | min s | × gaussian_fixed (median / paired) | TFF call s | '
    'noise wait s | server update s | noise buffers MiB |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in result['arms']:
    ratio = (
      f'{r["x_gaussian_fixed"]:.3f} / {r["x_paired"]:.3f}' if 'x_gaussian_fixed' in r else 'n/a'
    )
    parts = [f'{r[p]:.3f}' if p in r else '' for p in ('tff', 'wait', 'update')]
    buffers = f'{r["noise_buffers_mib"]:.0f}' if 'noise_buffers_mib' in r else ''
    lines.append(
      f'| {r["name"]} | {r["median"]:.3f} | {r["min"]:.3f} | {ratio} | '
      + ' | '.join(parts)
      + f' | {buffers} |'
    )
  lines.append(
    f'\nPeak RSS: Python {result["python_peak_mib"]:.0f} MiB, worker '
    f'{result["worker_peak_mib"]:.0f} MiB, sum {result["python_peak_mib"] + result["worker_peak_mib"]:.0f} MiB.'
  )
  return lines


def _noise_table(rows) -> list[str]:
  lines = [
    '| mechanism | rounds | step s | z s | arith s | bound s (GB/s) | step × bound | '
    'arith × bound | buffers MiB | peak RSS MiB (× buffers) |',
    '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in rows:
    bound = f'{r["bound_s"]:.3f} ({r["bound_gbps"]:.0f})' if r['buffers_mib'] else '—'
    ratio = f' ({r["peak_rss_mib"] / r["buffers_mib"]:.2f}×)' if r['buffers_mib'] > 100 else ''
    lines.append(
      f'| {r["mech"]} | {r["rounds"][0]}–{r["rounds"][1] - 1} | {r["step_s"]:.3f} | '
      f'{r["z_s"]:.3f} | {r["arith_s"]:.3f} | {bound} | {r["step_x_bound"]:.2f} | '
      f'{r["arith_x_bound"]:.2f} | {r["buffers_mib"]:.0f} | {r["peak_rss_mib"]:.0f}{ratio} |'
    )
  return lines


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--section', default='noise,round', help='comma-separated: noise, round')
  parser.add_argument('--arms', default=None, help=f'round arms (default {DEFAULT_ARMS})')
  parser.add_argument(
    '--noise-mechs', default='dpsgd,blt-4,tree,bandmf-64,bandmf-342', help='noise section'
  )
  parser.add_argument('--rounds', type=int, default=4, help='timed rounds per arm / mechanism')
  parser.add_argument('--clients', type=int, default=CPR)
  parser.add_argument('--batches', type=int, default=2)
  parser.add_argument('--batch-size', type=int, default=16)
  parser.add_argument('--tiny', action='store_true', help='small model and arms: a smoke test')
  parser.add_argument('--json', default='', help='also write the results to this JSON file')
  parser.add_argument('--noise-child', default='', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  model = TINY if args.tiny else FULL
  if args.noise_child:
    print(json.dumps(noise_child(args.noise_child, args.rounds, model)))
    return 0
  sections = [s for s in args.section.split(',') if s]
  arms = [a for a in (args.arms or (TINY_ARMS if args.tiny else DEFAULT_ARMS)).split(',') if a]
  mechs = [m for m in args.noise_mechs.split(',') if m]
  if args.tiny and args.noise_mechs == parser.get_default('noise_mechs'):
    mechs = ['dpsgd', 'blt-4', 'tree', 'bandmf-4']
  shapes = _shapes(model)
  print(
    f'model {model["preset"]} at {model["vocab"]} words: '
    f'{sum(int(np.prod(s)) for s in shapes):,} parameters in {len(shapes)} tensors; '
    f'{os.cpu_count()} CPUs; load {_load()}',
    flush=True,
  )
  results = dict(argv=sys.argv, model=model, load_start=os.getloadavg())
  if 'noise' in sections:
    results['noise'] = run_noise(mechs, args.rounds, args.tiny)
  if 'round' in sections:
    results['round'] = run_rounds(
      arms, args.rounds, model, args.clients, args.batches, args.batch_size
    )
  results['load_end'] = os.getloadavg()
  if 'noise' in results:
    print('\nnoise alone (per round):')
    print('\n'.join(_noise_table(results['noise'])))
  if 'round' in results:
    print(f'\nfull rounds (median of {args.rounds} after a warm-up):')
    print('\n'.join(_round_table(results['round'])))
  print(f'\nload at start {" ".join(f"{x:.2f}" for x in results["load_start"])}, at end {_load()}')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
