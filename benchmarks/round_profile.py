#!/usr/bin/env python3
"""Where a round's time goes: wall time against the CPU time of TFF's worker and of the coordinator.

Runs the federated part of a round (`fedmf.tff.rounds`, chunks of --per-call clients) for --rounds
rounds on synthetic StackOverflow-shaped clients (as benchmarks/simulation_benchmark.py) and prints,
per round: wall seconds, the CPU seconds (user + sys) of the `worker_binary` process and of this
process, the machine's busy / idle / steal seconds from /proc/stat, the worker's minor page faults
and its thread count. At the end: the spread (max/min) of wall and of worker CPU time.

  .venv/bin/python benchmarks/round_profile.py [--model lstm-paper] [--clients 10] [--rounds 20]
      [--per-call 20] [--sentences 256] [--probe 1.0] [--arm default --arm KEY=VALUE[,KEY=VALUE] ...]

Each --arm is a worker environment (`calls=N` sets --max_concurrent_computation_calls instead), or
`tff-native`: TFF's own local context (its worker on a TCP port of every interface, without fedmf's
namespace bridge; for comparison only). Arms get a worker each and alternate round by round, so
they see the same machine load. "others" is the CPU time of every other process on the machine
during the round (/proc/stat busy minus worker and coordinator): on a shared machine it explains
wall time that the worker's CPU time does not. "both asleep" counts the seconds (sampled every
0.25 s) in which neither the worker nor this process used CPU: waiting, not computing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The sibling script whose clients this one times (imported as benchmarks/audit_engines.py imports
# its sibling: a package named `benchmarks` in site-packages would shadow `from benchmarks import`).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import simulation_benchmark  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
  out = []
  for tid in os.listdir(f"/proc/{pid}/task"):
    with open(f"/proc/{pid}/task/{tid}/children") as f:
      out += [int(c) for c in f.read().split()]
  return out


def proc_stat(pid: int) -> dict:
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  # Fields after the command: state(0) ppid(1) ... minflt(7) majflt(9) utime(11) stime(12) threads(17)
  return {
    "cpu": (int(fields[11]) + int(fields[12])) / TICK,
    "minflt": int(fields[7]),
    "threads": int(fields[17]),
  }


def machine_stat() -> dict:
  with open("/proc/stat") as f:
    cpu = [int(v) for v in f.readline().split()[1:]]
  user, nice, system, idle, iowait, irq, softirq, steal = cpu[:8]
  return {
    "busy": (user + nice + system + irq + softirq) / TICK,
    "idle": (idle + iowait) / TICK,
    "steal": steal / TICK,
  }


class _TffNative:
  """TFF's own local C++ context: its worker_binary listens on a TCP port, no fedmf bridge.

  For comparison only (it exposes the worker on every interface while it runs).
  """

  def __init__(self):
    import tensorflow_federated as tff

    print(
      "round_profile: warning: arm tff-native starts TFF's own worker_binary, which listens on a "
      "TCP port of every interface without authentication while it runs (run it on a machine "
      "nobody else can reach)",
      file=sys.stderr,
    )
    self.context = tff.backends.native.create_sync_local_cpp_execution_context()
    before = set(children(os.getpid()))
    with tff.framework.get_context_stack().install(self.context):
      tff.tensorflow.computation(lambda: 1)()  # Starts the worker.
    self.worker = (set(children(os.getpid())) - before).pop()

  def close(self):
    os.kill(self.worker, 9)


class _Asleep:
  """Seconds in which neither the worker nor this process used CPU (both waiting), sampled."""

  def __init__(self, worker: int, period: float = 0.25):
    import threading

    self.worker, self.period, self.seconds = worker, period, 0.0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _cpu(self) -> float:
    t = os.times()
    return t.user + t.system + proc_stat(self.worker)["cpu"]

  def _run(self) -> None:
    last = self._cpu()
    while not self._stop.wait(self.period):
      now = self._cpu()
      if now - last < 0.02 * self.period:
        self.seconds += self.period
      last = now

  def stop(self) -> float:
    self._stop.set()
    self._thread.join()
    return self.seconds


def _arm_env(spec: str) -> dict:
  """`KEY=VALUE,KEY=VALUE` (or `default`) -> the worker's extra environment."""
  if spec in ("", "default"):
    return {}
  if spec == "tff-native":
    return {"tff-native": "1"}
  return dict(item.partition("=")[::2] for item in spec.split(","))


