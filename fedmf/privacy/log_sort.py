"""The statistics of a participation log in any order, by one sort of (client, round) keys
(memory ~ rows): ``sorted_statistics``.

The engine for logs not in round order, and for listing the violations of a few clients from their
rows (``fedmf.privacy.log_scan`` does that after its scan). Its results equal the one-pass scan's.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.privacy import log_format
from fedmf.privacy.log_counts import (
  REASONS,
  LogStatistics,
  ViolationTable,
  check_round_statistics,
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


def sorted_statistics(
  rounds: np.ndarray,
  codes: np.ndarray,
  num_clients: int,
  declared_min_sep: Optional[int],
  declared_max_participations: Optional[int],
  client_ids: Any,
):
  """(LogStatistics, ViolationTable) by one sort of (code, round) keys, for rows in any order.

  Everything after the sort is linear vectorized passes over the sorted keys (the violation entries
  come out already sorted by (code, round)). Used for logs not in round order, and to list the
  violations of a few clients from their rows.
  """
  rows = int(rounds.shape[0])
  if rows == 0:
    raise log_format.ParticipationLogError("empty log (no participation rows)")
  max_round = int(rounds.max())
  R = max_round + 1
  check_round_statistics(R)
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
