"""The report's "Measured privacy" section: what a run's canaries showed, in a table and in words.

One concept: decide what the section says from an `fedmf.privacy.empirical.EmpiricalPrivacy` (the
renderers lay it out; its histogram is `report_plots`' "canaries" figure). It leads with the
verdict of the measurement, then both threat models' estimates and lower bounds beside the analytic
ε, the noise check, and what a measurement can and cannot show.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

HEAD = (
  "threat model",
  "ε estimate (95%)",
  "μ estimate",
  "ε lower bound",
  "analytic ε (μ)",
  "estimate / analytic",
)
LIMITS = (
  "An ε lower bound above the analytic ε refutes the claim at the stated confidence: the "
  "implementation is not the mechanism the accountant analyzed (a defect). A lower bound below "
  "it never proves privacy: one run's bound is loose (with m canaries it cannot exceed a cap, "
  "about μ = 1.7 for 1000 canaries at 95%), and a defect the canaries do not exercise (a path "
  "they do not take, a client they do not resemble, a round they skip) shows nothing.",
  "An estimate close to the analytic ε says the noise really added (its scale, its correlation, "
  "the clip, the denominator, the participation) is what the accountant assumed, for these "
  "canaries' directions and rounds. It is a Gaussian fit, not a bound. For the tree the per-round "
  "releases are a post-processing of the node releases the analysis charges for, so the estimate "
  "sits below the analytic ε by design.",
  "The final-model estimate is for an observer of the last model only: it is usually far below the "
  "analytic ε, which covers every release.",
)


@dataclasses.dataclass(frozen=True)
class MeasuredSection:
  """Everything the section shows, as strings."""

  status: str  # 'ok' | 'warn' | 'bad'
  headline: str
  summary: str
  rows: tuple[tuple[str, ...], ...]
  failing: tuple[bool, ...]
  noise_check: Optional[str]
  claim: str
  notes: tuple[str, ...]
  warnings: tuple[str, ...]
  limits: tuple[str, ...] = LIMITS
  head: tuple[str, ...] = HEAD


def _num(value: float) -> str:
  return "inf" if math.isinf(value) else f"{value:.4g}"


def section(measured: Optional[Any]) -> Optional[MeasuredSection]:
  """The section of a run with canaries (None without: the report is unchanged)."""
  if measured is None:
    return None
  rows, failing = [], []
  for name, e in measured.estimates.items():
    lo, hi = e.fit.epsilon_interval
    ratio = e.fit.epsilon / e.analytic_epsilon if e.analytic_epsilon > 0 else math.nan
    rows.append(
      (
        name.replace("_", " "),
        f"{_num(e.fit.epsilon)} ({_num(lo)}–{_num(hi)})",
        f"{e.fit.mu:.4g} ± {e.fit.mu_stderr:.2g}",
        f"{_num(e.lower.epsilon)} ({e.lower.confidence:.0%})",
        f"{_num(e.analytic_epsilon)} ({e.analytic_mu:.4g})",
        f"{ratio:.3f}",
      )
    )
    failing.append(e.lower_exceeds_analytic)
  failures = measured.failures()
  if failures:
    status, headline = "bad", "The canaries refute the privacy claim"
  elif measured.warnings:
    status, headline = "warn", "The canaries see no refutation, with warnings"
  else:
    status, headline = "ok", "The canaries see no refutation of the privacy claim"
  summary = (
    f"{measured.inserted} of {measured.canaries} canaries were inserted "
    f"({measured.coin_canaries} on fair coins; {measured.pattern}: "
    f"{measured.pattern_description}), over {measured.rounds} rounds with noise multiplier "
    f"{measured.noise_multiplier:.6g}, δ = {measured.delta:g}."
    + (" " + " ".join(failures) if failures else "")
  )
  check = measured.noise_check
  noise = None
  if check is not None:
    lo, hi = check.variance_ratio_interval
    noise = (
      f"Noise check ({check.samples} held-out canaries): measured over claimed noise variance "
      f"{check.variance_ratio:.4g} (95% {lo:.4g}–{hi:.4g})"
    )
    if check.clients_fraction_max is not None:
      noise += (
        f", of which up to {check.clients_fraction_max:.2g} is the real clients' updates, which "
        "project on the canary directions too"
      )
    if check.measured_mu is not None:
      mlo, mhi = check.measured_mu_interval
      noise += (
        f"; under the measured noise the canaries' pattern has μ {check.measured_mu:.4g} "
        f"(95% {mlo:.4g}–{mhi:.4g}) where the claimed noise gives {check.claimed_mu:.4g}"
      )
    elif check.note:
      noise += f"; {check.note}"
    noise += "."
  return MeasuredSection(
    status=status,
    headline=headline,
    summary=summary,
    rows=tuple(rows),
    failing=tuple(failing),
    noise_check=noise,
    claim=f"Compared with: {measured.claim}.",
    notes=tuple(measured.notes),
    warnings=tuple(measured.warnings),
  )
