"""Benchmark: audit a large CSV participation log against a plain pyarrow read of the same file.

Generates the log (numpy + pyarrow, chunked), then, each in a fresh child process so that peak
memory is per step:
  1. a baseline: ``pyarrow.csv.read_csv`` of the whole file (same column types), timed;
  2. the full audit, ``fedmf.privacy.audit.audit_log`` (read + statistics + violations +
     sensitivities + PLD ε + per-round ε curve), timed, with where the time goes;
  3. the baseline again (the faster read is the one compared against).
Prints wall and CPU seconds, the audit / read ratio, peak RSS (ru_maxrss) of each child, and the
load average (the machine may be shared).

Logs: ``--rows`` rows over ``--rounds`` rounds; each round takes the next rows/rounds clients of a
random permutation of ``--clients`` clients (a new permutation when one is used up).
``--pathological`` adds ``--hot`` clients that take part in every round, each retried 1 to 20 times
in it (a logging bug with retries: thousands of participations, many duplicates).

Usage: .venv/bin/python benchmarks/audit_benchmark.py [--rows 10000000] [--clients 1000000]
       [--rounds 2000] [--pathological] [--dir DIR] [--keep] [--json FILE] [--id-coding]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

BLT400 = {
  "mechanism": "blt",
  "buf_decay": [0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778],
  "output_scale": [
    0.0070314825502323835,
    0.10613806907600574,
    0.1898159060327625,
    0.1966594748073734,
  ],
}
SIGMA, DELTA, MIN_SEP, MAX_PARTICIPATIONS = 7.379, 1e-10, 150, 10


def generate(path: str, rows: int, clients: int, rounds: int, hot: int = 0, seed: int = 0) -> int:
  """Writes the log (see the module docstring); returns its number of rows."""
  rng = np.random.default_rng(seed)
  per_round = rows // rounds
  schema = pa.schema([("round", pa.int64()), ("client_id", pa.string())])
  perm = rng.permutation(clients)
  pos = 0
  written = 0
  hot_ids = np.array([f"hot-{h}" for h in range(hot)], dtype=object)
  with pacsv.CSVWriter(path, schema) as w:
    for r in range(rounds):
      if pos + per_round > clients:
        perm = rng.permutation(clients)
        pos = 0
      ids = pa.array(perm[pos : pos + per_round]).cast(pa.string())
      pos += per_round
      if hot:
        retries = np.repeat(hot_ids, rng.integers(1, 21, hot))
        ids = pa.concat_arrays([ids, pa.array(rng.permutation(retries).tolist(), pa.string())])
      w.write_table(
        pa.table(
          {"round": pa.array(np.full(len(ids), r, dtype=np.int64)), "client_id": ids}, schema=schema
        )
      )
      written += len(ids)
  return written


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_read(path: str) -> dict:
  t, c = time.perf_counter(), _cpu()
  table = pacsv.read_csv(
    path,
    convert_options=pacsv.ConvertOptions(
      column_types={"round": pa.int64(), "client_id": pa.string()}
    ),
  )
  return {
    "wall": time.perf_counter() - t,
    "cpu": _cpu() - c,
    "rows": table.num_rows,
    "rss_mb": _rss_mb(),
  }


class _Timer:
  """Accumulates seconds spent in wrapped functions (and in a generator's next())."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  def add(self, name: str, seconds: float) -> None:
    self.seconds[name] = self.seconds.get(name, 0.0) + seconds

  def function(self, name: str, fn):
    def wrapper(*args, **kwargs):
      t = time.perf_counter()
      try:
        return fn(*args, **kwargs)
      finally:
        self.add(name, time.perf_counter() - t)

    return wrapper

  def generator(self, name: str, fn):
    def wrapper(*args, **kwargs):
      it = fn(*args, **kwargs)
      while True:
        t = time.perf_counter()
        try:
          item = next(it)
        except StopIteration:
          self.add(name, time.perf_counter() - t)
          return
        self.add(name, time.perf_counter() - t)
        yield item

    return wrapper


def worker_audit(path: str, rounds: int) -> dict:
  from fedmf.privacy import (
    accounting,
    audit,
    curve,
    log_reader,
    log_scan,
    log_statistics,
    participation_log,
  )  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import gaussian_curve

  rss_before = _rss_mb()
  timer = _Timer()
  # Where the time goes: the reader thread (parse = waiting for Arrow's next CSV batch; validate;
  # ids -> codes), the scan thread (LogScan.update), then the rest in order.
  log_reader._iter_csv = timer.generator("read: parse CSV (Arrow)", log_reader._iter_csv)
  log_reader._validate_batch = timer.function("read: validate batch", log_reader._validate_batch)
  participation_log.ClientIndex.codes = timer.function(
    "read: client ids -> codes", participation_log.ClientIndex.codes
  )
  log_scan.LogScan.update = timer.function("scan: LogScan.update", log_scan.LogScan.update)
  log_scan.LogScan.finish = timer.function(
    "finish: statistics + listing violations", log_scan.LogScan.finish
  )
  scan_log = timer.function("log (read + scan + finish), wall", log_statistics.statistics_of_file)

  def scan_log_with_cpu(*args, **kwargs):
    c = _cpu()
    try:
      return scan_log(*args, **kwargs)
    finally:
      timer.add("log (read + scan + finish), cpu of all threads", _cpu() - c)

  log_statistics.statistics_of_file = scan_log_with_cpu
  calls = {"sensitivity": 0}
  # The evaluations themselves (a cache hit never reaches them): the strategy caches its values.
  from fedmf.mf.strategy import Strategy  # pylint: disable=import-outside-toplevel

  inner = Strategy._compute_sensitivity

  def counted(self, schema, method):
    """Times and counts the evaluations (not the cache hits) of the strategy's sensitivity."""
    calls["sensitivity"] += 1
    t = time.perf_counter()
    try:
      return inner(self, schema, method)
    finally:
      timer.add("accounting: sensitivity calls", time.perf_counter() - t)

  Strategy._compute_sensitivity = counted
  accounting.pld_gaussian_epsilon = timer.function(
    "accounting: PLD epsilon (incl. import)", accounting.pld_gaussian_epsilon
  )
  gaussian_curve.gaussian_epsilon = timer.function(
    "accounting: analytic epsilon", gaussian_curve.gaussian_epsilon
  )
  audit._pld_grid_points = timer.function(
    "accounting: PLD size check (incl. import)", audit._pld_grid_points
  )
  curve.epsilon_curve = timer.function("accounting: epsilon curve", curve.epsilon_curve)
  audit.curve_lib.epsilon_curve = curve.epsilon_curve
  t, c = time.perf_counter(), _cpu()
  result = audit.audit_log(
    path,
    BLT400,
    SIGMA,
    DELTA,
    rounds=rounds,
    min_sep=MIN_SEP,
    max_participations=MAX_PARTICIPATIONS,
  )
  wall, cpu = time.perf_counter() - t, _cpu() - c
  s = result.stats
  return {
    "wall": wall,
    "cpu": cpu,
    "rss_mb": _rss_mb(),
    "rss_before_mb": rss_before,
    "phases": timer.seconds,
    "sensitivity_calls": calls["sensitivity"],
    "result": {
      "rows": s.log_rows,
      "clients": s.clients,
      "participations": s.participations,
      "duplicate_rows": s.duplicate_rows,
      "b": s.observed_min_sep,
      "k": s.observed_max_participations,
      "violations": result.violation_counts(),
      "listed": len(result.violations),
      "sensitivity": result.realized.sensitivity,
      "accountant": result.realized.accountant,
      "rho": result.realized.rho,
      "epsilon": result.realized.epsilon,
      "warnings": list(result.warnings),
    },
  }


def worker_id_coding(path: str) -> dict:
  """Client ids -> integer codes on the read table: Arrow's hash kernels vs fedmf's ClientIndex."""
  import pyarrow.compute as pc  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

  ids = pacsv.read_csv(
    path,
    convert_options=pacsv.ConvertOptions(
      column_types={"round": pa.int64(), "client_id": pa.string()}
    ),
  ).column("client_id")
  out = {}
  for name, fn in (
    ("pyarrow.compute.dictionary_encode (strings)", lambda: pc.dictionary_encode(ids)),
    ("pyarrow.compute.unique (strings)", lambda: pc.unique(ids)),
    (
      "fedmf ClientIndex.codes (read_csv's chunks)",
      lambda: [index.codes(c) for index in [participation_log.ClientIndex()] for c in ids.chunks],
    ),
  ):
    t, c = time.perf_counter(), _cpu()
    fn()
    out[name] = {"wall": time.perf_counter() - t, "cpu": _cpu() - c}
  return out


def _child(mode: str, path: str, rounds: int) -> dict:
  out = subprocess.run(
    [
      sys.executable,
      os.path.abspath(__file__),
      "--worker",
      mode,
      "--log",
      path,
      "--rounds",
      str(rounds),
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  if out.returncode:
    sys.stderr.write(out.stderr)
    raise SystemExit(f"{mode} child failed")
  return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
  return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=10_000_000)
  ap.add_argument("--clients", type=int, default=1_000_000)
  ap.add_argument("--rounds", type=int, default=2000)
  ap.add_argument(
    "--pathological",
    action="store_true",
    help="add --hot clients in every round, each retried 1-20 times in it",
  )
  ap.add_argument("--hot", type=int, default=5)
  ap.add_argument("--dir", default=None, help="directory for the log (default: a temporary one)")
  ap.add_argument("--keep", action="store_true", help="keep the log (reused when it exists)")
  ap.add_argument("--json", default=None, help="also write the measurements to this file")
  ap.add_argument(
    "--id-coding",
    action="store_true",
    help="also time Arrow's dictionary_encode/unique of the ids against ClientIndex",
  )
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--log", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    fn = {
      "read": worker_read,
      "id-coding": worker_id_coding,
      "audit": lambda p: worker_audit(p, args.rounds),
    }[args.worker]
    print(json.dumps(fn(args.log)))
    return 0

  tmp = tempfile.TemporaryDirectory(dir=args.dir) if not args.keep else None
  directory = tmp.name if tmp else (args.dir or ".")
  name = (
    f"participation-{args.rows}-{args.clients}-{args.rounds}"
    + (f"-hot{args.hot}" if args.pathological else "")
    + ".csv"
  )
  path = os.path.join(directory, name)
  if not os.path.exists(path):
    t = time.perf_counter()
    rows = generate(
      path, args.rows, args.clients, args.rounds, args.hot if args.pathological else 0
    )
    print(
      f"generated {rows} rows, {os.path.getsize(path) / 1e6:.0f} MB in "
      f"{time.perf_counter() - t:.1f} s: {path}"
    )
  print(f"log: {path} ({os.path.getsize(path) / 1e6:.0f} MB)")
  runs = {"load_start": _load()}
  runs["read_1"] = _child("read", path, args.rounds)
  runs["load_audit_start"] = _load()
  runs["audit"] = _child("audit", path, args.rounds)
  runs["load_audit_end"] = _load()
  runs["read_2"] = _child("read", path, args.rounds)
  runs["load_end"] = _load()
  read = min(runs["read_1"], runs["read_2"], key=lambda r: r["wall"])
  a = runs["audit"]
  log_wall = a["phases"].get("log (read + scan + finish), wall", 0.0)
  print(
    f"load average (1, 5, 15 min): start {runs['load_start']}; audit start "
    f"{runs['load_audit_start']}, end {runs['load_audit_end']}; end {runs['load_end']}"
  )
  for key in ("read_1", "read_2"):
    r = runs[key]
    print(
      f"pyarrow.csv.read_csv ({key[-1]}): wall {r['wall']:.2f} s, cpu {r['cpu']:.2f} s, "
      f"peak RSS {r['rss_mb']:.0f} MB"
    )
  print(
    f"audit_log: wall {a['wall']:.2f} s, cpu {a['cpu']:.2f} s, peak RSS {a['rss_mb']:.0f} MB "
    f"({a['rss_before_mb']:.0f} MB after imports)"
  )
  log_cpu = a["phases"].get("log (read + scan + finish), cpu of all threads", 0.0)
  print(
    f"  audit / read = {a['wall'] / read['wall']:.2f} (cpu {a['cpu'] / read['cpu']:.2f}); log "
    f"part (read + scan + finish) / read = {log_wall / read['wall']:.2f} (cpu "
    f"{log_cpu / read['cpu']:.2f}); sensitivity calls: {a['sensitivity_calls']}"
  )
  for phase, seconds in a["phases"].items():
    print(f"  {phase:48s} {seconds:7.2f} s")
  print(f"  {'accounting and the rest (audit - log part)':48s} {a['wall'] - log_wall:7.2f} s")
  print("result:", json.dumps(a["result"]))
  if args.id_coding:
    runs["id_coding"] = _child("id-coding", path, args.rounds)
    runs["load_id_coding_end"] = _load()
    for name, r in runs["id_coding"].items():
      print(f"ids -> codes: {name:46s} wall {r['wall']:6.2f} s, cpu {r['cpu']:6.2f} s")
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(runs, f, indent=1)
  if tmp is not None:
    tmp.cleanup()
  return 0


if __name__ == "__main__":
  sys.exit(main())
