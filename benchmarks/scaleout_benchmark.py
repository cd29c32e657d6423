#!/usr/bin/env python3
"""Scale-out on emulated hosts: `fedmf worker`s in network namespaces, over mutual TLS.

Each worker runs in a Linux network namespace of its own (an emulated host) joined to this one by
a veth link with `tc netem` latency and bandwidth. For W = 1, 2, 4 workers (and, as the baseline of
the same run, W = 0: one local isolated worker) it trains --rounds rounds of the synthetic task and
reports per round: wall time, bytes sent to and received from each worker (the veth link's
counters), and the coordinator's CPU seconds. From the W = 1 run it fits the cost model of
docs/scaling.md (per-chunk compute, per-chunk transfer, coordinator time) and prints its
prediction for every W next to the measurement.

Needs root (network namespaces). Run:

  .venv/bin/python benchmarks/scaleout_benchmark.py [--workers 1,2,4] [--rounds 6]
      [--clients 16 --clients-per-call 2] [--delay-ms 2 --rate-mbit 1000] [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import netns  # noqa: E402  (the same emulated hosts as the tests)

PORT = 8470


def _link_bytes(link: str) -> tuple[int, int]:
  base = Path("/sys/class/net") / link / "statistics"
  return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def _tree_cpu_seconds(pid: int) -> float:
  """CPU seconds of a process and its descendants (a `fedmf worker`, its bridge, worker_binary)."""
  tick = os.sysconf("SC_CLK_TCK")
  total, frontier = 0.0, [pid]
  while frontier:
    p = frontier.pop()
    try:
      fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
      total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except (OSError, IndexError, ValueError):
      continue
    out = subprocess.run(["pgrep", "-P", str(p)], capture_output=True, text=True).stdout
    frontier += [int(c) for c in out.split()]
  return total


def _cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _measure(overrides: list[str], hosts, rounds: int, worker_pids=()) -> dict:
  """Builds the run on the configured platform and times `rounds` rounds after one warm-up."""
  from fedmf.program import platform, training_run  # pylint: disable=import-outside-toplevel
  from fedmf.program.config import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(None, overrides)
  with platform.execution(config) as pool:
    run = training_run.build_run(config, pool=pool)
    training_run.train_round(run, training_run.draw_cohort(run, 0))  # warm-up: tracing, first calls
    before = [_link_bytes(h.link) for h in hosts]
    workers_cpu0 = sum(_tree_cpu_seconds(p) for p in worker_pids)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    walls = []
    for r in range(1, rounds + 1):
      start = time.perf_counter()
      training_run.train_round(run, training_run.draw_cohort(run, r))
      walls.append(time.perf_counter() - start)
    elapsed, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    after = [_link_bytes(h.link) for h in hosts]
    workers_cpu = sum(_tree_cpu_seconds(p) for p in worker_pids) - workers_cpu0
    if run.noise is not None:
      run.noise.close()
  sent = [(a[0] - b[0]) / rounds for a, b in zip(after, before)]
  received = [(a[1] - b[1]) / rounds for a, b in zip(after, before)]
  return {
    "wall_s": statistics.median(walls),
    "wall_mean_s": elapsed / rounds,
    "coordinator_cpu_s": cpu / rounds,
    "workers_cpu_s": workers_cpu / rounds,
    "sent_bytes_per_worker": sent,
    "received_bytes_per_worker": received,
  }


def predict(model: dict, workers: int, chunks: int, cores: int) -> float:
  """docs/scaling.md: T(W) = t_coord + compute(W) + transfer(W)."""
  per_worker = math.ceil(chunks / workers)
  # Chunks on one worker run one after another (a chunk's clients run concurrently inside it);
  # all workers together cannot use more CPU than the cores they share.
  compute = max(per_worker * model["chunk_wall_s"], chunks * model["chunk_cpu_s"] / cores)
  transfer = per_worker * (model["chunk_bytes"] * 8 / model["bandwidth_bps"] + model["chunk_rtt_s"])
  return model["coordinator_s"] + compute + transfer


# The papers' StackOverflow run (BandMF App. I; BLT §5): 1000 devices a round, 2052 rounds, the paper
# LSTM (4,050,748 float32 parameters). Per-client compute from docs/benchmarks.md §4: a 100-client
# round took 132-164 s on 2 cores, 1.48 s a client (median), i.e. 2.96 core-seconds.
SO_CLIENTS, SO_ROUNDS, SO_CHUNK = 1000, 2052, 20
SO_CLIENT_CORE_S = 2.96
SO_CHUNK_BYTES = 2 * 4 * 4_050_748 + SO_CHUNK * 256 * 21 * 8  # weights out, sum back, the data
SO_COORDINATOR_S = 1.1 + 0.03 * (SO_CLIENTS // SO_CHUNK)  # noise + server step; chunk adds


def predict_stackoverflow(machines: int, cores: int, gbit: float) -> float:
  """Seconds per round of the papers' StackOverflow run on `machines` workers of `cores` cores."""
  chunks = -(-SO_CLIENTS // SO_CHUNK)
  per_worker = -(-chunks // machines)
  compute = per_worker * SO_CHUNK * SO_CLIENT_CORE_S / cores
  transfer = max(
    per_worker * SO_CHUNK_BYTES * 8 / (gbit * 1e9),  # each worker's link
    chunks * SO_CHUNK_BYTES * 8 / (gbit * 1e9),  # the coordinator's link carries every chunk
  )
  return SO_COORDINATOR_S + compute + transfer


def print_stackoverflow_table() -> None:
  print("papers' StackOverflow run (1000 clients/round, 2052 rounds, lstm-paper), predicted:")
  print("machines x cores | link | s/round | whole run")
  for machines, cores in ((1, 2), (1, 16), (10, 16), (50, 16), (50, 64), (100, 32)):
    for gbit in (1, 10):
      t = predict_stackoverflow(machines, cores, gbit)
      total = t * SO_ROUNDS
      when = f"{total / 86400:.1f} days" if total > 2 * 86400 else f"{total / 3600:.1f} h"
      print(f"{machines} x {cores} | {gbit} Gbit/s | {t:.1f} | {when}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--workers", default="1,2,4")
  parser.add_argument("--rounds", type=int, default=6)
  parser.add_argument("--clients", type=int, default=16)
  parser.add_argument("--clients-per-call", type=int, default=2)
  parser.add_argument("--model", default="lstm-small")
  parser.add_argument("--sentences", type=int, default=64, help="sentences per client")
  parser.add_argument("--delay-ms", type=float, default=2.0)
  parser.add_argument("--rate-mbit", type=float, default=1000.0)
  parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--json", metavar="FILE")
  parser.add_argument(
    "--predict-only", action="store_true", help="print the StackOverflow prediction and exit"
  )
  args = parser.parse_args(argv)
  if args.predict_only:
    print_stackoverflow_table()
    return 0
  reason = netns.available()
  if reason:
    print(f"scaleout_benchmark: {reason}", file=sys.stderr)
    return 2
  counts = [int(w) for w in args.workers.split(",")]
  os.environ.setdefault("FEDMF_CACHE_DIR", tempfile.mkdtemp(prefix="fedmf-bench-cache-"))
  base = [
    "num_clients=400", f"clients_per_round={args.clients}", f"clients_per_call={args.clients_per_call}",
    f"model={args.model}", f"max_sentences_per_client={args.sentences}", "test_sentences=64",
    f"rounds={args.rounds + 2}", "participation.min_sep=1", "noise_multiplier=1.0", "mechanism=blt",
    "eval_every=1000",
  ]  # fmt: skip
  chunks = math.ceil(args.clients / args.clients_per_call)
  results = {}
  with tempfile.TemporaryDirectory() as tmp, netns.hosts(max(counts), tag="b") as hosts:
    certs = Path(tmp) / "certs"
    subprocess.run(
      ["bash", str(ROOT / "deploy/certs/make-certs.sh"), str(certs), *[h.address for h in hosts]],
      check=True, capture_output=True,
    )  # fmt: skip
    applied = [h.shape(delay_ms=args.delay_ms / 2, rate_mbit=args.rate_mbit) for h in hosts]
    if min(applied) < args.delay_ms / 2:
      print("(this kernel has no sch_netem: bandwidth limited by tbf, no added latency)")
      args.delay_ms = 0.0
    tls = [f"worker_tls.ca={certs}/ca.pem", f"worker_tls.cert={certs}/coordinator.pem",
           f"worker_tls.key={certs}/coordinator.key"]  # fmt: skip
    # Today's design before isolation, as the baseline: TFF's worker_binary on an open port
    # (what worker_isolation: none does where no namespace can be made).
    from fedmf.tff import sandbox  # pylint: disable=import-outside-toplevel

    probe, sandbox._PROBE = sandbox._PROBE, "benchmark baseline"  # pylint: disable=protected-access
    results["exposed"] = _measure(base + ["workers=0", "worker_isolation=none"], [], args.rounds)
    sandbox._PROBE = probe  # pylint: disable=protected-access
    results[0] = _measure(base + ["workers=0"], [], args.rounds)
    print(
      f"W=0: one local worker, isolated {results[0]['wall_s']:.3f} s/round vs exposed "
      f"(TFF's default) {results['exposed']['wall_s']:.3f} s/round: "
      f"{results[0]['wall_s'] / results['exposed']['wall_s']:.2f}x",
      flush=True,
    )
    for w in counts:
      procs = [netns.start_worker(h, certs, PORT, timeout=180) for h in hosts[:w]]
      try:
        addresses = "workers=[" + ",".join(f"'{h.address}:{PORT}'" for h in hosts[:w]) + "]"
        results[w] = _measure(
          base + [addresses, *tls], hosts[:w], args.rounds, [p.pid for p in procs]
        )
      finally:
        for p in procs:
          p.send_signal(signal.SIGTERM)
          p.wait(timeout=30)
      print(f"W={w}: {results[w]['wall_s']:.2f} s/round", flush=True)
  one = results[counts[0]] if counts[0] == 1 else None
  if one is None:
    print("the cost model is fitted on W=1: include 1 in --workers", file=sys.stderr)
    return 2
  chunk_bytes = (one["sent_bytes_per_worker"][0] + one["received_bytes_per_worker"][0]) / chunks
  bandwidth = args.rate_mbit * 1e6
  transfer_1 = chunks * (chunk_bytes * 8 / bandwidth + 4 * args.delay_ms / 1000)
  # The coordinator's share of a round: its CPU time not spent waiting on workers (noise, server
  # step, serialization), measured at W=1; compute is the rest.
  coordinator = one["coordinator_cpu_s"]
  model = {
    "coordinator_s": coordinator,
    "chunk_wall_s": max(one["wall_s"] - coordinator - transfer_1, 1e-6) / chunks,
    "chunk_cpu_s": one["workers_cpu_s"] / chunks,
    "chunk_bytes": chunk_bytes,
    "bandwidth_bps": bandwidth,
    "chunk_rtt_s": 4 * args.delay_ms / 1000,  # about 4 request/response exchanges per chunk
  }
  print()
  print(f"{args.clients} clients/round of {args.model} in {chunks} chunks; link RTT "
        f"{args.delay_ms} ms, {args.rate_mbit:g} Mbit/s; {args.cores} cores")  # fmt: skip
  print(
    "W | wall s/round | vs W=0 | sent MB/worker | recv MB/worker | coord CPU s | workers CPU s "
    "| model s | err"
  )
  for w in [0] + counts:
    r = results[w]
    sent = statistics.mean(r["sent_bytes_per_worker"]) / 1e6 if w else 0.0
    recv = statistics.mean(r["received_bytes_per_worker"]) / 1e6 if w else 0.0
    pred = predict(model, w, chunks, args.cores) if w else float("nan")
    err = (pred - r["wall_s"]) / r["wall_s"] * 100 if w else float("nan")
    print(
      f"{w} | {r['wall_s']:.2f} | {r['wall_s'] / results[0]['wall_s']:.2f}x | {sent:.2f} | "
      f"{recv:.2f} | {r['coordinator_cpu_s']:.2f} | {r.get('workers_cpu_s', 0.0):.2f} | "
      f"{pred:.2f} | {err:+.0f}%"
    )
  print("model:", json.dumps({k: round(v, 6) for k, v in model.items()}))
  print()
  print_stackoverflow_table()
  if args.json:
    Path(args.json).write_text(
      json.dumps({"results": {str(k): v for k, v in results.items()}, "model": model}, indent=1)
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
