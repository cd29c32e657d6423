"""The post-hoc min-separation auditor: participation log → realized (b, k) → sensitivity → ρ, ε.

In cross-device FL a device-side timer enforces the separation, so the true min-separation b and max
participations k are known only after training (BLT §1, §5, App. C; BandMF App. K). The auditor reads
the log (``fedmf.privacy.participation_log``), computes the realized b (minimum gap between a client's consecutive
participations; None when nobody participated twice, i.e. single participation) and k, the
violations of declared limits, and the privacy claim the log supports, using
``fedmf.mf.evaluation.sensitivity`` and ``fedmf.privacy.accounting``. Notation: docs/architecture.md
(b is the gap |i-j|, never b-1).

Duplicate (round, client_id) rows are never merged silently: they are reported as ``duplicate``
violations and ``claim_covers_all_clients`` becomes false. The realized (b, k) and the claim are
computed on the distinct (round, client) pairs, so they do not cover a client whose update may have
been summed twice in one round.

A log is streamed in one pass in round order (``LogScan``), vectorized over batches of rows, with
memory that grows with the clients and rounds, not the rows; violations are counted in full and
listed up to a limit. Logs not in round order are sorted in memory instead. Sensitivities are
evaluated once per distinct (rounds, b, k), shared by the claims and the per-round ε curve.

Each claim is a single Gaussian mechanism (μ = s/σ, no amplification), so its ε is by default the
exact analytic Gaussian curve's (Balle & Wang 2018, Thm. 8), the same as the per-round ε curve's;
dp_accounting's PLD (``accountant='pld'``) is a cross-check and is imported only then.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
import os
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from fedmf.privacy import accounting
from fedmf.privacy import curve as curve_lib
from fedmf.privacy import participation_log
from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.mf.schema import ParticipationSchema

logger = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class DeclaredClaim:
  """The claim of the declared schema: what the run promised, which holds only if the log complies."""

  min_sep: Optional[int]
  max_participations: Optional[int]
  accounting: accounting.GaussianAccounting

  def to_dict(self) -> dict[str, Any]:
    a = self.accounting
    return {
      "min_sep": self.min_sep,
      "max_participations": self.max_participations,
      "sensitivity": a.sensitivity,
      "sensitivity_method": a.sensitivity_method,
      "sensitivity_algorithm": a.sensitivity_algorithm,
      "rho": a.rho,
      "epsilon": a.epsilon,
    }


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The one privacy statement a log supports, and what a strict audit checks.

  Attributes:
    guarantee: True when an (ε, δ) guarantee holds (for every client but ``uncovered_clients``).
    statement: That statement in one paragraph, derived from the log: the realized participation,
      never a declared schema the log violates.
    declared_holds: Whether the log complies with the declared schema (None: nothing declared).
    violating_clients: Clients violating the declared min-sep or max participations.
    uncovered_clients: Clients with duplicate (round, client_id) rows: no claim covers them.
    failures: Why ``fedmf audit --strict`` fails, one short phrase each (empty: it passes).
  """

  guarantee: bool
  statement: str
  declared_holds: Optional[bool]
  violating_clients: int
  uncovered_clients: int
  failures: tuple[str, ...]

  @property
  def passed(self) -> bool:
    return not self.failures


def _realized_in_words(b: Optional[int], k: int, n: int) -> str:
  if b is None or k <= 1:
    return f"each client in at most one of the n = {n} rounds"
  return f"min-separation b = {b} and at most k = {k} participations per client over n = {n} rounds"


