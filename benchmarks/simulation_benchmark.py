#!/usr/bin/env python3
"""Round time of fedmf's simulation: a StackOverflow-shaped round, and fedmf vs plain TFF FedAvg.

Two measurements, both on synthetic next-word data shaped like the papers' StackOverflow clients
(10,000 words, every client 256 sentences of 20 tokens, batch 16, one local epoch) and the
`lstm-paper` model (4,050,748 parameters, FastLSTM):

  so-round   one round at the papers' reduced cohort (--clients 100): fedmf's federated part
             (`fedmf.tff.rounds` in chunks of 20 clients) plus its host server step (BandMF noise
             with --bands, SGD with momentum). Printed next to the FLOP count of the round
             (forward + backward = 3 × forward per token) and the matmul rate measured in the same
             process before and after each round (their mean sets the round's compute limit),
             i.e. how far the round is from the compute limit.
  vs-fedavg  fedmf's round (`fedmf.program.training_run.train_round`: federated part + noise + server step)
             for each mechanism against a plain `tff.learning.algorithms.build_unweighted_fed_avg`
             loop without DP (client SGD, server SGD momentum 0.95, both --learning-rate) on the same model
             (the same FunctionalModel and dataset-iterator client loop as fedmf's),
             the same clients (--clients, default 10) and the same data, arms alternating round by
             round in one process, medians of --rounds timed rounds after a warm-up round; next
             to the wall time, the CPU seconds of the round (worker_binary + this process), which
             other processes on a shared machine hardly change.

  .venv/bin/python benchmarks/simulation_benchmark.py [--mode so-round,vs-fedavg] [--clients 100]
      [--vs-clients 10] [--rounds 3] [--mechanisms dpsgd,blt,tree,bandmf] [--tiny]

--tiny shrinks everything (lstm-small, 200 words, 16 sentences) for a smoke test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def flops_per_token(embedding: int, lstm: int, classes: int) -> float:
  """Training FLOPs per token position: 3 × forward (backward = 2 × forward), multiply-add = 2."""
  forward = (
    2 * embedding * 4 * lstm + 2 * lstm * 4 * lstm + 2 * lstm * embedding + 2 * embedding * classes
  )
  return 3.0 * forward


def matmul_rate(seconds: float = 2.0) -> float:
  """FLOP/s of TF float32 matmuls of the LSTM's shapes, on all threads, measured now."""
  import tensorflow as tf

  shapes = [
    ((320, 96), (96, 2680)),
    ((16, 670), (670, 2680)),
    ((320, 96), (96, 10004)),
    ((670, 320), (320, 2680)),
  ]
  pairs = [(tf.random.normal(a), tf.random.normal(b)) for a, b in shapes]

  @tf.function
  def run():
    return [tf.matmul(a, b) for a, b in pairs]

  run()
  flops_one = sum(2 * a[0] * a[1] * b[1] for a, b in shapes)
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    [o.numpy() for o in run()]
    count += 1
  return count * flops_one / (time.perf_counter() - start)


def synthetic_task(args, num_clients: int):
  """StackOverflow-shaped synthetic clients, each of exactly --sentences sentences (--vocab words,
  --model); benchmarks/round_profile.py times the same clients."""
  from fedmf.tasks.synthetic import SyntheticTask

  return SyntheticTask(
    num_clients=num_clients,
    vocab_size=args.vocab,
    preset=args.model,
    sequence_length=20,
    batch_size=16,
    max_sentences=args.sentences,
    test_sentences=64,
    seed=0,
    min_sentences=args.sentences,
    median_sentences=args.sentences,
  )


