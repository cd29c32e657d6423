"""Benchmark: audit a 10-million-row CSV participation log (1M clients, 2000 rounds) with a BLT.

Generates the log with numpy + pyarrow (chunked, in a temporary directory), then in one process:
  1. the full audit (read + statistics + violations + sensitivity + PLD ε + per-round ε curve),
  2. a baseline: reading the same CSV with pyarrow.csv.read_csv (same column types).
Prints wall times (with the audit split into reading the log, statistics + violations, and the
accounting), their ratio and peak RSS (resource.getrusage ru_maxrss, after step 1).

Usage: .venv/bin/python benchmarks/audit_benchmark.py [--rows 10000000] [--clients 1000000]
       [--rounds 2000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

BLT400 = {"mechanism": "blt",
          "buf_decay": [0.9999999999921251, 0.9944453083640997, 0.8985923474607591,
                        0.4912001418098778],
          "output_scale": [0.0070314825502323835, 0.10613806907600574, 0.1898159060327625,
                           0.1966594748073734]}


def generate(path: str, rows: int, clients: int, rounds: int, seed: int = 0) -> None:
  """Each round takes the next rows/rounds clients of a per-epoch random permutation."""
  rng = np.random.default_rng(seed)
  per_round = rows // rounds
  schema = pa.schema([("round", pa.int64()), ("client_id", pa.string())])
  perm = rng.permutation(clients)
  pos = 0
  with pacsv.CSVWriter(path, schema) as w:
    for r in range(rounds):
      if pos + per_round > clients:
        perm = rng.permutation(clients)
        pos = 0
      ids = perm[pos:pos + per_round]
      pos += per_round
      table = pa.table({"round": pa.array(np.full(per_round, r, dtype=np.int64)),
                        "client_id": pa.array(ids).cast(pa.string())}, schema=schema)
      w.write_table(table)


def main() -> int:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rows", type=int, default=10_000_000)
  ap.add_argument("--clients", type=int, default=1_000_000)
  ap.add_argument("--rounds", type=int, default=2000)
  ap.add_argument("--keep", default=None, help="directory to keep the log in")
  args = ap.parse_args()
  tmp = tempfile.TemporaryDirectory() if args.keep is None else None
  directory = args.keep or tmp.name
  path = os.path.join(directory, "participation.csv")
  t = time.perf_counter()
  generate(path, args.rows, args.clients, args.rounds)
  gen = time.perf_counter() - t
  print(f"generated {args.rows} rows, {os.path.getsize(path) / 1e6:.0f} MB in {gen:.1f} s")
  rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

  from fedmf.privacy import audit, participation_log  # pylint: disable=g-import-not-at-top
  # Phase timers: wrap the two log-processing steps audit_log calls (no extra work is done).
  phases = {}

  def timed(name, fn):
    def wrapper(*a, **kw):
      t0 = time.perf_counter()
      try:
        return fn(*a, **kw)
      finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
    return wrapper

  participation_log.read_participation_arrays = timed("read", participation_log.read_participation_arrays)
  audit.log_statistics = timed("statistics", audit.log_statistics)
  t = time.perf_counter()
  result = audit.audit_log(path, BLT400, 7.379, 1e-10, rounds=args.rounds, min_sep=150,
                           max_participations=10)
  audit_time = time.perf_counter() - t
  log_part = phases.get("read", 0.0) + phases.get("statistics", 0.0)
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  s = result.stats
  print(f"audit: {audit_time:.2f} s; clients {s.clients}, participations {s.participations}, "
        f"b = {s.observed_min_sep}, k = {s.observed_max_participations}, "
        f"violations {len(result.violations)}, sensitivity {result.realized.sensitivity:.4f}, "
        f"rho {result.realized.rho:.4f}, epsilon {result.realized.epsilon:.3f}")
  print(f"  read log -> arrays {phases.get('read', 0.0):.2f} s, statistics + violations "
        f"{phases.get('statistics', 0.0):.2f} s, accounting (imports, sensitivity, PLD, "
        f"epsilon curve) {audit_time - log_part:.2f} s")
  print(f"peak RSS after audit: {rss:.0f} MB (before audit: {rss0:.0f} MB)")

  t = time.perf_counter()
  table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
      column_types={"round": pa.int64(), "client_id": pa.string()}))
  base = time.perf_counter() - t
  print(f"baseline pyarrow.csv.read_csv: {base:.2f} s ({table.num_rows} rows); "
        f"audit / read ratio {audit_time / base:.2f}; (read + statistics) / read ratio "
        f"{log_part / base:.2f}")
  del table
  if tmp is not None:
    tmp.cleanup()
  return 0


if __name__ == "__main__":
  sys.exit(main())
