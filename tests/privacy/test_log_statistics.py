"""The one-pass auditor (LogScan, scan_log) against a plain-Python reference and the sort-based path.

The reference below is written for obviousness, not speed: per client, the sorted distinct rounds;
every number of the audit follows from them by definition (docs/participation-log.md).
"""

import collections

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as hs

from fedmf.privacy import (
  log_counts,
  log_reader,
  log_scan,
  log_sort,
  log_statistics,
  participation_log,
)


def reference(rows, min_sep=None, max_participations=None):
  """Statistics and the full violation list of rows [(round, client_id)], by definition."""
  rounds_of = collections.defaultdict(list)  # Client -> its rounds, duplicates included.
  for r, c in rows:
    rounds_of[c].append(r)
  clients = list(rounds_of)  # First appearance order (dicts keep insertion order).
  distinct = {c: sorted(set(rs)) for c, rs in rounds_of.items()}
  gaps = [j - i for c in clients for i, j in zip(distinct[c], distinct[c][1:])]
  max_round = max(r for r, _ in rows)
  prefix_b, prefix_k = [], []
  for r in range(max_round + 1):
    g = [j - i for c in clients for i, j in zip(distinct[c], distinct[c][1:]) if j <= r]
    prefix_b.append(min(g) if g else -1)
    prefix_k.append(max(sum(1 for x in distinct[c] if x <= r) for c in clients))
  participations = sum(len(d) for d in distinct.values())
  violations = []
  for c in clients:
    d = distinct[c]
    if min_sep is not None:
      close = sorted({x for i, j in zip(d, d[1:]) if j - i < min_sep for x in (i, j)})
      if close:
        violations.append((c, tuple(close), "min-sep"))
    if max_participations is not None and len(d) > max_participations:
      violations.append((c, tuple(d), "max-participations"))
    counts = collections.Counter(rounds_of[c])
    dups = sorted(r for r, m in counts.items() if m > 1)
    if dups:
      violations.append((c, tuple(dups), "duplicate"))
  return {
    "log_rows": len(rows),
    "participations": participations,
    "clients": len(clients),
    "max_round": max_round,
    "observed_min_sep": min(gaps) if gaps else None,
    "observed_max_participations": max(len(d) for d in distinct.values()),
    "gap_histogram": sorted(collections.Counter(gaps).items()),
    "participation_histogram": sorted(
      collections.Counter(len(d) for d in distinct.values()).items()
    ),
    "prefix_min_sep": prefix_b,
    "prefix_max_participations": prefix_k,
    "duplicate_rows": len(rows) - participations,
  }, violations


def summary(stats):
  return {
    "log_rows": stats.log_rows,
    "participations": stats.participations,
    "clients": stats.clients,
    "max_round": stats.max_round,
    "observed_min_sep": stats.observed_min_sep,
    "observed_max_participations": stats.observed_max_participations,
    "gap_histogram": list(zip(stats.gap_values.tolist(), stats.gap_counts.tolist())),
    "participation_histogram": list(
      zip(stats.participation_values.tolist(), stats.participation_counts.tolist())
    ),
    "prefix_min_sep": stats.prefix_min_sep.tolist(),
    "prefix_max_participations": stats.prefix_max_participations.tolist(),
    "duplicate_rows": stats.duplicate_rows,
  }


def listed(table):
  return [(v.client_id, v.rounds, v.reason) for v in table]


def check(stats, table, rows, min_sep, max_participations, limit):
  expected, violations = reference(rows, min_sep, max_participations)
  assert summary(stats) == expected
  assert listed(table) == violations[:limit]
  assert table.to_list() == [
    {"client_id": c, "rounds": list(r), "reason": w} for c, r, w in violations[:limit]
  ]
  assert table.counts() == {
    reason: sum(1 for v in violations if v[2] == reason) for reason in log_counts.REASONS
  }
  assert table.truncated == (limit is not None and len(violations) > limit)


def arrays_of(rows):
  enc = pa.array([c for _, c in rows], pa.string()).dictionary_encode()
  return (
    np.array([r for r, _ in rows], dtype=np.int64),
    enc.indices.to_numpy().astype(np.int32),
    enc.dictionary,
  )


# Logs in round order (as the writer produces them), with repeated clients, retries within a round
# and rounds split across batches; `shuffle` mixes rows within each round.
@hs.composite
def round_ordered_logs(draw):
  num_clients = draw(hs.integers(1, 12))
  rounds = draw(hs.integers(1, 30))
  rows = []
  for r in range(rounds):
    cohort = draw(hs.lists(hs.integers(0, num_clients - 1), max_size=6))
    retries = draw(hs.lists(hs.sampled_from(cohort), max_size=3)) if cohort else []
    rows += [(r, f"c{c}") for c in cohort + retries]
  if not rows:
    rows = [(draw(hs.integers(0, 5)), "c0")]
  return rows


limits = hs.one_of(hs.none(), hs.integers(0, 6))
declared = hs.one_of(hs.none(), hs.integers(1, 6))


