"""User-level accounting of a whole public-features run (count estimation included).

SSP / DP-ALS (Thm. 2 and its proof, App. B.2): every release is a Gaussian mechanism whose noise is
σ times its user-level sensitivity, i.e. GaussianDpEvent(σ). One run releases the item counts once
(noise multiplier σ_c, sensitivity √max_items_per_user) and, per outer step of Algorithm 1, A and b
once each (SSP2, σ). Gaussian mechanisms compose exactly into one Gaussian with
μ² = 1/σ_c² + 2S/σ² (zCDP: ρ = μ²/2 adds up; Bun & Steinke 2016, Lemma 2.3), so the calibration
splits a μ that is exactly (ε, δ)-DP (the analytic Gaussian curve) between the counts (a fraction of
ρ) and the 2S statistics releases; dp_accounting's PLD accountant on the composed DpEvent checks it.

AM-DPSGD (Algorithm 6, user-level): S·T Poisson-subsampled Gaussian steps over users (rate q), each
user's clipped gradient; calibrated with dp_accounting's PLD accountant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmf.privacy import accounting as base_accounting
from fedmf.privacy import events


@dataclass(frozen=True)
class SspBudget:
  """Noise multipliers of one SSP or DP-ALS run and the (ε, δ) they reach."""

  epsilon: float
  delta: float
  outer_steps: int
  count_fraction: float
  count_noise_multiplier: float  # σ_c: count noise std / √max_items_per_user
  stats_noise_multiplier: float  # σ: noise std of A / (w̄ Γ_u²), of b / (w̄ Γ_u Γ_y)

  @property
  def mu(self) -> float:
    """μ of the single Gaussian equivalent to the whole run."""
    return math.sqrt(
      self.count_noise_multiplier**-2 + 2 * self.outer_steps * self.stats_noise_multiplier**-2
    )


def calibrate_ssp(
  epsilon: float, delta: float, outer_steps: int, count_fraction: float = 0.1
) -> SspBudget:
  """Noise multipliers reaching exactly (ε, δ) user-level DP for the whole run."""
  epsilon = base_accounting.validate_epsilon(epsilon)
  delta = base_accounting.validate_delta(delta)
  if not 0.0 < count_fraction < 1.0:
    raise ValueError(f"count_fraction must be in (0, 1), got {count_fraction!r}")
  if outer_steps < 1:
    raise ValueError(f"outer_steps must be >= 1, got {outer_steps!r}")
  mu = base_accounting.gaussian_mu_for_epsilon(epsilon, delta)
  # Split ρ = μ²/2: the counts get count_fraction of it, each of the 2S releases an equal share.
  count_sigma = 1.0 / (mu * math.sqrt(count_fraction))
  stats_sigma = math.sqrt(2 * outer_steps) / (mu * math.sqrt(1.0 - count_fraction))
  return SspBudget(epsilon, delta, outer_steps, count_fraction, count_sigma, stats_sigma)


def ssp_event(budget: SspBudget):
  """The dp_accounting event of a whole SSP run: counts, then 2S statistics releases."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  return dp_accounting.ComposedDpEvent(
    [
      dp_accounting.GaussianDpEvent(budget.count_noise_multiplier),
      dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(budget.stats_noise_multiplier), 2 * budget.outer_steps
      ),
    ]
  )


def ssp_epsilon(budget: SspBudget, pld: bool = False) -> dict[str, float]:
  """ε of the run at its δ: exact (analytic Gaussian at μ), dp_accounting's RDP (an upper bound,
  fast) and optionally dp_accounting's PLD (pessimistic, slower at large ε)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(ssp_event(budget))
  out = {
    "analytic": float(base_accounting.gaussian_epsilon(budget.mu, budget.delta)),
    "rdp": float(rdp.get_epsilon(budget.delta)),
  }
  if pld:
    out["pld"] = base_accounting.pld_epsilon(ssp_event(budget), budget.delta)
  return out


@dataclass(frozen=True)
class DpsgdBudget:
  epsilon: float
  delta: float
  steps: int  # S outer steps × T item steps
  sampling_probability: float
  noise_multiplier: float


def calibrate_dpsgd(
  epsilon: float, delta: float, steps: int, sampling_probability: float
) -> DpsgdBudget:
  """σ of user-level DP-SGD (Poisson sampling of users at rate q) reaching (ε, δ) over all steps,
  calibrated with dp_accounting's RDP accountant (an upper bound on ε, so conservative; fast)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  epsilon = base_accounting.validate_epsilon(epsilon)
  delta = base_accounting.validate_delta(delta)
  sigma = dp_accounting.calibrate_dp_mechanism(
    dp_accounting.rdp.RdpAccountant,
    lambda s: events.dpsgd_event(s, steps, sampling_probability),
    epsilon,
    delta,
    bracket_interval=dp_accounting.LowerEndpointAndGuess(0.05, 1.0),
    tol=1e-4,
  )
  return DpsgdBudget(epsilon, delta, steps, sampling_probability, float(sigma))


def dpsgd_epsilon(budget: DpsgdBudget, pld: bool = False) -> float:
  """ε of the DP-SGD run: RDP (what the calibration used) or dp_accounting's PLD (tighter)."""
  event = events.dpsgd_event(budget.noise_multiplier, budget.steps, budget.sampling_probability)
  if pld:
    return base_accounting.pld_epsilon(event, budget.delta)
  import dp_accounting  # pylint: disable=g-import-not-at-top

  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(event)
  return float(rdp.get_epsilon(budget.delta))