def _declared_in_words(min_sep: Optional[int], max_participations: Optional[int]) -> str:
  parts = []
  if min_sep is not None:
    parts.append(f"b >= {min_sep}")
  if max_participations is not None:
    parts.append(f"k <= {max_participations}")
  return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """Everything the auditor computes; ``to_dict()`` is the ``--json`` object.

  ``max_epsilon`` is the budget a strict audit checks the realized ε against (None: no budget);
  ``notes`` say where the inputs came from and what the run was (e.g. a cheap simulation).
  """

  log: str
  strategy: dict[str, Any]
  rounds: int
  rounds_source: str  # 'given' or 'inferred'
  stats: LogStatistics
  violations: "ViolationTable"
  realized: accounting.GaussianAccounting
  declared: Optional[DeclaredClaim]
  warnings: tuple[str, ...]
  curve: Optional[curve_lib.EpsilonCurve] = None
  max_epsilon: Optional[float] = None
  notes: tuple[str, ...] = ()

  @property
  def claim_covers_all_clients(self) -> bool:
    # A cut-off last line may hold part of another client's id: that client's rows are incomplete.
    return self.stats.duplicate_rows == 0 and self.stats.cut_off_row is None

  @property
  def no_noise(self) -> bool:
    """σ = 0: trained without DP, so no ε holds."""
    return self.realized.noise_multiplier == 0

  def violation_counts(self) -> dict[str, int]:
    return self.violations.counts()

  def verdict(self) -> Verdict:
    """The privacy statement the log supports (see ``Verdict``)."""
    s = self.stats
    a = self.realized
    counts = self.violation_counts()
    violating = counts["min-sep"] + counts["max-participations"]
    uncovered = counts["duplicate"]
    declared_holds = None if self.declared is None else violating == 0
    realized = _realized_in_words(s.observed_min_sep, s.observed_max_participations, self.rounds)
    failures = []
    if violating:
      failures.append(f"{violating} clients violate the declared schema")
    if uncovered:
      failures.append(f"{uncovered} clients have duplicate (round, client_id) rows")
    if s.cut_off_row is not None:
      failures.append(
        f"the log's last line (row {s.cut_off_row}) has no line end: it may be cut off"
      )
    if self.no_noise:
      guarantee = False
      statement = (
        "No privacy guarantee: the noise multiplier is 0, so the run was trained without "
        "differential privacy and no epsilon holds for any client."
      )
      failures.append("no privacy guarantee (noise multiplier 0)")
    elif a.sensitivity_method == "lower-bound":
      guarantee = False
      statement = (
        f"No privacy guarantee: the sensitivity is only a lower bound, so epsilon "
        f"{a.epsilon:.4g} is optimistic, not a guarantee (audit with --sensitivity auto)."
      )
      failures.append("no privacy guarantee (the sensitivity is a lower bound)")
    else:
      guarantee = True
      who = (
        "every client in the log"
        if not uncovered
        else f"every client in the log except the {uncovered} clients with duplicate "
        "(round, client_id) rows, whose update may have been summed twice in a round: no claim "
        "holds for them"
      )
      if s.cut_off_row is not None:
        who += (
          f" (but not for the client of the last line, row {s.cut_off_row}, which has no line "
          "end: its id may be cut off)"
        )
      statement = (
        f"({a.epsilon:.4g}, {a.delta:g})-DP (rho-zCDP with rho = {a.rho:.4g}) for {who}, "
        f"under the participation the log shows: {realized}."
      )
      if self.declared is not None:
        declared = _declared_in_words(self.declared.min_sep, self.declared.max_participations)
        if violating:
          statement = (
            f"The log VIOLATES the declared schema ({declared}): {violating} clients "
            f"({counts['min-sep']} below the min-separation, {counts['max-participations']} "
            f"above the max participations). The declared epsilon "
            f"{self.declared.accounting.epsilon:.4g} does NOT hold. What holds is {statement}"
          )
        else:
          statement += (
            f" It complies with the declared schema ({declared}), whose epsilon "
            f"{self.declared.accounting.epsilon:.4g} holds too."
          )
    if self.max_epsilon is not None and guarantee and a.epsilon > self.max_epsilon:
      failures.append(f"epsilon {a.epsilon:.4g} exceeds --max-epsilon {self.max_epsilon:g}")
    return Verdict(
      guarantee=guarantee,
      statement=statement,
      declared_holds=declared_holds,
      violating_clients=violating,
      uncovered_clients=uncovered,
      failures=tuple(failures),
    )

  def to_dict(self) -> dict[str, Any]:
    s = self.stats
    a = self.realized
    v = self.verdict()
    return {
      "log": self.log,
      "strategy": self.strategy,
      "rounds": self.rounds,
      "rounds_source": self.rounds_source,
      "clients": s.clients,
      "participations": s.participations,
      "log_rows": s.log_rows,
      "duplicate_rows": s.duplicate_rows,
      "cut_off_row": s.cut_off_row,
      "observed_min_sep": s.observed_min_sep,
      "observed_max_participations": s.observed_max_participations,
      "gap_histogram": {"gap": s.gap_values.tolist(), "count": s.gap_counts.tolist()},
      "participations_histogram": {
        "participations": s.participation_values.tolist(),
        "clients": s.participation_counts.tolist(),
      },
      "violations": self.violations.to_list(),
      "violation_counts": self.violation_counts(),
      # True when "violations" lists only the first entries (see audit_log's violation_limit);
      # "violation_counts" counts them all.
      "violations_truncated": self.violations.truncated,
      "claim_covers_all_clients": self.claim_covers_all_clients,
      # The one statement the log supports (docs: the realized participation, never a declared
      # schema it violates); "epsilon" and "rho" are infinite when there is no guarantee (σ = 0).
      "privacy_guarantee": v.guarantee,
      "statement": v.statement,
      "declared_holds": v.declared_holds,
      "sensitivity": a.sensitivity,
      "sensitivity_method": a.sensitivity_method,
      "sensitivity_algorithm": a.sensitivity_algorithm,
      "rho": a.rho,
      "epsilon": a.epsilon,
      "delta": a.delta,
      "noise_multiplier": a.noise_multiplier,
      "accountant": a.accountant,
      "declared": self.declared.to_dict() if self.declared else None,
      "max_epsilon": self.max_epsilon,
      "strict": {"passed": v.passed, "failures": list(v.failures)},
      "notes": list(self.notes),
      "warnings": list(self.warnings),
    }


