"""Participation statistics of a log and its violations: what the auditor counts, and how a log not
in round order is counted (one sort of (client, round) keys).

``LogStatistics`` holds the realized min-separation b, max participations k, histograms and per-round
prefixes over the distinct (round, client) pairs; ``ViolationTable`` the violations of a declared
schema, columnar. The one-pass scan of a log in round order is ``fedmf.privacy.log_scan``; both give
the same numbers. Notation: docs/architecture.md (b is the gap |i-j|, never b-1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.privacy import participation_log

REASONS = ("min-sep", "max-participations", "duplicate")


@dataclasses.dataclass(frozen=True)
class Violation:
  client_id: str
  rounds: tuple[int, ...]
  reason: str  # One of REASONS.

  def to_dict(self) -> dict[str, Any]:
    return {"client_id": self.client_id, "rounds": list(self.rounds), "reason": self.reason}


class ViolationTable:
  """Violations stored columnar (one entry per (client, reason)); Violation objects on demand.

  Entries are ordered by client code (first appearance in the log), then reason (REASONS order).
  A million violating clients cost arrays, not a million Python objects, until listed. The table may
  list only the first entries of a longer list (``truncated``); ``counts()`` always counts them all.
  """

  def __init__(
    self,
    client_codes: np.ndarray,
    reasons: np.ndarray,
    offsets: np.ndarray,
    rounds: np.ndarray,
    client_ids: Any,
    total_counts: Optional[dict[str, int]] = None,
  ):
    self._codes = client_codes
    self._reasons = reasons
    self._offsets = offsets
    self._rounds = rounds
    self._ids = client_ids
    self._total_counts = total_counts

  @classmethod
  def build(cls, parts: list, client_ids: Any, presorted: bool = False) -> "ViolationTable":
    """Parts are (client codes, rounds, reason index), in REASONS order.

    ``presorted``: each part is already sorted by (code, round) without repeats and the parts come in
    REASONS order; then a stable sort on the code (a merge of sorted runs) replaces the lexsort.
    """
    if not parts:
      z = np.zeros(0, np.int64)
      return cls(z, z, np.zeros(1, np.int64), z, client_ids)
    c = np.concatenate([p[0] for p in parts])
    r = np.concatenate([p[1] for p in parts])
    why = np.concatenate([np.full(p[0].shape, p[2], np.int8) for p in parts])
    if presorted:
      order = np.argsort(c, kind="stable") if len(parts) > 1 else None
    else:
      order = np.lexsort((r, why, c))
    if order is not None:
      c, r, why = c[order], r[order], why[order]
    del order
    if c.size:
      change = np.empty(c.size, dtype=bool)
      change[0] = True
      np.not_equal(c[1:], c[:-1], out=change[1:])
      change[1:] |= why[1:] != why[:-1]
      first = np.flatnonzero(change)
    else:
      first = np.zeros(0, np.int64)
    offsets = np.append(first, c.size)
    return cls(
      c[first].astype(np.int64),
      why[first].astype(np.int64),
      offsets,
      r.astype(np.int64, copy=False),
      client_ids,
    )

  def __len__(self) -> int:
    return int(self._codes.shape[0])

  def _name(self, code: int) -> str:
    if self._ids is None:
      return str(code)
    v = self._ids[int(code)]
    return v.as_py() if hasattr(v, "as_py") else str(v)

  def __getitem__(self, i: int | slice):
    if isinstance(i, slice):
      return [self[j] for j in range(*i.indices(len(self)))]
    lo, hi = int(self._offsets[i]), int(self._offsets[i + 1])
    return Violation(
      self._name(self._codes[i]),
      tuple(int(x) for x in self._rounds[lo:hi]),
      REASONS[int(self._reasons[i])],
    )

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]

  def counts(self) -> dict[str, int]:
    """Violating clients per reason, listed or not."""
    if self._total_counts is not None:
      return dict(self._total_counts)
    b = np.bincount(self._reasons, minlength=len(REASONS))
    return {r: int(b[i]) for i, r in enumerate(REASONS)}

  @property
  def total(self) -> int:
    """Entries in the full list (listed or not)."""
    return sum(self.counts().values())

  @property
  def truncated(self) -> bool:
    return len(self) < self.total

  def limited(
    self, limit: Optional[int], counts: Optional[dict[str, int]] = None
  ) -> "ViolationTable":
    """The first ``limit`` entries (all when None); ``counts`` (default: this table's) counts all."""
    counts = self.counts() if counts is None else dict(counts)
    if limit is None or limit >= len(self):
      return ViolationTable(
        self._codes, self._reasons, self._offsets, self._rounds, self._ids, counts
      )
    end = int(self._offsets[limit])
    return ViolationTable(
      self._codes[:limit],
      self._reasons[:limit],
      self._offsets[: limit + 1],
      self._rounds[:end],
      self._ids,
      counts,
    )

  def to_list(self) -> list[dict[str, Any]]:
    """All entries as JSON-ready dicts (vectorized conversion)."""
    if not len(self):
      return []
    if self._ids is None:
      names = [str(c) for c in self._codes.tolist()]
    elif isinstance(self._ids, (pa.Array, pa.ChunkedArray)):
      names = self._ids.take(pa.array(self._codes)).to_pylist()
    else:
      names = [str(self._ids[c]) for c in self._codes.tolist()]
    rounds = self._rounds.tolist()
    off = self._offsets.tolist()
    why = self._reasons.tolist()
    return [
      {"client_id": name, "rounds": rounds[lo:hi], "reason": REASONS[w]}
      for name, lo, hi, w in zip(names, off, off[1:], why)
    ]


@dataclasses.dataclass(frozen=True)
class LogStatistics:
  """Participation statistics of a log (distinct (round, client) pairs unless stated).

  Attributes:
    log_rows: Rows in the log, duplicates included.
    participations: Distinct (round, client) pairs.
    clients: Distinct client ids.
    max_round: Largest round in the log.
    observed_min_sep: Minimum gap between consecutive participations of one client, None if nobody
      participated twice.
    observed_max_participations: Largest number of rounds one client joined.
    gap_values, gap_counts: Histogram of all consecutive gaps.
    participation_values, participation_counts: Histogram of participations per client.
    prefix_min_sep: [max_round+1] realized b of rounds 0..r-1 at index r-1 (-1: none yet).
    prefix_max_participations: [max_round+1] realized k of rounds 0..r-1 at index r-1.
    duplicate_rows: log_rows - participations.
    cut_off_row: The last row's 1-based number when the log's last line has no line end: a writer
      stopped mid-line may have cut it (its client id may be incomplete); None otherwise.
  """

  log_rows: int
  participations: int
  clients: int
  max_round: int
  observed_min_sep: Optional[int]
  observed_max_participations: int
  gap_values: np.ndarray
  gap_counts: np.ndarray
  participation_values: np.ndarray
  participation_counts: np.ndarray
  prefix_min_sep: np.ndarray
  prefix_max_participations: np.ndarray
  duplicate_rows: int
  cut_off_row: Optional[int] = None


# The statistics of a log not in round order (``_sorted_log_statistics``): per round, the least gap
# and most participations, their running min/max and temporaries (48 bytes), in ~6 vector steps.
_SORTED_COST = resources.PerRound("per-round statistics", 48, 6.0 / resources.VECTOR_RATE)


def _check_round_statistics(num_rounds: int) -> None:
  """Refuses per-round statistics over ``num_rounds`` rounds beyond --max-memory/--max-seconds."""
  _SORTED_COST.check(
    num_rounds,
    f"auditing a log whose largest round is {num_rounds - 1:,} (a timestamp instead of a round?)",
  )


def _sorted_keys(
  rounds: np.ndarray, codes: np.ndarray, round_bits: int, num_clients: int
) -> np.ndarray:
  """(code << round_bits) | round, sorted (uint32 when it fits: half the memory, faster sort)."""
  kdt = np.uint32 if num_clients << round_bits <= 2**32 else np.int64
  keys = np.empty(codes.shape[0], dtype=kdt)
  # Written straight into the key dtype (inputs are non-negative and fit): no temporaries.
  np.left_shift(codes, round_bits, out=keys, casting="unsafe")
  np.bitwise_or(keys, rounds, out=keys, casting="unsafe")
  keys.sort()
  return keys


def _sorted_log_statistics(
  rounds: np.ndarray,
  codes: np.ndarray,
  num_clients: int,
  declared_min_sep: Optional[int],
  declared_max_participations: Optional[int],
  client_ids: Any,
):
  """``log_statistics`` by one sort of (code, round) keys: for rows in any order (memory ~ rows).

  Everything after the sort is linear vectorized passes over the sorted keys (the violation entries
  come out already sorted by (code, round)). Used for logs not in round order, and to list the
  violations of a few clients from their rows.
  """
  rows = int(rounds.shape[0])
  if rows == 0:
    raise participation_log.ParticipationLogError("empty log (no participation rows)")
  max_round = int(rounds.max())
  R = max_round + 1
  _check_round_statistics(R)
  # The key space must cover every code (codes < num_clients for ParticipationArrays).
  code_space = max(int(num_clients), int(codes.max()) + 1)
  if code_space * R >= 2**62:
    raise FedmfUserError(f"too many (clients, rounds) to index: {num_clients} × {R}")
  # Keys (code << bits) | round: a shift and a mask split them (no integer division). Since
  # 2^bits < 2R, code_space << bits < 2^63.
  bits = max(1, (R - 1).bit_length())
  keys = _sorted_keys(rounds, codes, bits, code_space)
  dup = keys[1:] == keys[:-1]
  if dup.any():
    dup_keys = np.unique(keys[1:][dup]).astype(np.int64)
    keep = np.empty(keys.shape[0], dtype=bool)
    keep[0] = True
    np.logical_not(dup, out=keep[1:])
    keys = keys[keep]
    del keep
  else:
    dup_keys = np.zeros(0, np.int64)
  del dup
  idx_dtype = np.int32 if max(R, code_space) < 2**31 else np.int64
  uc = np.empty(keys.shape[0], dtype=idx_dtype)
  ur = np.empty(keys.shape[0], dtype=idx_dtype)
  np.right_shift(keys, keys.dtype.type(bits), out=uc, casting="unsafe")
  np.bitwise_and(keys, keys.dtype.type((1 << bits) - 1), out=ur, casting="unsafe")
  dup_c, dup_r = dup_keys >> bits, dup_keys & ((1 << bits) - 1)
  del keys
  m = int(uc.shape[0])
  same = uc[1:] == uc[:-1]
  gaps_all = ur[1:] - ur[:-1]
  gaps = gaps_all[same]
  gap_end = ur[1:][same]
  # Client runs (every code present in the dictionary occurs at least once).
  new_client = np.empty(m, dtype=bool)
  new_client[0] = True
  np.logical_not(same, out=new_client[1:])
  starts = np.flatnonzero(new_client)
  del new_client
  counts = np.diff(np.append(starts, m))
  # Histograms.
  gap_bins = np.bincount(gaps) if gaps.size else np.zeros(0, np.int64)
  gv = np.flatnonzero(gap_bins)
  part_bins = np.bincount(counts)
  pv = np.flatnonzero(part_bins)
  observed_b = int(gaps.min()) if gaps.size else None
  observed_k = int(counts.max())
  # Prefix realized (b_r, k_r): the first r rounds are rounds 0..r-1. (ufunc.at with intp indices
  # and values of the target's dtype takes numpy's fast path.)
  min_gap_at = np.full(R, np.iinfo(np.int64).max, dtype=np.int64)
  if gaps.size:
    np.minimum.at(min_gap_at, gap_end.astype(np.intp), gaps.astype(np.int64))
  del gap_end, gaps
  prefix_b = np.minimum.accumulate(min_gap_at)
  prefix_b = np.where(prefix_b == np.iinfo(np.int64).max, -1, prefix_b)
  ordinal = np.arange(1, m + 1, dtype=np.int64) - np.repeat(starts, counts)
  max_ord_at = np.zeros(R, dtype=np.int64)
  np.maximum.at(max_ord_at, ur.astype(np.intp), ordinal)
  prefix_k = np.maximum.accumulate(max_ord_at)
  del ordinal

  # Violation entries, each part sorted by (code, round) without repeats, in REASONS order.
  parts = []
  if declared_min_sep is not None:
    bad = same & (gaps_all < declared_min_sep)  # Pair (i, i+1) of one client too close.
    if bad.any():
      flag = np.zeros(m, dtype=bool)
      flag[:-1] |= bad
      flag[1:] |= bad
      parts.append((uc[flag], ur[flag], REASONS.index("min-sep")))
      del flag
    del bad
  if declared_max_participations is not None:
    over = counts > declared_max_participations
    if over.any():
      sel = np.repeat(over, counts)
      parts.append((uc[sel], ur[sel], REASONS.index("max-participations")))
  if dup_keys.size:
    parts.append((dup_c, dup_r, REASONS.index("duplicate")))
  violations = ViolationTable.build(parts, client_ids, presorted=True)
  stats = LogStatistics(
    log_rows=rows,
    participations=m,
    clients=int(num_clients),
    max_round=max_round,
    observed_min_sep=observed_b,
    observed_max_participations=observed_k,
    gap_values=gv,
    gap_counts=gap_bins[gv],
    participation_values=pv,
    participation_counts=part_bins[pv],
    prefix_min_sep=prefix_b,
    prefix_max_participations=prefix_k,
    duplicate_rows=rows - m,
  )
  return stats, violations