def _start_arm(env: dict):
  """A local context whose worker_binary sees `env` on top of this process's environment.

  The pseudo-variable `calls` is the worker's --max_concurrent_computation_calls instead.
  """
  from fedmf.tff.context import create_local_execution_context

  env = dict(env)
  calls = int(env.pop("calls", -1))
  if env.pop("tff-native", None) is not None:
    return _TffNative()
  return create_local_execution_context(max_concurrent_computation_calls=calls, worker_env=env)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--model", default="lstm-paper")
  parser.add_argument("--vocab", type=int, default=10_000)
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--per-call", type=int, default=20)
  parser.add_argument("--sentences", type=int, default=256)
  parser.add_argument("--learning-rate", type=float, default=0.1)
  parser.add_argument(
    "--probe",
    type=float,
    default=0.0,
    help="seconds of a fixed matmul probe (simulation_benchmark.matmul_rate) before each round: "
    "the machine's speed then, to tell a slow round from a slow machine (0: off)",
  )
  parser.add_argument(
    "--arm",
    action="append",
    help="worker environment of one arm: default, or KEY=VALUE[,KEY=VALUE...] (repeatable; "
    "arms alternate round by round, each with a worker of its own)",
  )
  args = parser.parse_args(argv)
  arms = args.arm or ["default"]

  import tensorflow_federated as tff

  from fedmf.tff.rounds import build_client_round
  from fedmf.tff.runner import RoundRunner

  task = simulation_benchmark.synthetic_task(args, args.clients)
  weights = task.initial_weights(0)
  datasets = [task.client_dataset(i) for i in range(args.clients)]
  print(
    f"{args.model}, {args.clients} clients x {args.sentences} sentences, {args.per_call} per "
    f"call; arms: {arms}; load {os.getloadavg()}",
    flush=True,
  )
  started = [_start_arm(_arm_env(a)) for a in arms]
  contexts = [getattr(c, "context", c) for c in started]
  workers = [c.worker if isinstance(c, _TffNative) else children(c.worker_pid)[0] for c in started]
  comp, _ = build_client_round(
    task.functional_model(), client_learning_rate=args.learning_rate, clip_norm=1.0
  )
  runner = RoundRunner(comp, [w.shape for w in weights], clients_per_call=args.per_call)
  rows = {a: [] for a in arms}
  try:
    for r in range(args.rounds + 1):
      for arm, ctx, worker in zip(arms, contexts, workers):
        probe = simulation_benchmark.matmul_rate(args.probe) / 1e9 if args.probe else None
        with tff.framework.get_context_stack().install(ctx):
          w0, m0, c0, t0 = proc_stat(worker), machine_stat(), os.times(), time.perf_counter()
          asleep = _Asleep(worker)
          result = runner.run(weights, datasets)
          wall = time.perf_counter() - t0
          w1, m1, c1 = proc_stat(worker), machine_stat(), os.times()
          asleep = asleep.stop()
        row = {
          "wall": wall,
          "worker": w1["cpu"] - w0["cpu"],
          "coord": (c1.user + c1.system) - (c0.user + c0.system),
          "busy": m1["busy"] - m0["busy"],
          "idle": m1["idle"] - m0["idle"],
          "steal": m1["steal"] - m0["steal"],
          "minflt": w1["minflt"] - w0["minflt"],
          "threads": w1["threads"],
          "asleep": asleep,
          "probe": probe,
        }
        row["others"] = row["busy"] - row["worker"] - row["coord"]
        print(
          f"round {r:2d} [{arm}]: wall {wall:6.2f} s  worker cpu {row['worker']:6.2f}  coord "
          f"{row['coord']:5.2f}  others {row['others']:6.2f}  idle {row['idle']:5.2f} steal "
          f"{row['steal']:4.2f}  both asleep {asleep:5.2f} s  minflt {row['minflt']:7d} threads {row['threads']}  loss "
          f"{result.loss:.4f}  load {os.getloadavg()[0]:.2f}"
          + (f"  probe {probe:5.1f} GFLOP/s" if probe else ""),
          flush=True,
        )
        if r:  # Round 0 traces and compiles.
          rows[arm].append(row)
  finally:
    for ctx in started:
      ctx.close()
  base_wall = base_cpu = None
  for arm in arms:
    wall = [r["wall"] for r in rows[arm]]
    cpu = [r["worker"] for r in rows[arm]]
    mw, mc = statistics.median(wall), statistics.median(cpu)
    base_wall, base_cpu = base_wall or mw, base_cpu or mc
    print(
      f"[{arm}] {len(wall)} rounds: wall median {mw:.2f} (x{mw / base_wall:.3f}) min "
      f"{min(wall):.2f} max {max(wall):.2f} spread {max(wall) / min(wall):.2f}; worker cpu "
      f"median {mc:.2f} (x{mc / base_cpu:.3f}) spread {max(cpu) / min(cpu):.2f}; cores used "
      f"median {statistics.median(c / w for c, w in zip(cpu, wall)):.2f}; others' cpu / wall "
      f"median {statistics.median(r['others'] / r['wall'] for r in rows[arm]):.2f}; both asleep "
      f"{sum(r['asleep'] for r in rows[arm]):.1f} s of {sum(wall):.1f} s",
      flush=True,
    )
    if args.probe:
      # Wall time × the probe's rate: the round in units of the machine's speed at the time.
      probes = [r["probe"] for r in rows[arm]]
      scaled = [w * p for w, p in zip(wall, probes)]
      print(
        f"[{arm}] probe {min(probes):.1f}-{max(probes):.1f} GFLOP/s (spread "
        f"{max(probes) / min(probes):.2f}); wall x probe spread {max(scaled) / min(scaled):.2f}",
        flush=True,
      )
  return 0


if __name__ == "__main__":
  sys.exit(main())