# ---------------------------------------------------------------------------------------------------
# Statistics.


# Per-round memory of the statistics of a log not in round order (``_sorted_log_statistics``: the
# least gap and most participations at each round, their running min/max, temporaries), and of the
# ε curve (b_r, k_r, sensitivities, methods, ρ, ε and the temporaries of the Gaussian curve).
_SORTED_BYTES_PER_ROUND = 48
_CURVE_BYTES_PER_ROUND = 160
# The curve walks its rounds in Python (methods, the CSV lines of the report): about 3 steps a round.
_CURVE_STEPS_PER_ROUND = 3


def _check_round_statistics(num_rounds: int) -> None:
  """Refuses per-round statistics over ``num_rounds`` rounds beyond --max-memory/--max-seconds."""
  resources.check(
    resources.Cost.of(
      f"per-round statistics of {num_rounds:,} rounds",
      _SORTED_BYTES_PER_ROUND * float(num_rounds),
      6.0 * num_rounds / resources.VECTOR_RATE,
    ),
    f"auditing a log whose largest round is {num_rounds - 1:,} (a timestamp instead of a round?)",
  )


def _check_curve(num_rounds: int) -> None:
  """Refuses the per-round ε curve of the report over ``num_rounds`` rounds beyond the limits."""
  resources.check(
    resources.Cost.of(
      f"the per-round epsilon curve of {num_rounds:,} rounds",
      _CURVE_BYTES_PER_ROUND * float(num_rounds),
      _CURVE_STEPS_PER_ROUND * num_rounds / resources.PYTHON_RATE,
    ),
    f"the report's epsilon curve over n = {num_rounds:,} rounds",
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
  declared_min_sep: Optional[int] = None,
  declared_max_participations: Optional[int] = None,
  client_ids: Any = None,
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


class _NotRoundOrdered(Exception):
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

  Raises ``_NotRoundOrdered`` from ``update`` when a batch starts before the previous batch's last
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
      raise participation_log.ParticipationLogError(f"negative round {int(rounds[0])}")
    if rounds[0] < self._max_round or rounds[-1] > MAX_ROUND:
      if rounds[-1] > MAX_ROUND:  # The sorted path allocates per round: refuse it now if too big.
        _check_round_statistics(int(rounds[-1]) + 1)
      raise _NotRoundOrdered()
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
      raise participation_log.ParticipationLogError("empty log (no participation rows)")
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
      raise participation_log.ParticipationLogError(
        f"the log changed while it was audited ({self.rows} rows, then {seen})"
      )
    _, table = _sorted_log_statistics(
      np.concatenate(rows_r).astype(np.int64),
      np.concatenate(rows_c).astype(np.int64),
      space,
      self._min_sep,
      self._max_participations,
      client_ids,
    )
    return table.limited(self._limit, totals)


_SCAN_CHUNK_ROWS = 1 << 20


def _prefetched(items, depth: int = 3):
  """Iterates ``items`` with a background thread computing up to ``depth`` items ahead.

  Exceptions of the producer are re-raised here; leaving the loop early stops the producer.
  """
  import queue  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  buffer: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()
  done = object()

  def produce():
    try:
      for item in items:
        while not stop.is_set():
          try:
            buffer.put((item, None), timeout=0.1)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
      buffer.put((done, None))
    except BaseException as e:  # pylint: disable=broad-except
      buffer.put((done, e))
    finally:
      if hasattr(items, "close"):
        items.close()  # Closes the log file now, not when garbage collected.

  worker = threading.Thread(target=produce, name="fedmf-log-reader", daemon=True)
  worker.start()
  try:
    while True:
      item, error = buffer.get()
      if item is done:
        if error is not None:
          raise error
        return
      yield item
  finally:
    stop.set()
    while worker.is_alive():  # Unblock a producer waiting on a full buffer.
      try:
        buffer.get(timeout=0.1)
      except queue.Empty:
        pass
    worker.join()


def log_statistics(
  rounds: np.ndarray,
  codes: np.ndarray,
  num_clients: int,
  declared_min_sep: Optional[int] = None,
  declared_max_participations: Optional[int] = None,
  client_ids: Any = None,
  *,
  violation_limit: Optional[int] = None,
):
  """Statistics and violations of a log given as rounds + client codes (``ParticipationArrays``).

  Rows in round order (as the log writer produces them) take the one-pass ``LogScan``; other logs
  one sort of (code, round) keys. Same results either way.

  Args:
    violation_limit: List at most this many violation entries (all when None); all are counted.

  Returns:
    (LogStatistics, ViolationTable). Violations name clients through ``client_ids[code]``
    (a pyarrow array or sequence; codes themselves when None).
  """
  rows = int(rounds.shape[0])
  if rows == 0:
    raise participation_log.ParticipationLogError("empty log (no participation rows)")

  def chunks():
    for lo in range(0, rows, _SCAN_CHUNK_ROWS):
      yield rounds[lo : lo + _SCAN_CHUNK_ROWS], codes[lo : lo + _SCAN_CHUNK_ROWS]

  scan = LogScan(declared_min_sep, declared_max_participations, violation_limit)
  try:
    for r, c in chunks():
      scan.update(r, c)
  except _NotRoundOrdered:
    stats, table = _sorted_log_statistics(
      rounds, codes, num_clients, declared_min_sep, declared_max_participations, client_ids
    )
    return stats, table.limited(violation_limit)
  return scan.finish(num_clients, client_ids, reread=chunks)


# ---------------------------------------------------------------------------------------------------
# The audit.


def _positive_int_or_none(value: Any, what: str) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or int(value) != value or value < 1:
    raise FedmfUserError(f"{what} must be an integer >= 1, got {value!r}")
  return int(value)


DEFAULT_VIOLATION_LIMIT = 10_000
# PLD accounting discretizes the privacy loss of the Gaussian on a grid (dp_accounting's default
# interval 1e-4) of about 2e4 mu (10 + mu / 2) points, ~85 bytes each at peak: 0.5 GB at mu = 9,
# 1.3 GB at mu = 20, 28 GB for a log with a client in all 2000 rounds (mu ~ 180; it was killed).
# Above this many points (mu ~ 24, epsilon in the hundreds) the exact analytic Gaussian curve gives
# epsilon instead.
_PLD_MAX_POINTS = 20_000_000


def _pld_grid_points(mu: float) -> float:
  """Grid points of dp_accounting's PLD of one Gaussian with sensitivity / sigma = mu."""
  from dp_accounting.pld import privacy_loss_mechanism  # pylint: disable=g-import-not-at-top

  points = 0.0
  for adjacency in (
    privacy_loss_mechanism.AdjacencyType.REMOVE,
    privacy_loss_mechanism.AdjacencyType.ADD,
  ):
    bounds = privacy_loss_mechanism.GaussianPrivacyLoss(
      1.0 / mu, sensitivity=1.0, adjacency_type=adjacency
    ).connect_dots_bounds()
    points += (bounds.epsilon_upper - bounds.epsilon_lower) / accounting.PLD_VALUE_DISCRETIZATION
  return points


def _account(
  sens: Any, sigma: float, delta: float, accountant: str, label: str, warnings: list[str]
) -> accounting.GaussianAccounting:
  """ρ and ε of a claim with known sensitivity; the analytic curve when PLD would not fit.

  σ = 0 (trained without DP) has no guarantee: ρ = ε = inf, accountant 'none'.
  """
  if sigma == 0:
    return accounting.GaussianAccounting(
      sensitivity=sens.value,
      sensitivity_method=sens.method,
      sensitivity_algorithm=sens.algorithm,
      noise_multiplier=0.0,
      rho=math.inf,
      epsilon=math.inf,
      delta=delta,
      accountant="none",
    )
  if accountant == "pld" and sens.value > 0:
    points = _pld_grid_points(sens.value / sigma)
    if points > _PLD_MAX_POINTS:
      warnings.append(
        f"the {label} claim's PLD accounting would need {points / 1e6:.0f}M grid points "
        f"(mu = sensitivity / sigma = {sens.value / sigma:.3g}): its epsilon is from the exact "
        "analytic Gaussian curve instead, which PLD only approximates from above"
      )
      accountant = "analytic"
  return accounting.account_estimate(sens, sigma, delta, accountant)


def _audit(
  stats: LogStatistics,
  violations: ViolationTable,
  strategy: Any,
  sigma: float,
  delta: float,
  *,
  rounds: Optional[int],
  min_sep: Optional[int],
  max_participations: Optional[int],
  method: str,
  accountant: str,
  curve: bool,
  log_name: str,
  max_epsilon: Optional[float] = None,
  notes: tuple[str, ...] = (),
) -> AuditResult:
  """The claims a log's statistics support (the accounting half of ``audit_log``)."""
  warnings: list[str] = []
  if rounds is None:
    n = stats.max_round + 1
    source = "inferred"
    warnings.append(
      f"--rounds not given: assuming n = max round + 1 = {n}; rounds released after the last "
      "logged participation would add to the privacy cost"
    )
  else:
    n = rounds
    source = "given"
    if stats.max_round >= n:
      raise FedmfUserError(
        f"the log has a participation in round {stats.max_round}, but --rounds is {n}"
      )
  strategy.check_horizon(n)
  if curve and sigma > 0:
    _check_curve(n)
  if stats.duplicate_rows:
    warnings.append(
      f"{stats.duplicate_rows} duplicate (round, client_id) rows: those clients' updates may have "
      "been summed twice, and the claim does not cover them"
    )
  if stats.cut_off_row is not None:
    warnings.append(
      f"the log's last line (row {stats.cut_off_row}) has no line end: a writer stopped mid-line "
      "may have cut it, so its client id may be part of another client's, whose participation the "
      "claim then does not cover (the row is counted as it reads)"
    )
  if sigma == 0:
    warnings.append("noise multiplier 0: trained without DP, so no privacy guarantee holds")
  # One sensitivity evaluation per distinct (rounds, b, k): the realized claim is also the ε curve's
  # last point.
  sensitivities: dict[tuple[int, Optional[int], int], Any] = {}

  def sensitivity(r: int, b: Optional[int], k: Optional[int]):
    return curve_lib.cached_sensitivity(
      strategy, ParticipationSchema(r, b, k), method, sensitivities
    )

  k_obs = stats.observed_max_participations
  b_obs = stats.observed_min_sep
  realized = _account(
    sensitivity(n, b_obs if k_obs > 1 else None, k_obs),
    sigma,
    delta,
    accountant,
    "realized",
    warnings,
  )
  declared = None
  if min_sep is not None or max_participations is not None:
    d = _account(
      sensitivity(n, min_sep, max_participations), sigma, delta, accountant, "declared", warnings
    )
    declared = DeclaredClaim(min_sep, max_participations, d)
    counts = violations.counts()
    if counts["min-sep"] or counts["max-participations"]:
      warnings.append(
        f"the log violates the declared limits ({counts['min-sep']} min-sep, "
        f"{counts['max-participations']} max-participations client violations): the declared "
        "claim does not hold; the realized claim does"
      )
  for acc, label in (
    (realized, "realized"),
    (declared.accounting if declared else None, "declared"),
  ):
    if acc is not None and acc.sensitivity_method == "lower-bound":
      warnings.append(f"the {label} sensitivity is a LOWER bound: the epsilon is not a guarantee")
  eps_curve = None
  if curve and sigma > 0:  # Without noise there is no ε to follow.
    b_r = np.full(n, -1, dtype=np.int64)
    k_r = np.zeros(n, dtype=np.int64)
    m = min(n, stats.prefix_min_sep.shape[0])
    b_r[:m] = stats.prefix_min_sep[:m]
    k_r[:m] = stats.prefix_max_participations[:m]
    if n > m:  # Released rounds after the last logged participation.
      b_r[m:] = b_r[m - 1]
      k_r[m:] = k_r[m - 1]
    eps_curve = curve_lib.epsilon_curve(
      strategy, b_r, k_r, sigma, delta, method=method, sensitivities=sensitivities
    )
  strategy_info = {"mechanism": strategy.mechanism, "description": strategy.describe()}
  if strategy.horizon is not None:
    strategy_info["n"] = int(strategy.horizon)
  return AuditResult(
    log=log_name,
    strategy=strategy_info,
    rounds=n,
    rounds_source=source,
    stats=stats,
    violations=violations,
    realized=realized,
    declared=declared,
    warnings=tuple(warnings),
    curve=eps_curve,
    max_epsilon=max_epsilon,
    notes=tuple(notes),
  )


def validate_audit_noise_multiplier(noise_multiplier: Any) -> float:
  """σ >= 0: 0 is a run without DP (audited for its participation, with no guarantee)."""
  if (
    isinstance(noise_multiplier, numbers.Real)
    and not isinstance(noise_multiplier, bool)
    and noise_multiplier == 0
  ):
    return 0.0
  return accounting.validate_noise_multiplier(noise_multiplier)


def _validated(
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  rounds,
  min_sep,
  max_participations,
  *,
  method: str = "auto",
  curve: bool = False,
  max_epsilon: Optional[float] = None,
):
  """The cheap arguments, validated (and the per-round work estimated) before a log is read."""
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

  sigma = validate_audit_noise_multiplier(noise_multiplier)
  delta = accounting.validate_delta(delta)
  strategy = strategies.load_strategy(strategy)
  rounds = _positive_int_or_none(rounds, "--rounds")
  min_sep = _positive_int_or_none(min_sep, "--min-sep")
  max_participations = _positive_int_or_none(max_participations, "--max-participations")
  if max_epsilon is not None and not (
    isinstance(max_epsilon, numbers.Real) and math.isfinite(max_epsilon) and max_epsilon > 0
  ):
    raise FedmfUserError(f"--max-epsilon must be a finite number > 0, got {max_epsilon!r}")
  if rounds is not None:
    strategy.check_horizon(rounds)
    if curve and sigma > 0:
      _check_curve(rounds)
    if min_sep is not None or max_participations is not None:
      # The declared claim's sensitivity is known before the log is read: refuse it now if too big.
      schema = ParticipationSchema(rounds, min_sep, max_participations)
      resources.check(
        strategy.sensitivity_cost(schema, method),
        f"the sensitivity of {strategy.describe()} at n={rounds}",
      )
  return strategy, sigma, delta, rounds, min_sep, max_participations


def audit_arrays(
  arrays: participation_log.ParticipationArrays,
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  rounds: Optional[int] = None,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  method: str = "auto",
  accountant: str = "analytic",
  curve: bool = True,
  log_name: str = "",
  violation_limit: Optional[int] = DEFAULT_VIOLATION_LIMIT,
  max_epsilon: Optional[float] = None,
  notes: tuple[str, ...] = (),
) -> AuditResult:
  """Audits a log already in memory as ``ParticipationArrays`` (see ``audit_log``)."""
  strategy, sigma, delta, rounds, min_sep, max_participations = _validated(
    strategy,
    noise_multiplier,
    delta,
    rounds,
    min_sep,
    max_participations,
    method=method,
    curve=curve,
    max_epsilon=max_epsilon,
  )
  stats, violations = log_statistics(
    arrays.rounds,
    arrays.codes,
    len(arrays.client_ids),
    min_sep,
    max_participations,
    arrays.client_ids,
    violation_limit=violation_limit,
  )
  if arrays.cut_off_row is not None:
    stats = dataclasses.replace(stats, cut_off_row=arrays.cut_off_row)
  return _audit(
    stats,
    violations,
    strategy,
    sigma,
    delta,
    rounds=rounds,
    min_sep=min_sep,
    max_participations=max_participations,
    method=method,
    accountant=accountant,
    curve=curve,
    log_name=log_name,
    max_epsilon=max_epsilon,
    notes=notes,
  )


def scan_log(
  path: str | os.PathLike[str],
  *,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  violation_limit: Optional[int] = DEFAULT_VIOLATION_LIMIT,
  progress: bool = False,
):
  """(LogStatistics, ViolationTable) of a log file, streamed (memory: clients + rounds).

  One pass when the rows are in round order (as ``ParticipationLogWriter`` writes them), plus a
  second pass only if a listed violator's rows were not kept (``LogScan``); a log out of round order
  is read whole into arrays and sorted instead (about 16 bytes a row).
  """
  path = os.fspath(path)
  index = participation_log.ClientIndex()
  end = participation_log.LogTail()
  scan = LogScan(min_sep, max_participations, violation_limit)
  # Reading and coding the ids (one thread) overlap the scan (this one): both are Arrow and numpy
  # kernels, which release the GIL.
  batches = _prefetched(participation_log.iter_participation_codes(path, index, progress, end))
  try:
    try:
      for rounds, codes in batches:
        scan.update(rounds, codes, len(index))
    finally:
      batches.close()  # Stops the reader thread now, not when the traceback is dropped.
    stats, table = scan.finish(
      len(index),
      index.client_ids(),
      reread=lambda: participation_log.iter_participation_codes(path, index, progress),
    )
    cut_off_row = end.cut_off_row
  except _NotRoundOrdered:
    logger.info("%s is not in round order: sorting it in memory", path)
    arrays = participation_log.read_participation_arrays(path, progress=progress)
    stats, table = _sorted_log_statistics(
      arrays.rounds,
      arrays.codes,
      len(arrays.client_ids),
      min_sep,
      max_participations,
      arrays.client_ids,
    )
    table = table.limited(violation_limit)
    cut_off_row = arrays.cut_off_row
  except FedmfUserError as e:
    if str(e).startswith(path):
      raise
    raise type(e)(f"{path}: {e}") from None
  if cut_off_row is not None:
    stats = dataclasses.replace(stats, cut_off_row=cut_off_row)
  return stats, table


def audit_log(
  path: str | os.PathLike[str],
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  rounds: Optional[int] = None,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  method: str = "auto",
  accountant: str = "analytic",
  curve: bool = True,
  progress: bool = False,
  violation_limit: Optional[int] = DEFAULT_VIOLATION_LIMIT,
  max_epsilon: Optional[float] = None,
  notes: tuple[str, ...] = (),
) -> AuditResult:
  """Audits a participation log file.

  Args:
    path: Log file (see ``fedmf.privacy.participation_log``).
    strategy: Strategy object, dict or JSON path.
    noise_multiplier: σ used in training, applied to C as loaded (docs/noise-multiplier.md); 0 for
      a run without DP (its participation is audited; no privacy guarantee holds).
    delta: δ for ε.
    rounds: Rounds whose noisy aggregate was released; None infers max round + 1 (with a warning).
    min_sep: Declared b (gap), optional.
    max_participations: Declared k, optional.
    method: Sensitivity method ('auto', 'upper-bound', 'lower-bound').
    accountant: 'analytic' (default): ε from the exact Gaussian curve, solved to float64
      precision. Every claim the auditor makes is one Gaussian mechanism with sensitivity s and
      noise σ (no amplification, no composition: BandMF §5, BLT App. C), so this is its exact ε
      (Balle & Wang 2018, Thm. 8). 'pld': dp_accounting's PLD accountant, a pessimistic
      discretization of the same curve (ε_pld ≥ ε), kept as a cross-check.
    curve: Also compute the per-round ε curve (estimated first: fedmf.mf.resources).
    progress: tqdm progress on stderr while reading.
    violation_limit: List at most this many violation entries (None: all); all are counted.
    max_epsilon: The privacy budget a strict audit checks the realized ε against.
    notes: Where the inputs came from, shown in the report.
  """
  # Validate the cheap arguments (and estimate the per-round work) before reading a large log.
  strategy, sigma, delta, rounds, min_sep, max_participations = _validated(
    strategy,
    noise_multiplier,
    delta,
    rounds,
    min_sep,
    max_participations,
    method=method,
    curve=curve,
    max_epsilon=max_epsilon,
  )
  stats, violations = scan_log(
    path,
    min_sep=min_sep,
    max_participations=max_participations,
    violation_limit=violation_limit,
    progress=progress,
  )
  return _audit(
    stats,
    violations,
    strategy,
    sigma,
    delta,
    rounds=rounds,
    min_sep=min_sep,
    max_participations=max_participations,
    method=method,
    accountant=accountant,
    curve=curve,
    log_name=os.fspath(path),
    max_epsilon=max_epsilon,
    notes=notes,
  )


def _number(value: float, digits: int = 4) -> str:
  return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def format_summary(result: AuditResult, max_violations: int = 10) -> str:
  """A human-readable summary (the CLI's output without --json): no Python None, one statement."""
  s = result.stats
  a = result.realized
  v = result.verdict()
  realized_b = (
    str(s.observed_min_sep)
    if s.observed_min_sep is not None
    else "none (no client participated twice)"
  )
  lines = [
    f"log: {result.log}",
    f"strategy: {result.strategy.get('description', result.strategy['mechanism'])}",
    f"noise multiplier: {a.noise_multiplier:.6g}" + (" (no DP)" if result.no_noise else ""),
    f"rounds released n: {result.rounds} "
    + ("(given)" if result.rounds_source == "given" else "(inferred: max round + 1)"),
    f"clients: {s.clients}   participations: {s.participations}   log rows: {s.log_rows}",
    f"realized participation: min-sep b = {realized_b}, max participations k = "
    f"{s.observed_max_participations}",
  ]
  if result.declared is not None:
    d = result.declared
    holds = "the log complies" if v.declared_holds else "VIOLATED by the log"
    lines.append(
      f"declared participation: {_declared_in_words(d.min_sep, d.max_participations)}: {holds}"
    )
  lines += ["", "privacy statement:", _wrap(v.statement, "  ")]
  if not result.no_noise:
    lines.append(
      f"  sensitivity {a.sensitivity:.6g} ({a.sensitivity_method}, {a.sensitivity_algorithm}); "
      f"accountant {a.accountant}"
    )
  if result.declared is not None and not result.no_noise:
    d = result.declared.accounting
    lines.append(
      f"  declared claim: sensitivity {d.sensitivity:.6g} ({d.sensitivity_method}), "
      f"epsilon {_number(d.epsilon)}" + ("" if v.declared_holds else " (does NOT hold)")
    )
  if result.max_epsilon is not None:
    if not v.guarantee:
      budget = "no epsilon holds"
    elif a.epsilon <= result.max_epsilon:
      budget = "within budget"
    else:
      budget = "EXCEEDS the budget"
    lines.append(
      f"budget: epsilon {_number(a.epsilon)} vs --max-epsilon {result.max_epsilon:g}: {budget}"
    )
  counts = result.violation_counts()
  lines.append("")
  if not any(counts.values()):
    lines.append("violations: none")
  else:
    lines.append(
      "violations: " + ", ".join(f"{k} {counts[k]} clients" for k in REASONS if counts[k])
    )
  for viol in result.violations[:max_violations]:
    shown = ", ".join(map(str, viol.rounds[:12])) + (", ..." if len(viol.rounds) > 12 else "")
    lines.append(f"  {viol.reason:<18} client {viol.client_id}: rounds {shown}")
  total = result.violations.total
  if result.violations.truncated and total > max_violations:
    lines.append(
      f"  ... {total - max_violations} more (the first {len(result.violations)} in --json)"
    )
  elif len(result.violations) > max_violations:
    lines.append(f"  ... {len(result.violations) - max_violations} more (see --json)")
  for note in result.notes:
    lines.append(f"note: {note}")
  for w in result.warnings:
    lines.append(f"warning: {w}")
  return "\n".join(lines)


def _wrap(text: str, indent: str, width: int = 100) -> str:
  import textwrap  # pylint: disable=g-import-not-at-top

  return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent)
