"""User-level accounting of a whole public-features run (count estimation included).

SSP / DP-ALS (Thm. 2 and its proof, App. B.2): every release is a Gaussian mechanism whose noise is
σ times its user-level sensitivity, i.e. GaussianDpEvent(σ). One run releases the item counts once
(noise multiplier σ_c, sensitivity √max_items_per_user) and, per outer step of Algorithm 1, A and b
once each (SSP2, σ). Gaussian mechanisms compose exactly into one Gaussian with
μ² = 1/σ_c² + 2S/σ² (zCDP: ρ = μ²/2 adds up; Bun & Steinke 2016, Lemma 2.3), so the calibration
splits a μ that is exactly (ε, δ)-DP (the analytic Gaussian curve) between the counts (a fraction of
ρ) and the 2S statistics releases; dp_accounting's PLD accountant on the composed DpEvent checks it.

With uniform weights (`weights: uniform`, w_i = w̄/sqrt(|Ω_k|): no counts needed) nothing is spent
on counts and the 2S releases share all of ρ.

AM-DPSGD (Algorithm 6, user-level): S·T Poisson-subsampled Gaussian steps over users (rate q), each
user's clipped gradient. With the App. E.1 weights ("all algorithms use the budget allocation") it
first releases the item counts with the σ_c SSP would use; σ of the steps is then calibrated so the
composition (counts, then the steps) reaches (ε, δ) under dp_accounting's RDP accountant (an upper
bound on ε: conservative).

ε = inf is the non-private reference: every noise multiplier is 0 (nothing is protected).

Not covered, as in the paper: choosing hyper-parameters on validation ratings of the same users
(`--tune`) reads private data outside these mechanisms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedmf.privacy import accounting as base_accounting
from fedmf.privacy import events
from fedmf.privacy import gaussian_curve


@dataclass(frozen=True)
class SspBudget:
  """Noise multipliers of one SSP or DP-ALS run and the (ε, δ) they reach."""

  epsilon: float
  delta: float
  outer_steps: int
  count_fraction: float
  count_noise_multiplier: float  # σ_c: count noise std / √max_items_per_user
  # σ_s of outer step s: noise std of A / (w̄ Γ̃²) and of b / (w̄ Γ̃ Γ_y)
  stats_noise_multipliers: tuple[float, ...] = ()

  @property
  def stats_noise_multiplier(self) -> float:
    """σ of every outer step (the paper's SSP2: one σ); refused when the steps differ."""
    if len(set(self.stats_noise_multipliers)) != 1:
      raise ValueError("the outer steps have different noise: see stats_noise_multipliers")
    return self.stats_noise_multipliers[0]

  @property
  def counts(self) -> bool:
    """Whether the run releases item counts (the App. E.1 weights; not with uniform weights)."""
    return self.count_fraction > 0

  @property
  def mu(self) -> float:
    """μ of the single Gaussian equivalent to the whole run (inf without noise)."""
    sigmas = self.stats_noise_multipliers
    if 0 in sigmas or (self.counts and self.count_noise_multiplier == 0):
      return math.inf
    counts = self.count_noise_multiplier**-2 if self.counts else 0.0
    return math.sqrt(counts + sum(2 * s**-2 for s in sigmas))


def count_noise_multiplier(epsilon: float, delta: float, count_fraction: float) -> float:
  """σ_c of the item counts: a fraction `count_fraction` of the run's ρ = μ²/2 (0 for ε = inf)."""
  if math.isinf(epsilon):
    return 0.0
  mu = gaussian_curve.gaussian_mu_for_epsilon(epsilon, delta)
  return 1.0 / (mu * math.sqrt(count_fraction))


def calibrate_ssp(
  epsilon: float,
  delta: float,
  outer_steps: int,
  count_fraction: float = 0.1,
  last_step_weight: float = 1.0,
) -> SspBudget:
  """Noise multipliers reaching exactly (ε, δ) user-level DP for the whole run. `count_fraction`
  0: no count release (uniform weights), the statistics get all of ρ. `last_step_weight` ω: the
  last outer step's releases get ω times the share of ρ of each earlier step's (1: the paper's
  SSP2, one σ; the earlier steps only give the users a model to fit their embeddings against,
  while the last step's statistics make the released item model)."""
  if not 0.0 <= count_fraction < 1.0:
    raise ValueError(f"count_fraction must be in [0, 1), got {count_fraction!r}")
  if outer_steps < 1:
    raise ValueError(f"outer_steps must be >= 1, got {outer_steps!r}")
  if not (math.isfinite(last_step_weight) and last_step_weight > 0):
    raise ValueError(f"last_step_weight must be a finite number > 0, got {last_step_weight!r}")
  delta = gaussian_curve.validate_delta(delta)
  if math.isinf(epsilon) and epsilon > 0:
    return SspBudget(epsilon, delta, outer_steps, count_fraction, 0.0, (0.0,) * outer_steps)
  epsilon = gaussian_curve.validate_epsilon(epsilon)
  mu = gaussian_curve.gaussian_mu_for_epsilon(epsilon, delta)
  # Split ρ = μ²/2: the counts get count_fraction of it; step s gets a share of the rest,
  # halved between its A and b releases (a Gaussian release of ρ_r has σ = 1/sqrt(2 ρ_r)).
  count_sigma = 1.0 / (mu * math.sqrt(count_fraction)) if count_fraction else math.inf
  shares = [1.0] * (outer_steps - 1) + [last_step_weight]
  rho_stats = (1.0 - count_fraction) * mu**2 / 2
  sigmas = tuple(1.0 / math.sqrt(rho_stats * w / sum(shares)) for w in shares)
  return SspBudget(epsilon, delta, outer_steps, count_fraction, count_sigma, sigmas)


def ssp_event(budget: SspBudget):
  """The dp_accounting event of a whole SSP run: counts (if released), then each outer step's two
  statistics releases."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  stats = [
    dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), 2)
    for sigma in budget.stats_noise_multipliers
  ]
  if not budget.counts:
    return dp_accounting.ComposedDpEvent(stats)
  return dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(budget.count_noise_multiplier), *stats]
  )


def ssp_epsilon(budget: SspBudget, pld: bool = False) -> dict[str, float]:
  """ε of the run at its δ: exact (analytic Gaussian at μ), dp_accounting's RDP (an upper bound,
  fast) and optionally dp_accounting's PLD (pessimistic, slower at large ε); inf without noise."""
  if math.isinf(budget.mu):
    return {"analytic": math.inf}
  import dp_accounting  # pylint: disable=g-import-not-at-top

  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(ssp_event(budget))
  out = {
    "analytic": float(gaussian_curve.gaussian_epsilon(budget.mu, budget.delta)),
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
  count_noise_multiplier: float | None = None  # σ_c of the counts behind the weights; None: none


def dpsgd_event(budget: DpsgdBudget, noise_multiplier: float | None = None):
  """The dp_accounting event of an AM-DPSGD run: the counts (if released), then the steps."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  sigma = budget.noise_multiplier if noise_multiplier is None else noise_multiplier
  steps = events.dpsgd_event(sigma, budget.steps, budget.sampling_probability)
  if budget.count_noise_multiplier is None:
    return steps
  return dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(budget.count_noise_multiplier), steps]
  )


def calibrate_dpsgd(
  epsilon: float,
  delta: float,
  steps: int,
  sampling_probability: float,
  count_noise_multiplier: float | None = None,
) -> DpsgdBudget:
  """σ of user-level DP-SGD (Poisson sampling of users at rate q) reaching (ε, δ) over all steps,
  after the counts' release at `count_noise_multiplier` (None: no counts), calibrated with
  dp_accounting's RDP accountant (an upper bound on ε, so conservative; fast)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  delta = gaussian_curve.validate_delta(delta)
  if math.isinf(epsilon) and epsilon > 0:
    counts = None if count_noise_multiplier is None else 0.0
    return DpsgdBudget(epsilon, delta, steps, sampling_probability, 0.0, counts)
  epsilon = gaussian_curve.validate_epsilon(epsilon)
  budget = DpsgdBudget(epsilon, delta, steps, sampling_probability, 0.0, count_noise_multiplier)
  sigma = dp_accounting.calibrate_dp_mechanism(
    dp_accounting.rdp.RdpAccountant,
    lambda s: dpsgd_event(budget, s),
    epsilon,
    delta,
    bracket_interval=dp_accounting.LowerEndpointAndGuess(0.05, 1.0),
    tol=1e-4,
  )
  return DpsgdBudget(
    epsilon, delta, steps, sampling_probability, float(sigma), count_noise_multiplier
  )


def dpsgd_epsilon(budget: DpsgdBudget, pld: bool = False) -> float:
  """ε of the DP-SGD run: RDP (what the calibration used) or dp_accounting's PLD (tighter)."""
  if budget.noise_multiplier == 0:
    return math.inf
  event = dpsgd_event(budget)
  if pld:
    return base_accounting.pld_epsilon(event, budget.delta)
  import dp_accounting  # pylint: disable=g-import-not-at-top

  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(event)
  return float(rdp.get_epsilon(budget.delta))
