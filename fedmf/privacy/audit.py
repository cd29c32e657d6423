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

Everything is vectorized over the rows (one sort of int64 keys), so a 10M-row log takes seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from fedmf.privacy import accounting
from fedmf.privacy import curve as curve_lib
from fedmf.privacy import participation_log
from fedmf.errors import FedmfUserError
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
  A million violating clients cost arrays, not a million Python objects, until listed.
  """

  def __init__(self, client_codes: np.ndarray, reasons: np.ndarray, offsets: np.ndarray,
               rounds: np.ndarray, client_ids: Any):
    self._codes = client_codes
    self._reasons = reasons
    self._offsets = offsets
    self._rounds = rounds
    self._ids = client_ids

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
    return cls(c[first].astype(np.int64), why[first].astype(np.int64), offsets,
               r.astype(np.int64, copy=False), client_ids)

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
    return Violation(self._name(self._codes[i]), tuple(int(x) for x in self._rounds[lo:hi]),
                     REASONS[int(self._reasons[i])])

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]

  def counts(self) -> dict[str, int]:
    b = np.bincount(self._reasons, minlength=len(REASONS))
    return {r: int(b[i]) for i, r in enumerate(REASONS)}

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
    return [{"client_id": name, "rounds": rounds[lo:hi], "reason": REASONS[w]}
            for name, lo, hi, w in zip(names, off, off[1:], why)]


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


@dataclasses.dataclass(frozen=True)
class DeclaredClaim:
  min_sep: Optional[int]
  max_participations: Optional[int]
  accounting: accounting.GaussianAccounting

  def to_dict(self) -> dict[str, Any]:
    a = self.accounting
    return {"min_sep": self.min_sep, "max_participations": self.max_participations,
            "sensitivity": a.sensitivity, "sensitivity_method": a.sensitivity_method,
            "sensitivity_algorithm": a.sensitivity_algorithm, "rho": a.rho, "epsilon": a.epsilon}


@dataclasses.dataclass(frozen=True)
class AuditResult:
  """Everything the auditor computes; ``to_dict()`` is the ``--json`` object."""

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

  @property
  def claim_covers_all_clients(self) -> bool:
    return self.stats.duplicate_rows == 0

  def violation_counts(self) -> dict[str, int]:
    return self.violations.counts()

  def to_dict(self) -> dict[str, Any]:
    s = self.stats
    a = self.realized
    return {
        "log": self.log,
        "strategy": self.strategy,
        "rounds": self.rounds,
        "rounds_source": self.rounds_source,
        "clients": s.clients,
        "participations": s.participations,
        "log_rows": s.log_rows,
        "duplicate_rows": s.duplicate_rows,
        "observed_min_sep": s.observed_min_sep,
        "observed_max_participations": s.observed_max_participations,
        "gap_histogram": {"gap": s.gap_values.tolist(), "count": s.gap_counts.tolist()},
        "participations_histogram": {"participations": s.participation_values.tolist(),
                                     "clients": s.participation_counts.tolist()},
        "violations": self.violations.to_list(),
        "violation_counts": self.violation_counts(),
        "claim_covers_all_clients": self.claim_covers_all_clients,
        "sensitivity": a.sensitivity,
        "sensitivity_method": a.sensitivity_method,
        "sensitivity_algorithm": a.sensitivity_algorithm,
        "rho": a.rho,
        "epsilon": a.epsilon,
        "delta": a.delta,
        "noise_multiplier": a.noise_multiplier,
        "accountant": a.accountant,
        "declared": self.declared.to_dict() if self.declared else None,
        "warnings": list(self.warnings),
    }


# ---------------------------------------------------------------------------------------------------
# Statistics.


def _sorted_keys(rounds: np.ndarray, codes: np.ndarray, round_bits: int,
                 num_clients: int) -> np.ndarray:
  """(code << round_bits) | round, sorted (uint32 when it fits: half the memory, faster sort)."""
  kdt = np.uint32 if num_clients << round_bits <= 2**32 else np.int64
  keys = np.empty(codes.shape[0], dtype=kdt)
  # Written straight into the key dtype (inputs are non-negative and fit): no temporaries.
  np.left_shift(codes, round_bits, out=keys, casting="unsafe")
  np.bitwise_or(keys, rounds, out=keys, casting="unsafe")
  keys.sort()
  return keys


def log_statistics(rounds: np.ndarray, codes: np.ndarray, num_clients: int,
                   declared_min_sep: Optional[int] = None,
                   declared_max_participations: Optional[int] = None,
                   client_ids: Any = None):
  """Statistics and violations of a log given as rounds + client codes (``ParticipationArrays``).

  One sort of the (code, round) keys; everything else is linear vectorized passes over the sorted
  keys (the violation entries come out already sorted by (code, round)).

  Returns:
    (LogStatistics, ViolationTable). Violations name clients through ``client_ids[code]``
    (a pyarrow array or sequence; codes themselves when None).
  """
  rows = int(rounds.shape[0])
  if rows == 0:
    raise participation_log.ParticipationLogError("empty log (no participation rows)")
  max_round = int(rounds.max())
  R = max_round + 1
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
      log_rows=rows, participations=m, clients=int(num_clients), max_round=max_round,
      observed_min_sep=observed_b, observed_max_participations=observed_k,
      gap_values=gv, gap_counts=gap_bins[gv], participation_values=pv,
      participation_counts=part_bins[pv], prefix_min_sep=prefix_b,
      prefix_max_participations=prefix_k, duplicate_rows=rows - m)
  return stats, violations


# ---------------------------------------------------------------------------------------------------
# The audit.


def _positive_int_or_none(value: Any, what: str) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or int(value) != value or value < 1:
    raise FedmfUserError(f"{what} must be an integer >= 1, got {value!r}")
  return int(value)


def audit_arrays(arrays: participation_log.ParticipationArrays, strategy: Any, noise_multiplier: float,
                 delta: float, *, rounds: Optional[int] = None, min_sep: Optional[int] = None,
                 max_participations: Optional[int] = None, method: str = "auto",
                 accountant: str = "pld", curve: bool = True, log_name: str = "") -> AuditResult:
  """Audits a log already in memory as ``ParticipationArrays`` (see ``audit_log``)."""
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  sigma = accounting.validate_noise_multiplier(noise_multiplier)
  delta = accounting.validate_delta(delta)
  strategy = strategies.load_strategy(strategy)
  rounds = _positive_int_or_none(rounds, "--rounds")
  min_sep = _positive_int_or_none(min_sep, "--min-sep")
  max_participations = _positive_int_or_none(max_participations, "--max-participations")
  stats, violations = log_statistics(arrays.rounds, arrays.codes, len(arrays.client_ids),
                                     min_sep, max_participations, arrays.client_ids)
  warnings: list[str] = []
  if rounds is None:
    n = stats.max_round + 1
    source = "inferred"
    warnings.append(
        f"--rounds not given: assuming n = max round + 1 = {n}; rounds released after the last "
        "logged participation would add to the privacy cost")
  else:
    n = rounds
    source = "given"
    if stats.max_round >= n:
      raise FedmfUserError(
          f"the log has a participation in round {stats.max_round}, but --rounds is {n}")
  strategy.check_horizon(n)
  if stats.duplicate_rows:
    warnings.append(
        f"{stats.duplicate_rows} duplicate (round, client_id) rows: those clients' updates may have "
        "been summed twice, and the claim does not cover them")
  k_obs = stats.observed_max_participations
  b_obs = stats.observed_min_sep
  realized = accounting.account(strategy, ParticipationSchema(n, b_obs if k_obs > 1 else None, k_obs),
                                sigma, delta, method=method, accountant=accountant)
  declared = None
  if min_sep is not None or max_participations is not None:
    d = accounting.account(strategy, ParticipationSchema(n, min_sep, max_participations), sigma,
                           delta, method=method, accountant=accountant)
    declared = DeclaredClaim(min_sep, max_participations, d)
    counts = violations.counts()
    if counts["min-sep"] or counts["max-participations"]:
      warnings.append(
          f"the log violates the declared limits ({counts['min-sep']} min-sep, "
          f"{counts['max-participations']} max-participations client violations): the declared "
          "claim does not hold; the realized claim does")
  for acc, label in ((realized, "realized"), (declared.accounting if declared else None,
                                               "declared")):
    if acc is not None and acc.sensitivity_method == "lower-bound":
      warnings.append(f"the {label} sensitivity is a LOWER bound: the epsilon is not a guarantee")
  eps_curve = None
  if curve:
    b_r = np.full(n, -1, dtype=np.int64)
    k_r = np.zeros(n, dtype=np.int64)
    m = min(n, stats.prefix_min_sep.shape[0])
    b_r[:m] = stats.prefix_min_sep[:m]
    k_r[:m] = stats.prefix_max_participations[:m]
    if n > m:  # Released rounds after the last logged participation.
      b_r[m:] = b_r[m - 1]
      k_r[m:] = k_r[m - 1]
    eps_curve = curve_lib.epsilon_curve(strategy, b_r, k_r, sigma, delta, method=method)
  strategy_info = {"mechanism": strategy.mechanism, "description": strategy.describe()}
  if strategy.horizon is not None:
    strategy_info["n"] = int(strategy.horizon)
  return AuditResult(
      log=log_name, strategy=strategy_info, rounds=n, rounds_source=source, stats=stats,
      violations=violations, realized=realized, declared=declared,
      warnings=tuple(warnings), curve=eps_curve)


def audit_log(path: str | os.PathLike[str], strategy: Any, noise_multiplier: float, delta: float, *,
              rounds: Optional[int] = None, min_sep: Optional[int] = None,
              max_participations: Optional[int] = None, method: str = "auto",
              accountant: str = "pld", curve: bool = True, progress: bool = False) -> AuditResult:
  """Audits a participation log file.

  Args:
    path: Log file (see ``fedmf.privacy.participation_log``).
    strategy: Strategy object, dict or JSON path.
    noise_multiplier: σ used in training.
    delta: δ for ε.
    rounds: Rounds whose noisy aggregate was released; None infers max round + 1 (with a warning).
    min_sep: Declared B (gap), optional.
    max_participations: Declared K, optional.
    method: Sensitivity method ('auto', 'upper-bound', 'lower-bound').
    accountant: 'pld' (dp_accounting) or 'analytic' for the headline ε.
    curve: Also compute the per-round ε curve.
    progress: tqdm progress on stderr while reading.
  """
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  # Validate the cheap arguments before reading a large log.
  accounting.validate_noise_multiplier(noise_multiplier)
  accounting.validate_delta(delta)
  strategy = strategies.load_strategy(strategy)
  if rounds is not None:
    strategy.check_horizon(_positive_int_or_none(rounds, "--rounds"))
  arrays = participation_log.read_participation_arrays(path, progress=progress)
  return audit_arrays(arrays, strategy, noise_multiplier, delta, rounds=rounds, min_sep=min_sep,
                      max_participations=max_participations, method=method,
                      accountant=accountant, curve=curve, log_name=os.fspath(path))


def format_summary(result: AuditResult, max_violations: int = 10) -> str:
  """A human-readable summary (the CLI's output without --json)."""
  s = result.stats
  a = result.realized
  lines = [
      f"log: {result.log}",
      f"strategy: {result.strategy.get('description', result.strategy['mechanism'])}",
      f"rounds: {result.rounds} ({result.rounds_source})",
      f"clients: {s.clients}   participations: {s.participations}   log rows: {s.log_rows}",
      f"observed min-sep b: {s.observed_min_sep if s.observed_min_sep is not None else 'none (single participation)'}",
      f"observed max participations k: {s.observed_max_participations}",
      "",
      f"realized claim (b={s.observed_min_sep}, k={s.observed_max_participations}):",
      f"  sensitivity {a.sensitivity:.6g} ({a.sensitivity_method}, {a.sensitivity_algorithm})",
      f"  noise multiplier {a.noise_multiplier:.6g}",
      f"  rho-zCDP {a.rho:.6g}",
      f"  ({a.epsilon:.6g}, {a.delta:.3g})-DP [{a.accountant}]",
  ]
  if result.declared is not None:
    d = result.declared.accounting
    lines += [
        f"declared claim (B={result.declared.min_sep}, K={result.declared.max_participations}):",
        f"  sensitivity {d.sensitivity:.6g} ({d.sensitivity_method}), rho {d.rho:.6g}, "
        f"epsilon {d.epsilon:.6g}",
    ]
  counts = result.violation_counts()
  lines.append("")
  lines.append("violations: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
  for v in result.violations[:max_violations]:
    shown = ", ".join(map(str, v.rounds[:12])) + (", ..." if len(v.rounds) > 12 else "")
    lines.append(f"  {v.reason:<18} client {v.client_id}: rounds {shown}")
  if len(result.violations) > max_violations:
    lines.append(f"  ... {len(result.violations) - max_violations} more (see --json)")
  lines.append(f"claim covers all clients: {'yes' if result.claim_covers_all_clients else 'NO'}")
  for w in result.warnings:
    lines.append(f"warning: {w}")
  return "\n".join(lines)

