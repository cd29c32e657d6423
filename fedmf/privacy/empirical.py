"""Measured privacy: a run's canaries turned into ε estimates and lower bounds for two threat models.

One concept: `estimate(...)` takes what a canary experiment collected (which canaries were
inserted and on which coins, their rounds, the projections of every released noised sum and of the
final model's change on their directions) and the claim it is compared with, and returns an
`EmpiricalPrivacy` (`fedmf audit --json`: `empirical`). Docs: docs/empirical-privacy.md.

Threat models:
  all_releases   an observer of every released aggregate: the decorrelated statistic
                 (`empirical_statistics.all_releases_statistics`);
  final_model    an observer of the last model only: Andrew et al.'s cosine.
Estimators (`empirical_estimators`): Andrew et al.'s Gaussian fit (`epsilon_estimate`) and the
one-run f-DP lower bound (`epsilon_lower`, with `confidence`).

What a measurement shows: an `epsilon_lower` above the analytic ε refutes the claim (with the stated
confidence): a defect. An `epsilon_estimate` near the analytic ε says the noise really added (its
scale, its correlation, the clip, the denominator, the participation) is what the accountant
assumed, for these canaries. Neither proves privacy: a lower bound below the analytic ε is what a
correct run shows, and also what a defect the canaries do not exercise shows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from fedmf.privacy import empirical_estimators as estimators
from fedmf.privacy import empirical_noise
from fedmf.privacy import empirical_statistics as statistics
from fedmf.privacy import gaussian_curve

THREAT_MODELS = ("all_releases", "final_model")
STATISTICS = {
  "all_releases": "decorrelated statistic ⟨W 1_π, W p⟩ / (σ ‖W 1_π‖) over every released aggregate",
  "final_model": "cosine of the final model's change with the canary direction (Andrew et al. 2024)",
}


@dataclasses.dataclass(frozen=True)
class ThreatModelEstimate:
  """One threat model's estimate, lower bound and the analytic claim they are compared with.

  `expected_mu` (all_releases only): the mean of the inserted canaries' statistic if the mechanism
  is exactly as analyzed (‖W 1_π‖/σ averaged over them; for a square C the claim's μ itself).
  """

  name: str
  fit: estimators.GaussianFit
  lower: estimators.LowerBound
  analytic_mu: float
  analytic_epsilon: float
  expected_mu: Optional[float] = None

  @property
  def lower_exceeds_analytic(self) -> bool:
    return self.lower.epsilon > self.analytic_epsilon * (1 + 1e-9)

  def to_dict(self) -> dict[str, Any]:
    ratio = self.fit.epsilon / self.analytic_epsilon if self.analytic_epsilon > 0 else None
    out = {
      "statistic": STATISTICS[self.name],
      **self.fit.to_dict(),
      **self.lower.to_dict(),
      "analytic_mu": self.analytic_mu,
      "analytic_epsilon": self.analytic_epsilon,
      "epsilon_estimate_over_analytic": ratio,
      "epsilon_lower_exceeds_analytic": self.lower_exceeds_analytic,
    }
    if self.expected_mu is not None:
      out["expected_mu"] = self.expected_mu
    return out


@dataclasses.dataclass(frozen=True)
class EmpiricalPrivacy:
  """Both threat models' estimates for one run, what they are compared with, and the statistics
  (for the report's histograms)."""

  estimates: dict[str, ThreatModelEstimate]
  canaries: int
  inserted: int
  coin_canaries: int
  pattern: str
  pattern_description: str
  rounds: int
  noise_multiplier: float
  delta: float
  claim: str
  scores: dict[str, np.ndarray]  # per threat model, one statistic per canary (NaN: none)
  inserted_mask: np.ndarray
  noise_check: Optional[empirical_noise.NoiseCheck] = None
  notes: tuple[str, ...] = ()
  warnings: tuple[str, ...] = ()

  def failures(self) -> list[str]:
    """Why `fedmf audit --strict` fails: an ε lower bound above the analytic ε."""
    return [
      f"measured privacy ({name}): epsilon_lower {e.lower.epsilon:.4g} exceeds the analytic "
      f"epsilon {e.analytic_epsilon:.4g} at {e.lower.confidence:.0%} confidence"
      for name, e in self.estimates.items()
      if e.lower_exceeds_analytic
    ]

  def to_dict(self) -> dict[str, Any]:
    return {
      **{name: e.to_dict() for name, e in self.estimates.items()},
      "canaries": self.canaries,
      "inserted": self.inserted,
      "held_out": self.canaries - self.inserted,
      "coin_canaries": self.coin_canaries,
      "pattern": self.pattern,
      "pattern_description": self.pattern_description,
      "rounds": self.rounds,
      "noise_multiplier": self.noise_multiplier,
      "delta": self.delta,
      "claim": self.claim,
      "noise_check": None if self.noise_check is None else self.noise_check.to_dict(),
      "failures": self.failures(),
      "notes": list(self.notes),
      "warnings": list(self.warnings),
    }

  def summary_lines(self) -> list[str]:
    """The text summary's lines (`fedmf audit` without --json)."""
    lines = [
      f"measured privacy: {self.inserted} of {self.canaries} canaries inserted "
      f"({self.pattern}: {self.pattern_description}); noise multiplier {self.noise_multiplier:g}",
    ]
    for name, e in self.estimates.items():
      lo, hi = e.fit.epsilon_interval
      lines.append(
        f"  {name}: epsilon estimate {_num(e.fit.epsilon)} (95% {_num(lo)}-{_num(hi)}; "
        f"mu {e.fit.mu:.3g} ± {e.fit.mu_stderr:.2g}), lower bound {_num(e.lower.epsilon)} "
        f"({e.lower.confidence:.0%}), analytic {_num(e.analytic_epsilon)} (mu {e.analytic_mu:.4g})"
        + ("  EXCEEDS the analytic epsilon" if e.lower_exceeds_analytic else "")
      )
    lines.append(f"  compared with: {self.claim}")
    c = self.noise_check
    if c is not None:
      lo, hi = c.variance_ratio_interval
      line = f"  noise check: measured/claimed noise variance {c.variance_ratio:.4g} (95% {lo:.4g}-{hi:.4g})"
      if c.clients_fraction_max is not None:
        line += f", of which the real clients' share up to {c.clients_fraction_max:.2g}"
      if c.measured_mu is not None:
        mlo, mhi = c.measured_mu_interval
        line += (
          f"; the pattern's mu under the measured noise {c.measured_mu:.4g} (95% {mlo:.4g}-{mhi:.4g}),"
          f" claimed {c.claimed_mu:.4g}"
        )
      lines.append(line)
    lines += [f"  note: {n}" for n in self.notes]
    lines += [f"  warning: {w}" for w in self.warnings]
    return lines


def _num(value: float) -> str:
  return "inf" if math.isinf(value) else f"{value:.4g}"


@dataclasses.dataclass(frozen=True)
class CanaryRecord:
  """What a canary experiment collected (`fedmf.program` writes it as canaries.npz).

  Attributes:
    inserted: (M,) bool, whether canary c was inserted.
    coins: (M,) bool, whether c's insertion was an independent fair coin (the lower bound uses
      these only).
    patterns: (n, M) bool, the rounds each canary joined (or would have joined, if held out).
    projections: (n, M) ⟨released noised sum of round t, u_c⟩ / ζ_t.
    final_projections: (M,) ⟨w_final − w_initial, u_c⟩, or None.
    final_norm: ‖w_final − w_initial‖, or None.
    clients_variance: the real clients' variance on a canary direction over ζ², per round (n,)
      or one mean, or None.
  """

  inserted: np.ndarray
  coins: np.ndarray
  patterns: np.ndarray
  projections: np.ndarray
  final_projections: Optional[np.ndarray] = None
  final_norm: Optional[float] = None
  clients_variance: Optional[Any] = None  # see `empirical_noise.noise_check`

  @property
  def rounds(self) -> int:
    return int(np.shape(self.projections)[0])


def estimate(
  record: CanaryRecord,
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  analytic_mu: float,
  claim: str,
  pattern: str = "",
  pattern_description: str = "",
  confidence: float = estimators.CONFIDENCE,
  notes: tuple[str, ...] = (),
) -> EmpiricalPrivacy:
  """Both threat models' estimates of a run's canaries.

  Args:
    record: the run's `CanaryRecord`.
    strategy: the strategy whose noise the run added (its C, or the tree's per-round decoder,
      decorrelates the releases).
    noise_multiplier: σ of the noise actually added (in a cheap simulation, the training one).
    delta: δ of every ε.
    analytic_mu: μ = sensitivity/σ of the claim the estimates are compared with; its ε at δ is
      `analytic_epsilon` (the exact Gaussian curve).
    claim: that claim in words.
    pattern, pattern_description: how the canaries joined (for the report).
    confidence: of the lower bounds.
    notes: said with the estimates.
  """
  n = record.rounds
  inserted = np.asarray(record.inserted, bool)
  m = inserted.size
  warnings = []
  w = statistics.release_whitening(strategy, n)
  stat, mu_c = statistics.all_releases_statistics(
    record.projections, record.patterns, w, noise_multiplier
  )
  joined = np.isfinite(stat)
  if not joined.all():
    warnings.append(
      f"{int((~joined).sum())} canaries joined no round (participation pattern): they have no "
      "all-releases statistic and are left out"
    )
  analytic_epsilon = float(gaussian_curve.gaussian_epsilon(analytic_mu, delta))
  scores = {"all_releases": stat}
  estimates = {
    "all_releases": ThreatModelEstimate(
      "all_releases",
      estimators.gaussian_fit(stat[inserted], stat[~inserted], delta),
      estimators.one_run_lower_bound(
        stat, inserted, delta, confidence=confidence, coins=record.coins
      ),
      analytic_mu,
      analytic_epsilon,
      float(np.nanmean(mu_c[inserted])) if np.isfinite(mu_c[inserted]).any() else None,
    )
  }
  if record.final_projections is not None and record.final_norm is not None:
    cos = statistics.final_model_cosines(record.final_projections, record.final_norm)
    scores["final_model"] = cos
    estimates["final_model"] = ThreatModelEstimate(
      "final_model",
      estimators.gaussian_fit(cos[inserted], cos[~inserted], delta),
      estimators.one_run_lower_bound(
        cos, inserted, delta, confidence=confidence, coins=record.coins
      ),
      analytic_mu,
      analytic_epsilon,
    )
  check = None
  held = ~inserted
  if held.sum() >= 2:
    strongest = int(np.nanargmax(np.where(np.isfinite(mu_c), mu_c, -np.inf)))
    pattern_rounds = np.asarray(record.patterns, bool)[:, strongest]
    check = empirical_noise.noise_check(
      np.asarray(record.projections, np.float64)[:, held],
      w,
      noise_multiplier,
      pattern_rounds,
      float(mu_c[strongest]),
      delta,
      record.clients_variance,
    )
    warnings += check.warnings()
  for name, e in estimates.items():
    if e.fit.epsilon_interval[0] > analytic_epsilon and not e.lower_exceeds_analytic:
      warnings.append(
        f"{name}: the epsilon estimate {e.fit.epsilon:.4g} is above the analytic "
        f"{analytic_epsilon:.4g} beyond its 95% interval: the noise may not be what the "
        "accountant assumes (the lower bound does not confirm it)"
      )
  return EmpiricalPrivacy(
    estimates=estimates,
    canaries=m,
    inserted=int(inserted.sum()),
    coin_canaries=int(np.asarray(record.coins, bool).sum()),
    pattern=pattern,
    pattern_description=pattern_description,
    rounds=n,
    noise_multiplier=float(noise_multiplier),
    delta=float(delta),
    claim=claim,
    scores=scores,
    inserted_mask=inserted,
    noise_check=check,
    notes=tuple(notes),
    warnings=tuple(warnings),
  )