@settings(max_examples=150, deadline=None)
@given(
  round_ordered_logs(),
  declared,
  declared,
  limits,
  hs.integers(1, 9),
  hs.integers(1, 7),
  hs.sampled_from([None, 0, 1, 4, 8, 16, 30, 1000]),
)
def test_scan_equals_reference(rows, min_sep, max_part, limit, batch, chunk, history):
  """LogScan over random batch splits, chunkings and history budgets equals the reference."""
  rounds, codes, ids = arrays_of(rows)
  batches = [(rounds[i : i + batch], codes[i : i + batch]) for i in range(0, len(rows), batch)]
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(log_scan, "_CHUNK_ROWS", chunk)
    if history is not None:
      mp.setattr(log_scan, "_HISTORY_ROWS", history)
    scan = log_scan.LogScan(min_sep, max_part, limit)
    for r, c in batches:
      scan.update(r, c)
    stats, table = scan.finish(len(ids), ids, reread=lambda: iter(batches))
  check(stats, table, rows, min_sep, max_part, limit)


@settings(max_examples=100, deadline=None)
@given(
  hs.lists(hs.tuples(hs.integers(0, 20), hs.sampled_from("abcdefg")), min_size=1, max_size=40),
  declared,
  declared,
  limits,
)
def test_log_statistics_any_order_equals_reference_and_sorted_path(rows, min_sep, max_part, limit):
  """In-memory logs in any order: the same as the reference and as the previous (sort) auditor."""
  rounds, codes, ids = arrays_of(rows)
  stats, table = log_statistics.statistics_of_arrays(
    rounds, codes, len(ids), min_sep, max_part, ids, violation_limit=limit
  )
  check(stats, table, rows, min_sep, max_part, limit)
  old_stats, old_table = log_sort.sorted_statistics(rounds, codes, len(ids), min_sep, max_part, ids)
  assert summary(stats) == summary(old_stats)
  assert old_table.to_list()[:limit] == table.to_list()
  ordered = sorted(range(len(rows)), key=lambda i: rows[i][0])  # Round order, stable.
  stats, table = log_statistics.statistics_of_arrays(
    rounds[ordered], codes[ordered], len(ids), min_sep, max_part, ids, violation_limit=limit
  )
  assert summary(stats) == summary(old_stats)


@settings(max_examples=40, deadline=None)
@given(
  round_ordered_logs(),
  declared,
  declared,
  hs.sampled_from(["csv", "csv.gz", "parquet"]),
  hs.booleans(),
  hs.sampled_from([None, 0]),
)
def test_scan_log_file_equals_reference(
  tmp_path_factory, rows, min_sep, max_part, ext, shuffle, history
):
  """Files read in many small blocks (round ordered, or not: the fallback), then pass 2 or not."""
  if shuffle:
    rows = [rows[i] for i in np.random.default_rng(len(rows)).permutation(len(rows))]
  path = tmp_path_factory.mktemp("scan") / f"log.{ext}"
  participation_log.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(log_reader, "_CSV_BLOCK_SIZE", 64)
    if history is not None:
      mp.setattr(log_scan, "_HISTORY_ROWS", history)
    stats, table = log_statistics.statistics_of_file(
      path, min_sep=min_sep, max_participations=max_part, violation_limit=3
    )
  expected_stats, violations = reference(rows, min_sep, max_part)
  assert summary(stats) == expected_stats
  assert listed(table) == violations[:3]


def test_pathological_retries_bounded_listing():
  """A few clients in every round with many retries: counted in full, listed up to the limit."""
  rows = []
  for r in range(300):
    rows += [(r, f"n{r * 7 + i}") for i in range(7)]
    rows += [(r, f"hot{h}") for h in range(3) for _ in range(1 + (r * (h + 1)) % 5)]
  rounds, codes, ids = arrays_of(rows)
  stats, table = log_statistics.statistics_of_arrays(
    rounds, codes, len(ids), 10, 5, ids, violation_limit=4
  )
  check(stats, table, rows, 10, 5, 4)
  assert table.truncated and len(table) == 4
  assert stats.observed_max_participations == 300 and stats.observed_min_sep == 1


def test_round_beyond_scan_limit_takes_the_sort_path():
  rows = [(0, "a"), (log_scan.MAX_ROUND + 5, "a"), (3, "b")]
  rounds, codes, ids = arrays_of(rows)
  stats, table = log_statistics.statistics_of_arrays(rounds, codes, len(ids), 2, None, ids)
  assert (
    stats.observed_min_sep == log_scan.MAX_ROUND + 5 and stats.max_round == log_scan.MAX_ROUND + 5
  )


def test_second_pass_refuses_a_log_that_changed(tmp_path, monkeypatch):
  """Listing from a second pass needs the same rows; a log rewritten in between is an error."""
  path = tmp_path / "log.csv"
  rows = [(r, f"c{c}") for r in range(4) for c in range(3)]
  participation_log.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  monkeypatch.setattr(log_scan, "_HISTORY_ROWS", 0)  # Nothing kept: listing needs a second pass.
  read = participation_log.iter_participation_codes
  calls = []

  def rewrite_before_second_pass(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      participation_log.write_participation_log(path, [0, 1], ["c0", "c0"])
    return read(*args, **kwargs)

  monkeypatch.setattr(participation_log, "iter_participation_codes", rewrite_before_second_pass)
  with pytest.raises(
    participation_log.ParticipationLogError, match=f"^{path}: the log changed while it was audited"
  ):
    log_statistics.statistics_of_file(path, min_sep=5)