def so_round(args, task) -> None:
  from fedmf.mf import strategies
  from fedmf.mf.schema import ParticipationSchema
  from fedmf.program import server
  from fedmf.tff import host_noise
  from fedmf.tasks import model_sizes
  from fedmf.tff.rounds import build_client_round
  from fedmf.tff.runner import RoundRunner

  spec = model_sizes.PRESETS[args.model]
  per_token = flops_per_token(
    spec.embedding_size, spec.lstm_size, model_sizes.num_classes(args.vocab)
  )
  tokens = args.sentences * 20
  round_flops = per_token * tokens * args.clients
  weights = task.initial_weights(0)
  shapes = [w.shape for w in weights]
  comp, _ = build_client_round(
    task.functional_model(),
    client_learning_rate=args.learning_rate,
    clip_norm=1.0,
    zeroing_linf=100.0,
  )
  runner = RoundRunner(comp, shapes, clients_per_call=min(20, args.clients))
  bandmf = (
    strategies.mechanism_class("bandmf").optimize(
      ParticipationSchema(args.n, args.bands, None),
      strategies.OptimizeOptions(bands=args.bands, max_iter=5),
    )[0]
    if args.bands > 1
    else None
  )
  stream = (bandmf or strategies.load_strategy({"mechanism": "dpsgd"})).noise_stream(args.n)
  noise = host_noise.HostNoise(stream, shapes, seed=1)
  state = server.initial_server_state(weights)
  datasets = [task.client_dataset(i) for i in range(args.clients)]
  # The machine's speed moves by up to a third from minute to minute (a shared 2-core VM;
  # docs/benchmarks.md §4), so the matmul rate is measured before every round and after the last,
  # and each round is set against the mean of the two rates beside it.
  rate = matmul_rate()
  print(
    f"so-round: {args.clients} clients × {args.sentences} sentences × 20 tokens, {args.model} "
    f"({model_sizes.count_params(args.model, args.vocab):,} parameters); "
    f"{per_token / 1e6:.2f} MFLOP per token, {per_token * tokens / 1e9:.1f} GFLOP per client, "
    f"{round_flops / 1e12:.2f} TFLOP per round; matmul rate now {rate / 1e9:.1f} GFLOP/s "
    f"-> compute limit {round_flops / rate:.1f} s; load {os.getloadavg()[0]:.2f}",
    flush=True,
  )
  for r in range(args.rounds):
    start = time.perf_counter()
    result = runner.run(state.weights, datasets)
    federated = time.perf_counter() - start
    server.server_update(
      state, result.clipped_sum, noise.next(), 1.0, args.clients, args.learning_rate, 0.95
    )
    total = time.perf_counter() - start
    rate_after = matmul_rate()
    limit = round_flops / ((rate + rate_after) / 2)
    print(
      f"  round {r}: {total:.1f} s (federated part {federated:.1f} s, host step "
      f"{total - federated:.2f} s) = {total / limit:.2f} × the compute limit {limit:.1f} s "
      f"(matmul rate {rate / 1e9:.1f} before, {rate_after / 1e9:.1f} GFLOP/s after); "
      f"loss {result.loss:.3f}; load {os.getloadavg()[0]:.2f}",
      flush=True,
    )
    rate = rate_after


def vs_fedavg(args, task, worker_pid=None) -> None:
  import tensorflow_federated as tff

  from fedmf.program import training_run
  from fedmf.program.config import load_config

  clients = list(range(args.vs_clients))
  datasets = [task.client_dataset(i) for i in clients]
  # The baseline gets the same model form and client loop as fedmf's federated part (a
  # FunctionalModel, TFF's dataset-iterator loop), so the ratio measures what fedmf adds.
  fedavg = tff.learning.algorithms.build_unweighted_fed_avg(
    task.functional_model(),
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(args.learning_rate),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(args.learning_rate, momentum=0.95),
    loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR,
  )
  fed_state = fedavg.initialize()
  runs = {}
  for mechanism in args.mechanisms.split(","):
    config = load_config(
      None,
      [
        f"mechanism={mechanism}",
        f"rounds={args.n}",
        f"clients_per_round={args.vs_clients}",
        f"num_clients={len(clients) * 4}",
        "noise_multiplier=1.0",
        "noise_seed=1",
        f"participation.min_sep={args.bands}",
        # The config refuses keys that have no effect (bands for any mechanism but BandMF).
        *([f"bands={args.bands}"] if mechanism == "bandmf" else []),
        "model=" + args.model,
        f"vocab_size={args.vocab}",
        f"client_learning_rate={args.learning_rate}",
        f"server_learning_rate={args.learning_rate}",
        "warmup_fraction=0",
        "cooldown_fraction=0",
      ],
    )
    runs[mechanism] = training_run.build_run(config, task=task)
  from fedmf.participation import Cohort

  times = {name: [] for name in ["tff-fedavg", *runs]}
  cpus = {name: [] for name in times}
  # CPU seconds of the round (the worker_binary's and this process's): on a shared machine other
  # processes stretch the wall time of some rounds by up to 2-4x (docs/benchmarks.md §4), but
  # hardly the CPU time, so the CPU ratios separate a mechanism's cost from the machine's load.
  cpu = _RoundCpu(worker_pid)
  for r in range(args.rounds + 1):
    cpu.start()
    start = time.perf_counter()
    fed_state = fedavg.next(fed_state, datasets).state
    if r:
      times["tff-fedavg"].append(time.perf_counter() - start)
      cpus["tff-fedavg"].append(cpu.seconds())
    for name, run in runs.items():
      cohort = Cohort(round=r, clients=np.array(clients))
      cpu.start()
      record = training_run.train_round(run, cohort)
      if r:
        times[name].append(record.round_seconds)
        cpus[name].append(cpu.seconds())
    print(
      f"  round {r}: "
      + "  ".join(
        f"{k} {v[-1]:.2f} s ({cpus[k][-1]:.2f} CPU-s)" for k, v in times.items() if v and r
      )
      + f"  load {os.getloadavg()[0]:.2f}",
      flush=True,
    )
  base = statistics.median(times["tff-fedavg"])
  base_cpu = statistics.median(cpus["tff-fedavg"])
  print(f"vs-fedavg: {args.vs_clients} clients, {args.model}, median of {args.rounds} rounds")
  print(
    "| arm | median s | × plain TFF FedAvg (no DP) | spread (max/min) | median CPU-s | × (CPU) "
    "| CPU spread |"
  )
  print("|---|---|---|---|---|---|---|")
  for name, values in times.items():
    med, med_cpu = statistics.median(values), statistics.median(cpus[name])
    print(
      f"| {name} | {med:.2f} | {med / base:.3f} | {max(values) / min(values):.2f} | "
      f"{med_cpu:.2f} | {med_cpu / base_cpu:.3f} | {max(cpus[name]) / min(cpus[name]):.2f} |"
    )


