"""Benchmark (issue 23, item 1): candidate engines for the auditor's pass over a participation log.

Each engine computes the log part of an audit on the same CSV file, each in a fresh child process:
rows, distinct (round, client) participations, clients, max round, duplicate rows, the realized
min-separation b (least gap between a client's consecutive distinct rounds) and max participations
k, the number of distinct gaps. Compared, against a plain ``pyarrow.csv.read_csv`` of the file timed
in the same run:

* ``fedmf``: ``fedmf.privacy.log_statistics.statistics_of_file`` as it is (numpy hash table ``ClientIndex`` and the
  vectorized ``LogScan``, streamed over pyarrow batches; it also lists violations and per-round
  prefixes, which the others here do not);
* ``polars``: a lazy query (streaming engine) over ``scan_csv``: group by (client, round), then per
  client the sorted rounds' differences;
* ``duckdb``: the same in SQL over ``read_csv`` (``lag`` over a window per client);
* ``numba``: one compiled loop over each pyarrow batch's buffers (an open-addressing hash table over
  the id bytes, then per-client last round, count and least gap), rows in round order.

Every engine's numbers must equal fedmf's (the script says so and exits 1 otherwise). The engines
are not fedmf dependencies; run with them added for the run only, for instance:

  .tools/bin/uv run --with polars --with duckdb --with numba python benchmarks/audit_engines.py \\
    --rows 3000000 --clients 300000 --rounds 2000

Engines not installed are skipped.
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

sys.path[:0] = [
  os.path.dirname(os.path.abspath(__file__)),
  os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
]

ENGINES = ("read", "fedmf", "polars", "duckdb", "numba")


def _cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def run_read(path: str) -> dict:
  import pyarrow as pa
  import pyarrow.csv as pacsv

  t = pacsv.read_csv(
    path,
    convert_options=pacsv.ConvertOptions(
      column_types={"round": pa.int64(), "client_id": pa.string()}
    ),
  )
  return {"rows": t.num_rows}


def run_fedmf(path: str) -> dict:
  from fedmf.privacy import log_statistics

  s, _ = log_statistics.statistics_of_file(path, min_sep=150, max_participations=10)
  return {
    "rows": s.log_rows,
    "participations": s.participations,
    "clients": s.clients,
    "max_round": s.max_round,
    "duplicate_rows": s.duplicate_rows,
    "min_sep": s.observed_min_sep,
    "max_participations": s.observed_max_participations,
    "distinct_gaps": int(len(s.gap_values)),
  }


def run_polars(path: str) -> dict:
  import polars as pl

  lf = pl.scan_csv(path, schema={"round": pl.Int64, "client_id": pl.String})
  pairs = lf.group_by("client_id", "round").agg(pl.len().alias("n"))
  per_client = pairs.group_by("client_id").agg(
    pl.col("round").sort().diff().alias("gaps"), pl.len().alias("k")
  )
  # One plan for the three results (polars shares the common scan and group-bys).
  totals, clients, gaps = pl.collect_all(
    [
      pairs.select(
        pl.col("n").sum().alias("rows"),
        pl.len().alias("participations"),
        pl.col("round").max().alias("max_round"),
      ),
      per_client.select(
        pl.len().alias("clients"),
        pl.col("k").max().alias("k"),
        pl.col("gaps").list.min().min().alias("b"),
      ),
      per_client.select(pl.col("gaps").explode().drop_nulls().unique().len().alias("g")),
    ],
    engine="streaming",
  )
  gaps = gaps["g"][0]
  rows = int(totals["rows"][0])
  participations = int(totals["participations"][0])
  k = int(clients["k"][0])
  return {
    "rows": rows,
    "participations": participations,
    "clients": int(clients["clients"][0]),
    "max_round": int(totals["max_round"][0]),
    "duplicate_rows": rows - participations,
    "min_sep": int(clients["b"][0]) if k > 1 else None,
    "max_participations": k,
    "distinct_gaps": int(gaps),
  }


def run_duckdb(path: str) -> dict:
  import duckdb

  con = duckdb.connect()
  con.execute(f"SET threads TO {os.cpu_count()}")
  q = f"""
    WITH t AS (
      SELECT client_id, round, count(*) AS n
      FROM read_csv('{path}', header=true, columns={{'round': 'BIGINT', 'client_id': 'VARCHAR'}})
      GROUP BY client_id, round),
    g AS (
      SELECT client_id, round, n,
        round - lag(round) OVER (PARTITION BY client_id ORDER BY round) AS gap FROM t),
    c AS (SELECT client_id, count(*) AS k FROM t GROUP BY client_id)
    SELECT
      (SELECT sum(n) FROM t), (SELECT count(*) FROM t), (SELECT count(*) FROM c),
      (SELECT max(round) FROM t), (SELECT min(gap) FROM g), (SELECT max(k) FROM c),
      (SELECT count(DISTINCT gap) FROM g)
  """
  rows, participations, clients, max_round, b, k, gaps = con.execute(q).fetchone()
  return {
    "rows": int(rows),
    "participations": int(participations),
    "clients": int(clients),
    "max_round": int(max_round),
    "duplicate_rows": int(rows - participations),
    "min_sep": int(b) if k > 1 else None,
    "max_participations": int(k),
    "distinct_gaps": int(gaps),
  }


def run_numba(path: str) -> dict:
  import numpy as np
  import pyarrow as pa
  import pyarrow.csv as pacsv

  convert = pacsv.ConvertOptions(column_types={"round": pa.int64(), "client_id": pa.string()})
  reader = pacsv.open_csv(
    path, read_options=pacsv.ReadOptions(block_size=1 << 22), convert_options=convert
  )
  table = np.full(1 << 16, -1, np.int64)
  arena = np.zeros(1 << 20, np.uint8)
  starts = np.zeros(1 << 15, np.int64)
  last = np.full(1 << 15, -1, np.int64)
  count = np.zeros(1 << 15, np.int64)
  gaps = np.zeros(1 << 12, np.int64)
  min_gap = np.array([2**62], np.int64)
  state = np.zeros(6, np.int64)
  rows = 0
  in_kernel = 0.0
  for batch in reader:
    ids = batch.column(1)
    rounds = batch.column(0).to_numpy()
    n = len(ids)
    rows += n
    bufs = ids.buffers()
    offsets = np.frombuffer(bufs[1], np.int32)[ids.offset : ids.offset + n + 1]
    data = np.frombuffer(bufs[2], np.uint8)
    # Room for every row being a new client, before the kernel runs (it does not grow arrays).
    need = int(state[0]) + n
    if 2 * need > table.shape[0]:
      size = table.shape[0]
      while 2 * need > size:
        size *= 2
      table = rehash(size, arena, starts, int(state[0]))
    if need + 1 > starts.shape[0]:
      grow = max(need + 1, 2 * starts.shape[0])
      starts = np.concatenate([starts, np.zeros(grow - starts.shape[0], np.int64)])
      last = np.concatenate([last, np.full(grow - last.shape[0], -1, np.int64)])
      count = np.concatenate([count, np.zeros(grow - count.shape[0], np.int64)])
    nbytes = int(offsets[-1] - offsets[0])
    if int(state[1]) + nbytes > arena.shape[0]:
      arena = np.concatenate([arena, np.zeros(max(nbytes, arena.shape[0]), np.uint8)])
    top = int(rounds.max()) + 1 if n else 0
    if top > gaps.shape[0]:
      gaps = np.concatenate([gaps, np.zeros(top - gaps.shape[0], np.int64)])
    t = time.thread_time()  # CPU seconds of this thread: the machine may be shared.
    kernel(offsets, data, rounds, table, arena, starts, state, last, count, min_gap, gaps)
    in_kernel += time.thread_time() - t
    if state[4]:
      raise SystemExit("numba: the log is not in round order")
  clients = int(state[0])
  k = int(count[:clients].max())
  return {
    "rows": rows,
    "participations": rows - int(state[3]),
    "clients": clients,
    "max_round": int(state[5]),
    "duplicate_rows": int(state[3]),
    "min_sep": int(min_gap[0]) if k > 1 else None,
    "max_participations": k,
    "distinct_gaps": int(np.count_nonzero(gaps)),
    "kernel_cpu": in_kernel,
  }


_t = time.perf_counter()
try:  # The kernel at module level, so that numba caches its compiled code between runs.
  import numba
  import numpy as np
except ImportError:
  numba = None
_NUMBA_IMPORT = time.perf_counter() - _t

if numba is not None:

  @numba.njit(cache=True, nogil=True)
  def kernel(offsets, data, rounds, table, arena, arena_starts, state, last, count, min_gap, gaps):
    # state: [clients, arena used, min gap, duplicates, not in round order, max round]
    mask = table.shape[0] - 1
    for i in range(rounds.shape[0]):
      lo, hi = offsets[i], offsets[i + 1]
      h = np.uint64(14695981039346656037)
      for p in range(lo, hi):
        h = (h ^ np.uint64(data[p])) * np.uint64(1099511628211)
      # FNV's low bits cluster on ids that differ in their last digits: mix before masking
      # (murmur3's finalizer step).
      h ^= h >> np.uint64(33)
      h *= np.uint64(0xFF51AFD7ED558CCD)
      h ^= h >> np.uint64(33)
      slot = np.int64(h & np.uint64(mask))
      while True:
        code = table[slot]
        if code < 0:
          code = state[0]
          state[0] += 1
          table[slot] = code
          start = state[1]
          for p in range(lo, hi):
            arena[start + p - lo] = data[p]
          state[1] = start + hi - lo
          arena_starts[code + 1] = state[1]
          break
        s0, s1 = arena_starts[code], arena_starts[code + 1]
        if s1 - s0 == hi - lo:
          same = True
          for p in range(hi - lo):
            if arena[s0 + p] != data[lo + p]:
              same = False
              break
          if same:
            break
        slot = (slot + 1) & mask
      r = rounds[i]
      if r > state[5]:
        state[5] = r
      prev = last[code]
      if prev == r:
        state[3] += 1
      elif prev >= 0:
        if r < prev:
          state[4] = 1
          return
        gap = r - prev
        gaps[gap] += 1
        if gap < min_gap[0]:
          min_gap[0] = gap
        last[code] = r
        count[code] += 1
      else:
        last[code] = r
        count[code] = 1

  @numba.njit(cache=True, nogil=True)
  def rehash(size, arena, arena_starts, clients):
    """A table of ``size`` slots holding the codes 0..clients-1 again (same hash as ``kernel``)."""
    table = np.full(size, -1, np.int64)
    for code in range(clients):
      h = np.uint64(14695981039346656037)
      for p in range(arena_starts[code], arena_starts[code + 1]):
        h = (h ^ np.uint64(arena[p])) * np.uint64(1099511628211)
      h ^= h >> np.uint64(33)
      h *= np.uint64(0xFF51AFD7ED558CCD)
      h ^= h >> np.uint64(33)
      slot = np.int64(h & np.uint64(size - 1))
      while table[slot] >= 0:
        slot = (slot + 1) & (size - 1)
      table[slot] = code
    return table


# What each engine imports before it runs (timed apart: a fixed cost, not a per-row one).
IMPORTS = {
  "read": "pyarrow.csv",
  "fedmf": "fedmf.privacy.log_statistics",
  "polars": "polars",
  "duckdb": "duckdb",
  "numba": "pyarrow.csv",  # numba itself is imported with this module (the kernel's definition).
}


def child(engine: str, path: str) -> None:
  import importlib  # pylint: disable=g-import-not-at-top

  t = time.perf_counter()
  importlib.import_module(IMPORTS[engine])
  imported = time.perf_counter() - t
  if engine == "numba" and numba is None:
    raise SystemExit("ModuleNotFoundError: No module named 'numba'")
  if engine == "numba":  # Load the cached compiled kernels (a fixed cost too).
    import numpy as np  # pylint: disable=g-import-not-at-top

    rehash(4, np.zeros(1, np.uint8), np.zeros(2, np.int64), 0)
    z = np.zeros(1, np.int64)
    kernel(
      np.zeros(1, np.int32),
      np.zeros(1, np.uint8),
      np.zeros(0, np.int64),
      np.full(4, -1, np.int64),
      np.zeros(1, np.uint8),
      np.zeros(2, np.int64),
      np.zeros(6, np.int64),
      z,
      z,
      z.copy(),
      z,
    )
    imported = time.perf_counter() - t + _NUMBA_IMPORT
  t, c = time.perf_counter(), _cpu()
  out = globals()[f"run_{engine}"](path)
  out.update(
    imported=imported,
    wall=time.perf_counter() - t,
    cpu=_cpu() - c,
    rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
  )
  print(json.dumps(out))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=int, default=3_000_000)
  parser.add_argument("--clients", type=int, default=300_000)
  parser.add_argument("--rounds", type=int, default=2000)
  parser.add_argument("--hot", type=int, default=0, help="clients in every round, with retries")
  parser.add_argument("--engines", default=",".join(ENGINES))
  parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(*args.child)
    return 0
  from audit_benchmark import generate  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "log.csv")
    written = generate(path, args.rows, args.clients, args.rounds, hot=args.hot)
    print(
      f"log: {written} rows, {args.clients} clients, {args.rounds} rounds, hot {args.hot}, "
      f"{os.path.getsize(path) / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.2f}"
    )
    results = {}
    order = [e for e in args.engines.split(",") if e]
    if "numba" in order:  # The first call compiles (then cached): not what is measured.
      order.insert(order.index("numba"), "numba")
    for engine in order + ["read"]:
      done = subprocess.run(
        [sys.executable, __file__, "--child", engine, path], capture_output=True, text=True
      )
      if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        print(f"{engine:>7}: skipped ({last})")
        continue
      r = json.loads(done.stdout.strip().splitlines()[-1])
      if engine == "read" and "read" in results:
        results["read"] = min(results["read"], r, key=lambda x: x["wall"])
      else:
        results[engine] = r
    base = results["read"]
    ok = True
    for engine, r in results.items():
      same = engine in ("read", "fedmf") or all(
        r[key] == results["fedmf"][key]
        for key in results["fedmf"]
        if key in results["fedmf"] and key not in ("wall", "cpu", "rss_mb", "imported")
      )
      ok &= same
      print(
        f"{engine:>7}: import {r['imported']:5.2f} s, then wall {r['wall']:6.2f} s "
        f"({r['wall'] / base['wall']:5.2f}x read)  cpu "
        f"{r['cpu']:6.2f} s ({r['cpu'] / base['cpu']:5.2f}x)  peak RSS {r['rss_mb']:6.0f} MB"
        + ("" if same else "  NUMBERS DIFFER: " + json.dumps(r))
      )
    print(json.dumps(results["fedmf"]))
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
