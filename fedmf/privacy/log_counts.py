"""What the auditor counts in a participation log: the realized min-separation b, max
participations k, histograms and per-round prefixes over the distinct (round, client) pairs
(``LogStatistics``), and the violations of a declared schema, columnar (``ViolationTable``).

Both engines give these same types: the one-pass scan of a log in round order
(``fedmf.privacy.log_scan``) and one sort of (client, round) keys for a log in any order
(``fedmf.privacy.log_sort``); ``fedmf.privacy.log_statistics`` chooses between them. Notation:
docs/architecture.md (b is the gap |i-j|, never b-1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from fedmf.mf import resources

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


# The statistics of a log not in round order (either engine): per round, the least gap
# and most participations, their running min/max and temporaries (48 bytes), in ~6 vector steps.
_PER_ROUND_COST = resources.PerRound("per-round statistics", 48, 6.0 / resources.VECTOR_RATE)


def check_round_statistics(num_rounds: int) -> None:
  """Refuses per-round statistics over ``num_rounds`` rounds beyond --max-memory/--max-seconds."""
  _PER_ROUND_COST.check(
    num_rounds,
    f"auditing a log whose largest round is {num_rounds - 1:,} (a timestamp instead of a round?)",
  )