class _RoundCpu:
  """User + system CPU seconds of this process and of the worker_binary since `start()`."""

  def __init__(self, bridge_pid: int | None):
    self.worker = None
    if bridge_pid is not None:  # The worker_binary is the child of fedmf's namespace bridge.
      for tid in os.listdir(f"/proc/{bridge_pid}/task"):
        with open(f"/proc/{bridge_pid}/task/{tid}/children") as f:
          self.worker = next((int(p) for p in f.read().split()), self.worker)
    self._start = 0.0

  def _now(self) -> float:
    t = os.times()
    total = t.user + t.system
    if self.worker is not None:
      with open(f"/proc/{self.worker}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total

  def start(self) -> None:
    self._start = self._now()

  def seconds(self) -> float:
    return self._now() - self._start


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--mode", default="so-round,vs-fedavg")
  parser.add_argument("--clients", type=int, default=100)
  parser.add_argument("--vs-clients", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--mechanisms", default="dpsgd,blt,tree,bandmf")
  parser.add_argument("--bands", type=int, default=64, help="BandMF bands (and the timer's b)")
  parser.add_argument("--n", type=int, default=2052, help="the horizon of the strategies")
  parser.add_argument(
    "--learning-rate",
    type=float,
    default=0.1,
    help="client and server SGD rate (the papers' 1.0 diverges on random-init synthetic data, and "
    "a diverging model makes round times depend on the values)",
  )
  parser.add_argument("--tiny", action="store_true")
  args = parser.parse_args(argv)
  args.model, args.vocab, args.sentences = "lstm-paper", 10_000, 256
  if args.tiny:
    args.model, args.vocab, args.sentences = "lstm-small", 200, 16
    args.clients, args.vs_clients, args.rounds, args.n, args.bands = 4, 2, 1, 8, 2
  from fedmf.tff.context import local_execution_context
  from fedmf.tff.worker_threads import worker_environment

  task = synthetic_task(args, max(args.clients, args.vs_clients) * 4)
  # The worker's threads as `fedmf simulate` sets them (fedmf.tff.worker_threads; an exported
  # TF_NUM_INTRAOP_THREADS wins, e.g. the number of cores for TF's default).
  concurrent = min(20, args.clients, args.vs_clients)
  env = worker_environment(concurrent)
  print(f"worker environment: {env or 'TF defaults'}", flush=True)
  with local_execution_context(worker_env=env) as ctx:
    if "so-round" in args.mode:
      so_round(args, task)
    if "vs-fedavg" in args.mode:
      vs_fedavg(args, task, ctx.worker_pid)
  return 0


if __name__ == "__main__":
  sys.exit(main())
