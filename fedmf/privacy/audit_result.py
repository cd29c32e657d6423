"""What the auditor concludes: the declared claim, the verdict (the one privacy statement a log
supports, and what ``fedmf audit --strict`` checks), the result (``--json``) and its text summary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from fedmf import display
from fedmf.privacy import accounting
from fedmf.privacy import curve as curve_lib
from fedmf.privacy.log_counts import REASONS, LogStatistics, ViolationTable


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


def declared_in_words(min_sep: Optional[int], max_participations: Optional[int]) -> str:
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
  # The check of a declared cyclic Poisson sampling (`fedmf.privacy.partition_audit.AmplifiedAudit`),
  # None when the run declares none.
  amplified: Optional[Any] = None
  # Measured privacy (`fedmf.privacy.empirical.EmpiricalPrivacy`) of a run with canaries, else None.
  empirical: Optional[Any] = None

  @property
  def amplification_credited(self) -> bool:
    """The log complies with the declared partitions and the amplified ε was accounted."""
    return self.amplified is not None and self.amplified.accounting is not None

  @property
  def partition_violations(self) -> int:
    """Devices that joined rounds outside their declared partition (0 without a declaration)."""
    return 0 if self.amplified is None else self.amplified.compliance.violating_clients

  @property
  def epsilon(self) -> float:
    """The ε the audit claims: amplified when the log complies with a declared cyclic Poisson
    sampling (BandMF Thm 4), else the realized participation's (never the smaller one of a
    violated declaration)."""
    if self.amplification_credited:
      return self.amplified.accounting.epsilon
    return self.realized.epsilon

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
        f"{display.epsilon(a.epsilon)} is optimistic, not a guarantee (audit with --sensitivity auto)."
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
        f"({display.epsilon(a.epsilon)}, {a.delta:g})-DP (rho-zCDP with rho = {a.rho:.4g}) for {who}, "
        f"under the participation the log shows: {realized}."
      )
      if a.adaptive:
        statement += (
          f" It includes adaptive clipping's noisy counts: {a.count_releases} count releases per "
          f"device at count noise multiplier {a.count_noise_multiplier:.4g}."
        )
      if self.declared is not None:
        declared = declared_in_words(self.declared.min_sep, self.declared.max_participations)
        if violating:
          statement = (
            f"The log VIOLATES the declared schema ({declared}): {violating} clients "
            f"({counts['min-sep']} below the min-separation, {counts['max-participations']} "
            f"above the max participations). The declared epsilon "
            f"{display.epsilon(self.declared.accounting.epsilon)} does NOT hold. What holds is {statement}"
          )
        else:
          statement += (
            f" It complies with the declared schema ({declared}), whose epsilon "
            f"{display.epsilon(self.declared.accounting.epsilon)} holds too."
          )
      statement = self._amplified_statement(statement)
    if self.amplified is not None and self.partition_violations:
      c = self.amplified.compliance
      failures.append(
        f"{c.violating_clients} devices joined rounds outside their cyclic Poisson partition"
      )
    if self.max_epsilon is not None and guarantee and self.epsilon > self.max_epsilon:
      failures.append(f"epsilon {self.epsilon:.4g} exceeds --max-epsilon {self.max_epsilon:g}")
    if self.empirical is not None:
      failures.extend(self.empirical.failures())
    return Verdict(
      guarantee=guarantee,
      statement=statement,
      declared_holds=declared_holds,
      violating_clients=violating,
      uncovered_clients=uncovered,
      failures=tuple(failures),
    )

  def _amplified_statement(self, statement: str) -> str:
    """The statement with the declared cyclic Poisson sampling's outcome (unchanged without)."""
    if self.amplified is None:
      return statement
    c = self.amplified.compliance
    if self.amplification_credited:
      acc = self.amplified.accounting
      return (
        f"({display.epsilon(acc.epsilon)}, {acc.delta:g})-DP with privacy AMPLIFICATION by "
        f"{c.partitions}-cyclic Poisson sampling (BandMF Thm 4; q = "
        f"{acc.sampling.sampling_probability:.4g} over {acc.sampling.dataset_size} devices), "
        f"for every device, as the run declares its sampling: the log complies with the "
        f"partitions. Without amplification: {statement}"
      )
    if c.complies:
      return f"No amplification is credited ({self.amplified.note}). {statement}"
    return (
      f"The log VIOLATES the declared {c.partitions}-cyclic Poisson partitions: "
      f"{c.violating_clients} devices joined {c.violating_participations} rounds outside their "
      f"partition, so no amplification is credited. {statement}"
    )

  def to_dict(self) -> dict[str, Any]:
    s = self.stats
    a = self.realized
    v = self.verdict()
    return (
      {
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
        **self._adaptive_dict(),
        "declared": self.declared.to_dict() if self.declared else None,
        "max_epsilon": self.max_epsilon,
        "strict": {"passed": v.passed, "failures": list(v.failures)},
        "notes": list(self.notes),
        "warnings": list(self.warnings),
      }
      | self._amplified_dict()
      | self._empirical_dict()
    )

  def _empirical_dict(self) -> dict[str, Any]:
    """`empirical` of a run with canaries (none without: outputs unchanged)."""
    return {} if self.empirical is None else {"empirical": self.empirical.to_dict()}

  def _adaptive_dict(self) -> dict[str, Any]:
    """Adaptive clipping's count releases in the claim (none for a fixed clip: outputs unchanged):
    "epsilon" and "rho" include them."""
    a = self.realized
    if not a.adaptive:
      return {}
    return {"count_noise_multiplier": a.count_noise_multiplier, "count_releases": a.count_releases}

  def _amplified_dict(self) -> dict[str, Any]:
    """The keys of a declared cyclic Poisson sampling (none without one: outputs unchanged)."""
    if self.amplified is None:
      return {}
    return {
      # "epsilon" is then the claim: amplified if credited, else the realized one.
      "epsilon": self.epsilon,
      # The accountant of "epsilon" (PLD for the amplified event, the realized claim's otherwise).
      "accountant": self.amplified.accounting.accountant
      if self.amplification_credited
      else self.realized.accountant,
      "epsilon_amplified": self.amplification_credited,
      "unamplified_epsilon": self.realized.epsilon,
      "unamplified_accountant": self.realized.accountant,
      "amplification": self.amplified.to_dict(),
    }


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
      f"declared participation: {declared_in_words(d.min_sep, d.max_participations)}: {holds}"
    )
  lines += ["", "privacy statement:", _wrap(v.statement, "  ")]
  if not result.no_noise:
    lines.append(
      f"  sensitivity {a.sensitivity:.6g} ({a.sensitivity_method}, {a.sensitivity_algorithm}); "
      f"accountant {a.accountant}"
    )
    if a.adaptive:
      lines.append(
        f"  adaptive clipping: {a.count_releases} count releases per device at count noise "
        f"multiplier {a.count_noise_multiplier:.6g}, composed with the matrix mechanism"
      )
  if result.amplified is not None and not result.no_noise:
    if result.amplification_credited:
      acc = result.amplified.accounting
      lines.append(
        f"  amplified claim: epsilon {_number(acc.epsilon)} at delta {acc.delta:g} "
        f"({acc.sampling.partitions}-cyclic "
        f"Poisson sampling, q = {acc.sampling.sampling_probability:.4g}, accountant "
        f"{acc.accountant}); without amplification epsilon {_number(a.epsilon)}"
      )
    else:
      lines.append(
        f"  amplified claim: none credited; epsilon {_number(a.epsilon)} (not amplified)"
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
    elif result.epsilon <= result.max_epsilon:
      budget = "within budget"
    else:
      budget = "EXCEEDS the budget"
    lines.append(
      f"budget: epsilon {_number(result.epsilon)} vs --max-epsilon {result.max_epsilon:g}: {budget}"
    )
  counts = result.violation_counts()
  lines.append("")
  if not any(counts.values()):
    lines.append("violations: none")
  else:
    lines.append(
      "violations: " + ", ".join(f"{k} {counts[k]} clients" for k in REASONS if counts[k])
    )
  if result.partition_violations:
    c = result.amplified.compliance
    lines.append(
      f"  cyclic Poisson partitions: {c.violating_clients} devices in "
      f"{c.violating_participations} rounds outside their partition (see the note)"
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
  if result.empirical is not None:
    lines += [""] + result.empirical.summary_lines()
  for note in result.notes:
    lines.append(f"note: {note}")
  for w in result.warnings:
    lines.append(f"warning: {w}")
  return "\n".join(lines)


def _wrap(text: str, indent: str, width: int = 100) -> str:
  import textwrap  # pylint: disable=g-import-not-at-top

  return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent)
