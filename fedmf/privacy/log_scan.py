"""The one-pass scan of a participation log in round order (``LogScan``): statistics and
violations with memory that grows with the clients and rounds, not the rows.

``fedmf.privacy.log_statistics`` feeds it a log's rows in batches and falls back to the sort
(``fedmf.privacy.log_sort``, same results) when the rows are not in round order; docs/participation-log.md says how
the auditor reads a log; docs/benchmarks.md §2 what it costs.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fedmf.privacy import log_sort
from fedmf.privacy.log_counts import REASONS, LogStatistics, ViolationTable, check_round_statistics
from fedmf.privacy.log_format import ParticipationLogError


class NotRoundOrdered(Exception):
  """The one-pass scan does not apply: a batch goes back to an earlier round (or rounds >= 2^22)."""


# Per-client state of the scan, one uint64: last round + 1 (0: none yet; 22 bits), distinct
# participations (22 bits), two flags (a gap below the declared min-sep; a duplicate row), and the
# tag of the batch row that wrote it last (18 bits), which tells rows sharing a client apart.
_FIELD = 22
_FIELD_MASK = np.uint64((1 << _FIELD) - 1)
_COUNT_SHIFT = np.uint64(_FIELD)
_COUNT_ONE = np.uint64(1 << _FIELD)
_MIN_SEP_FLAG = np.uint64(1 << (2 * _FIELD))
_DUP_FLAG = np.uint64(1 << (2 * _FIELD + 1))
_FLAGS = _MIN_SEP_FLAG | _DUP_FLAG
_TAG_SHIFT = 2 * _FIELD + 2
_TAG_MASK = np.uint64(((1 << 64) - 1) ^ ((1 << _TAG_SHIFT) - 1))
# Rows of one update step, each with its own tag (at most 2^18). Small enough (64 bytes a row of
# cache lines: 512 KB) that the scatter and the re-gather find the gathered states in L2: 20% less
# time than whole batches.
_CHUNK_ROWS = 1 << 13
_ONE = np.uint64(1)
MAX_ROUND = (1 << _FIELD) - 2
_NO_GAP = np.iinfo(np.int64).max
# Rows of possible violators kept for listing them without a second pass (8 bytes a row).
_HISTORY_ROWS = 1 << 24


def _grown(array: np.ndarray, size: int, fill) -> np.ndarray:
  """``array`` extended with ``fill`` to at least ``size`` entries (doubling, amortized O(1))."""
  if size <= array.shape[0]:
    return array
  bigger = np.full(max(size, 2 * array.shape[0]), fill, dtype=array.dtype)
  bigger[: array.shape[0]] = array
  return bigger


class LogScan:
  """Statistics and violations of a log in one pass over its rows in round order.

  Rows (round r, client code c) arrive in batches, rounds non-decreasing. A row repeating c's last
  round is a duplicate; otherwise it is c's next participation, at gap r - last[c] when c has one.
  That is the whole computation: a per-client state (last round, count, two violation flags in one
  uint64) and per-round accumulators (least gap ending at r, most participations reached at r, the
  gap histogram), so memory grows with clients and rounds, not rows.

  A batch is one vectorized gather of its clients' states, new states computed as if every client
  appeared once, and one scatter, each new state tagged with its row: re-gathering shows which rows
  lost their write to another row of the same client. Those few rows (a client in two rounds of the
  batch, or repeated within a round) are redone from the old states, sorted by (client, row). The
  per-round accumulators are only written when a batch beats the least gap or the most
  participations so far (only their prefix minimum/maximum over rounds is used).

  Violations are counted for every client; the first ``violation_limit`` entries (clients by first
  appearance, then reason) are listed from the rows of a prefix of the clients kept on the way
  (``_HISTORY_ROWS`` at most), or from a second pass (``finish(reread=...)``) when that prefix does
  not reach far enough.

  Raises ``NotRoundOrdered`` from ``update`` when a batch starts before the previous batch's last
  round (a batch out of order within itself is sorted), or has a round above ``MAX_ROUND``.
  """

  def __init__(
    self,
    declared_min_sep: Optional[int] = None,
    declared_max_participations: Optional[int] = None,
    violation_limit: Optional[int] = None,
  ):
    self._min_sep = declared_min_sep
    self._max_participations = declared_max_participations
    self._limit = violation_limit
    self.rows = 0
    self._max_round = -1
    self._codes_seen = 0
    self._state = np.zeros(1 << 12, np.uint64)
    self._repeated = np.zeros(1 << 12, bool)
    assert _CHUNK_ROWS <= 1 << (64 - _TAG_SHIFT)
    self._tags = np.arange(_CHUNK_ROWS, dtype=np.uint64) << np.uint64(_TAG_SHIFT)
    self._least_gap_at = np.full(1 << 10, _NO_GAP, np.int64)
    self._most_count_at = np.zeros(1 << 10, np.int64)
    self._least_gap = _NO_GAP  # Over all rounds so far.
    self._most_count = 0
    self._gap_counts = np.zeros(1 << 10, np.int64)
    # Rows (codes, distinct rounds, rows per round) of the clients with code < _history_below
    # (None: every client).
    self._keep_history = violation_limit != 0
    self._history_below: Optional[int] = None
    self._history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    self._history_rows = 0

  # -- one batch ---------------------------------------------------------------------------------

  def update(self, rounds: np.ndarray, codes: np.ndarray, num_codes: Optional[int] = None) -> None:
    """Adds a batch of rows: int rounds (non-negative) and int client codes (non-negative).

    ``num_codes`` (an upper bound of the codes + 1, e.g. the index size) saves a pass over codes.
    """
    n = int(rounds.shape[0])
    if not n:
      return
    rounds = np.asarray(rounds, dtype=np.int64)
    codes = np.asarray(codes)
    step = np.diff(rounds)
    if n > 1 and step.min() < 0:
      order = np.argsort(rounds, kind="stable")
      rounds, codes = rounds[order], codes[order]
      step = np.diff(rounds)
    if rounds[0] < 0:
      raise ParticipationLogError(f"negative round {int(rounds[0])}")
    if rounds[0] < self._max_round or rounds[-1] > MAX_ROUND:
      if rounds[-1] > MAX_ROUND:  # The sorted path allocates per round: refuse it now if too big.
        check_round_statistics(int(rounds[-1]) + 1)
      raise NotRoundOrdered()
    self._reserve(
      int(codes.max()) + 1 if num_codes is None else int(num_codes), int(rounds[-1]) + 1
    )
    self.rows += n
    self._max_round = int(rounds[-1])
    round_starts = np.flatnonzero(step) + 1
    if self._keep_history:
      self._remember(rounds, codes, round_starts)
    for lo in range(0, n, _CHUNK_ROWS):
      hi = min(n, lo + _CHUNK_ROWS)
      inside = round_starts[
        np.searchsorted(round_starts, lo, "right") : np.searchsorted(round_starts, hi, "left")
      ]
      self._update_chunk(rounds[lo:hi], codes[lo:hi], inside - lo)

  def _reserve(self, num_codes: int, num_rounds: int) -> None:
    self._codes_seen = max(self._codes_seen, num_codes)
    self._state = _grown(self._state, num_codes, 0)
    self._repeated = _grown(self._repeated, num_codes, False)
    self._least_gap_at = _grown(self._least_gap_at, num_rounds, _NO_GAP)
    self._most_count_at = _grown(self._most_count_at, num_rounds, 0)

  def _count_gaps(self, gaps: np.ndarray) -> int:
    """Adds gaps (0: none) to the histogram; the least nonzero gap (``_NO_GAP`` if none)."""
    binned = np.bincount(gaps.view(np.int64))
    binned[0] = 0
    self._gap_counts = _grown(self._gap_counts, binned.shape[0], 0)
    self._gap_counts[: binned.shape[0]] += binned
    nonzero = np.flatnonzero(binned)
    return int(nonzero[0]) if nonzero.size else _NO_GAP

  def _update_chunk(self, rounds: np.ndarray, codes: np.ndarray, round_starts: np.ndarray) -> None:
    """At most ``_CHUNK_ROWS`` rows in round order (``round_starts``: where the round changes)."""
    n = rounds.shape[0]
    old = self._state[codes]
    last = old & _FIELD_MASK  # Previous round + 1, 0 for none.
    r1 = rounds.view(np.uint64) + _ONE  # Rounds are >= 0.
    fresh = last != r1  # Not a duplicate of the client's previous round.
    new = old & ~(_TAG_MASK | _FIELD_MASK)
    new |= r1
    np.add(new, _COUNT_ONE, out=new, where=fresh)
    gap = np.zeros(n, np.uint64)  # r - previous round; 0 for a first participation or a duplicate.
    np.subtract(r1, last, out=gap, where=last != 0)
    if self._min_sep is not None:
      too_close = (gap - _ONE) < np.uint64(self._min_sep - 1)  # 0 wraps around: not too close.
      if too_close.any():
        np.bitwise_or(new, _MIN_SEP_FLAG, out=new, where=too_close)
    if not fresh.all():
      np.bitwise_or(new, _DUP_FLAG, out=new, where=~fresh)
    new |= self._tags[:n]
    self._state[codes] = new
    lost = self._state[codes] != new
    least_before, most_before = self._least_gap, self._most_count
    if lost.any():
      # Clients with several rows here: drop their rows from the vectorized result, redo them.
      self._repeated[codes[lost]] = True
      repeated = self._repeated[codes]
      self._repeated[codes[lost]] = False
      gap[repeated] = 0
      self._update_runs(rounds[repeated], codes[repeated], old[repeated])
    least = self._count_gaps(gap)
    most = int(np.max(new & ~(_TAG_MASK | _FLAGS)) >> _COUNT_SHIFT)
    self._least_gap = min(self._least_gap, least)
    self._most_count = max(self._most_count, most)
    if least >= least_before and most <= most_before:
      return  # The prefix (b_r, k_r) stay flat over this chunk.
    # Per round (rounds are sorted, so reduce each round's run of rows). A repeated client's count
    # here is at most its true count at that round, which _update_runs has recorded.
    starts = np.concatenate([[0], round_starts])
    at = rounds[starts]
    if least < least_before:
      per_round = np.minimum.reduceat(np.where(gap > 0, gap, _NO_GAP).astype(np.int64), starts)
      np.minimum(self._least_gap_at[at], per_round, out=per_round)
      self._least_gap_at[at] = per_round
    if most > most_before:
      counts = ((new >> _COUNT_SHIFT) & _FIELD_MASK).astype(np.int64)
      per_round = np.maximum.reduceat(counts, starts)
      np.maximum(self._most_count_at[at], per_round, out=per_round)
      self._most_count_at[at] = per_round

  def _update_runs(self, rounds: np.ndarray, codes: np.ndarray, old: np.ndarray) -> None:
    """Rows of clients appearing more than once in a chunk (``old``: their states before it)."""
    order = np.argsort(codes, kind="stable")  # By client, then row (so by round).
    codes, rounds, old = codes[order], rounds[order], old[order]
    m = codes.shape[0]
    first = np.ones(m, dtype=bool)
    first[1:] = codes[1:] != codes[:-1]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, m))
    ends = starts + sizes - 1
    old = old[starts]
    prev = np.empty(m, dtype=np.int64)  # Previous round + 1 of the client (0: none).
    prev[1:] = rounds[:-1] + 1
    prev[starts] = (old & _FIELD_MASK).astype(np.int64)
    fresh = prev != rounds + 1
    cumulative = np.cumsum(fresh)
    base = ((old >> _COUNT_SHIFT) & _FIELD_MASK).astype(np.int64) - (
      cumulative[starts] - fresh[starts]
    )
    counts = cumulative + np.repeat(base, sizes)
    gap = np.where((prev != 0) & fresh, rounds + 1 - prev, 0)
    flags = np.zeros(m, dtype=np.uint64)
    flags[~fresh] = _DUP_FLAG
    if self._min_sep is not None:
      flags[(gap > 0) & (gap < self._min_sep)] |= _MIN_SEP_FLAG
    # The run's final state: its last row's round and count, with the flags of any of its rows.
    flags = np.bitwise_or.reduceat(flags, starts) | (old & _FLAGS)
    self._state[codes[starts]] = (
      flags
      | (rounds[ends] + 1).astype(np.uint64)
      | (counts[ends].astype(np.uint64) << _COUNT_SHIFT)
    )
    # Few rows: record every round's values (the caller updates the running least and most).
    self._least_gap = min(self._least_gap, self._count_gaps(gap.astype(np.uint64)))
    self._most_count = max(self._most_count, int(counts.max()))
    has_gap = gap > 0
    np.minimum.at(self._least_gap_at, rounds[has_gap], gap[has_gap])
    np.maximum.at(self._most_count_at, rounds, counts)

  def _remember(self, rounds: np.ndarray, codes: np.ndarray, round_starts: np.ndarray) -> None:
    """Keeps the rows of clients below ``_history_below``, within ``_HISTORY_ROWS`` rows."""
    if self._history_below is not None:
      keep = codes < self._history_below
      rounds, codes = rounds[keep], codes[keep]
      round_starts = np.flatnonzero(rounds[1:] != rounds[:-1]) + 1
    if not rounds.shape[0]:
      return
    starts = np.concatenate([[0], round_starts])
    self._history.append(
      (
        codes.astype(np.int32, copy=False),
        rounds[starts].astype(np.int32),
        np.diff(np.append(starts, rounds.shape[0])).astype(np.int32),
      )
    )
    self._history_rows += int(rounds.shape[0])
    if self._history_rows > _HISTORY_ROWS:
      # Keep the clients with the smallest codes whose rows fill at most half the budget.
      per_client = np.bincount(np.concatenate([c for c, _, _ in self._history]))
      within = np.flatnonzero(np.cumsum(per_client) > _HISTORY_ROWS // 2)
      self._history_below = int(within[0]) if within.size else per_client.shape[0]
      kept = []
      for c, at, run in self._history:
        r = np.repeat(at, run)
        keep = c < self._history_below
        if keep.any():
          c, r = c[keep], r[keep]
          starts = np.concatenate([[0], np.flatnonzero(r[1:] != r[:-1]) + 1])
          kept.append((c, r[starts], np.diff(np.append(starts, r.shape[0])).astype(np.int32)))
      self._history = kept
      self._history_rows = sum(int(c.shape[0]) for c, _, _ in kept)

  # -- the result --------------------------------------------------------------------------------

  def finish(self, num_clients: int, client_ids: Any = None, reread=None):
    """(LogStatistics, ViolationTable) of the rows so far.

    Args:
      num_clients: Distinct clients (codes 0..num_clients-1; codes never seen count as clients).
      client_ids: Names for the violations (``client_ids[code]``); codes when None.
      reread: A callable returning the batches (rounds, codes) again, used only when the rows of a
        listed violator were not kept. Without it, such violations are counted, not listed.
    """
    if self.rows == 0:
      raise ParticipationLogError("empty log (no participation rows)")
    space = max(int(num_clients), self._codes_seen)
    self._state = _grown(self._state, space, 0)
    state = self._state[:space]
    counts = ((state >> _COUNT_SHIFT) & _FIELD_MASK).astype(np.int64)
    participations = int(counts.sum())
    part_bins = np.bincount(counts[counts > 0])
    pv = np.flatnonzero(part_bins)
    gv = np.flatnonzero(self._gap_counts)
    num_rounds = self._max_round + 1
    prefix_b = np.minimum.accumulate(self._least_gap_at[:num_rounds])
    prefix_b[prefix_b == _NO_GAP] = -1
    stats = LogStatistics(
      log_rows=self.rows,
      participations=participations,
      clients=int(num_clients),
      max_round=self._max_round,
      observed_min_sep=int(gv[0]) if gv.size else None,
      observed_max_participations=int(counts.max()),
      gap_values=gv,
      gap_counts=self._gap_counts[gv],
      participation_values=pv,
      participation_counts=part_bins[pv],
      prefix_min_sep=prefix_b,
      prefix_max_participations=np.maximum.accumulate(self._most_count_at[:num_rounds]),
      duplicate_rows=self.rows - participations,
    )
    return stats, self._violations(state, counts, space, client_ids, reread)

  def _violations(self, state, counts, space, client_ids, reread) -> ViolationTable:
    flagged = {
      "min-sep": state & _MIN_SEP_FLAG if self._min_sep is not None else None,
      "max-participations": counts > self._max_participations
      if self._max_participations is not None
      else None,
      "duplicate": state & _DUP_FLAG,
    }
    entries = np.zeros(space, dtype=np.int64)
    totals = {}
    for reason in REASONS:
      flags = flagged[reason]
      totals[reason] = int(np.count_nonzero(flags)) if flags is not None else 0
      if flags is not None:
        entries += flags.astype(bool)
    violators = np.flatnonzero(entries)
    if self._limit is not None:  # The clients whose first entry is among the first `limit`.
      before = np.cumsum(entries[violators]) - entries[violators]
      violators = violators[before < self._limit]
    unlisted = ViolationTable.build([], client_ids).limited(None, totals)
    if not violators.size:
      return unlisted
    wanted = np.zeros(space, dtype=bool)
    wanted[violators] = True
    from_history = self._keep_history and (
      self._history_below is None or int(violators[-1]) < self._history_below
    )
    if from_history:
      pairs = ((np.repeat(at, run), c) for c, at, run in self._history)
    elif reread is not None:
      pairs = reread()
    else:
      return unlisted
    rows_r, rows_c = [], []
    seen = 0
    for r, c in pairs:
      seen += int(r.shape[0])
      keep = wanted[c]
      if keep.any():
        rows_r.append(np.asarray(r)[keep])
        rows_c.append(np.asarray(c)[keep])
    if not from_history and seen != self.rows:  # The second pass must see the same rows.
      raise ParticipationLogError(
        f"the log changed while it was audited ({self.rows} rows, then {seen})"
      )
    _, table = log_sort.sorted_statistics(
      np.concatenate(rows_r).astype(np.int64),
      np.concatenate(rows_c).astype(np.int64),
      space,
      self._min_sep,
      self._max_participations,
      client_ids,
    )
    return table.limited(self._limit, totals)
