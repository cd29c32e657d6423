"""Accountants: the privacy of fedmf's events as ρ-zCDP and (ε, δ), and noise calibration.

One concept, after dp_accounting: events (`fedmf.privacy.events`) describe what is released; this
module computes its privacy. A matrix mechanism releasing C x + σ z with sensitivity s under a
participation schema is one Gaussian mechanism with noise multiplier σ/s (notation of
docs/architecture.md; the mechanisms' Accounting section). Hence

* ρ-zCDP with ρ = s² / (2σ²)  (Bun & Steinke 2016, Prop. 1.6);
* (ε, δ)-DP from the exact Gaussian curve (Balle & Wang 2018, Thm. 8), with μ = s/σ:
  δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2),
  which is what dp_accounting's PLD accountant computes (up to its pessimistic discretization) for
  one `GaussianDpEvent(σ/s)`. The curve and its inverses are `fedmf.privacy.gaussian_curve`.

The accountant is one typed choice (`Accountant`), with one default per use: a claim (one Gaussian
mechanism) is accounted by its exact analytic curve (`CLAIM_ACCOUNTANT`), dp_accounting's PLD
being its cross-check; a Poisson-subsampled event (amplified BandMF, DP-SGD with sampling) has no
closed curve and is accounted by PLD (`AMPLIFIED_ACCOUNTANT`).

Calibration: every σ search is one bracket-and-root routine, `calibrate_sigma(epsilon_of, ...)`,
for any decreasing ε(σ). A claim's σ first inverts the exact curve (a 1-D root in μ, exact to
1e-12: `gaussian_curve.gaussian_mu_for_epsilon`), which is already the answer for the analytic accountant; the
pessimistic PLD is then brought to the target by `calibrate_sigma` from there.

Every sensitivity is unsquared; `min_sep` is the gap b (|i-j| ≥ b), never b - 1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import adaptive_clip
from fedmf.privacy import events
from fedmf.privacy.events import validate_noise_multiplier
from fedmf.privacy import gaussian_curve

# Default PLD discretization (dp_accounting's own default). PLD ε is a pessimistic (upper) estimate.
PLD_VALUE_DISCRETIZATION = 1e-4

# The range of μ = s/σ the accountants resolve. Beyond MAX_MU (ε ≈ μ²/2 > 5e11) the terms of
# log δ(ε), of size μ²/2, cancel to below float64's resolution. Below MIN_PLD_MU (σ/s > 1e100)
# dp_accounting's PLD overflows (it does near σ/s = 1e150); the analytic curve gives ε = 0 there.
MAX_MU = 1e6
MIN_PLD_MU = 1e-100
# dp_accounting truncates the Gaussian where its log-mass is -50, at |x| ≈ 10.3σ, so one Gaussian's
# privacy-loss grid spans about (2·10.3·μ + μ²) / interval points; each costs about 200 bytes and
# 4 µs (measured: 3.1e6 points at μ = 10 take 0.64 GB and 10 s, 1.5e7 at μ = 30 take 2.4 GB, 51 s).
_PLD_TAIL = 10.3
_PLD_BYTES_PER_POINT = 200.0
_PLD_SECONDS_PER_POINT = 4e-6

# The accountant: one typed choice. "analytic": the exact (ε, δ) curve of one Gaussian mechanism
# (Balle & Wang 2018, Thm. 8); "pld": dp_accounting's privacy-loss distribution accountant,
# pessimistic by its discretization, which also composes Poisson-subsampled events.
Accountant = Literal["analytic", "pld"]
_ACCOUNTANTS: tuple[Accountant, ...] = ("pld", "analytic")
# One default per use. A claim is one Gaussian mechanism (a strategy's sensitivity under a schema):
# its exact curve, PLD as the cross-check. An amplified event has no closed curve: PLD.
CLAIM_ACCOUNTANT: Accountant = "analytic"
AMPLIFIED_ACCOUNTANT: Accountant = "pld"


def other_accountant(accountant: Accountant) -> Accountant:
  """The cross-check of `accountant` (the other one)."""
  return "pld" if accountant == "analytic" else "analytic"


@dataclasses.dataclass(frozen=True)
class GaussianAccounting:
  """The privacy of one Gaussian matrix mechanism under one participation schema.

  Attributes:
    sensitivity: Unsquared L2 sensitivity s of the strategy (clip norm 1).
    sensitivity_method: 'exact', 'upper-bound' or 'lower-bound' (a lower bound gives no guarantee).
    sensitivity_algorithm: Name of the algorithm that produced the sensitivity.
    noise_multiplier: σ, the noise std per coordinate of C x divided by the clip norm.
    rho: ρ-zCDP, s²/(2σ²).
    epsilon: ε at ``delta``.
    delta: δ.
    accountant: 'pld' (dp_accounting PLD, pessimistic) or 'analytic' (exact Gaussian curve).
    count_noise_multiplier: z_b of adaptive clipping's count releases (None: a fixed clip), which
      compose with the matrix mechanism (`fedmf.privacy.adaptive_clip`): ρ and ε include them.
    count_releases: k, the count releases of the most-participating device (0: a fixed clip).
  """

  sensitivity: float
  sensitivity_method: str
  sensitivity_algorithm: str
  noise_multiplier: float
  rho: float
  epsilon: float
  delta: float
  accountant: str
  count_noise_multiplier: Optional[float] = None
  count_releases: int = 0

  @property
  def mu(self) -> float:
    """μ of the one Gaussian mechanism the claim is: √((s/σ)² + k/z_b²) (s/σ for a fixed clip)."""
    mechanism = self.sensitivity / self.noise_multiplier if self.noise_multiplier > 0 else math.inf
    return adaptive_clip.combined_mu(mechanism, self.count_noise_multiplier, self.count_releases)

  @property
  def effective_noise_multiplier(self) -> float:
    """1/μ: the noise multiplier of the equivalent single Gaussian mechanism (σ / s without
    adaptive clipping's counts)."""
    if self.count_noise_multiplier is None:
      return self.noise_multiplier / self.sensitivity if self.sensitivity > 0 else math.inf
    mu = self.mu
    return 1.0 / mu if mu > 0 else math.inf

  @property
  def adaptive(self) -> bool:
    """The claim includes adaptive clipping's count releases."""
    return self.count_noise_multiplier is not None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------
# dp_accounting PLD (imported lazily: dp_accounting pulls in a few heavy modules).


def pld_epsilon(
  event: Any, delta: float, value_discretization_interval: float = PLD_VALUE_DISCRETIZATION
) -> float:
  """ε at δ of a dp_accounting DpEvent via the PLD accountant (pessimistic estimate)."""
  from dp_accounting.pld import pld_privacy_accountant  # pylint: disable=g-import-not-at-top

  delta = gaussian_curve.validate_delta(delta)
  resources.check_time()  # --max-seconds: a calibration evaluates ε many times.
  accountant = pld_privacy_accountant.PLDAccountant(
    value_discretization_interval=value_discretization_interval
  )
  accountant.compose(event)
  return float(accountant.get_epsilon(delta))


def pld_gaussian_cost(mu: float) -> resources.Cost:
  """Estimated memory and time of `pld_gaussian_epsilon(mu, ·)`: its privacy-loss grid."""
  points = (2.0 * _PLD_TAIL * mu + mu * mu) / PLD_VALUE_DISCRETIZATION + 2.0
  return resources.Cost.of(
    f"a privacy-loss grid of {points:.3g} points at interval {PLD_VALUE_DISCRETIZATION:g}",
    _PLD_BYTES_PER_POINT * points,
    _PLD_SECONDS_PER_POINT * points,
  )


def pld_gaussian_epsilon(mu: float, delta: float) -> float:
  """ε of one `GaussianDpEvent(1/μ)` from the PLD accountant (its grid estimated first)."""
  if mu <= 0:
    return 0.0
  if mu < MIN_PLD_MU:
    raise FedmfUserError(
      f"σ/s = {1.0 / mu:.3g} is beyond the PLD accountant's range (at most {1.0 / MIN_PLD_MU:.0e});"
      f" use --accountant analytic (the exact curve)"
    )
  try:
    resources.check(pld_gaussian_cost(mu), f"the PLD accountant at σ/s = {1.0 / mu:.3g}")
  except resources.ResourceLimitError as e:
    raise resources.ResourceLimitError(
      f"{e}; or use --accountant analytic (exact, no grid)"
    ) from None
  return pld_epsilon(events.gaussian_event(1.0 / mu), delta)


def _check_mu(mu: float, what: str) -> None:
  if not mu <= MAX_MU:
    raise FedmfUserError(
      f"{what}: μ = s/σ = {mu:.3g} exceeds {MAX_MU:.0e} (ε ≈ μ²/2 above 5e11, where float64 "
      f"cannot resolve the Gaussian curve)"
    )


def gaussian_epsilon_with(mu: float, delta: float, accountant: Accountant) -> float:
  if accountant == "pld":
    epsilon = pld_gaussian_epsilon(mu, delta)
    if not math.isfinite(epsilon):
      # dp_accounting's PLD reports ε = inf for δ below its resolution (about 1e-15).
      raise FedmfUserError(
        f"the PLD accountant cannot resolve delta = {delta:g} (its epsilon is infinite there); "
        f"use --accountant analytic (the exact curve) or a larger delta"
      )
    return epsilon
  if accountant == "analytic":
    return float(gaussian_curve.gaussian_epsilon(mu, delta))
  raise FedmfUserError(f"accountant must be one of {_ACCOUNTANTS}, got {accountant!r}")


# ---------------------------------------------------------------------------------------------------
# Matrix-mechanism accounting.


def strategy_sensitivity(strategy: Any, schema: ParticipationSchema, method: str = "auto"):
  """The strategy's sensitivity under `schema` (also refuses a BandMF built for fewer rounds)."""
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top

  return load_strategy(strategy).checked_sensitivity(schema, method)


def account_sensitivity(
  sensitivity: float,
  noise_multiplier: float,
  delta: float,
  *,
  sensitivity_method: str = "exact",
  sensitivity_algorithm: str = "",
  accountant: Accountant = CLAIM_ACCOUNTANT,
  count_noise_multiplier: Optional[float] = None,
  count_releases: int = 0,
) -> GaussianAccounting:
  """ρ and ε of a Gaussian mechanism with a known (unsquared) sensitivity, composed with adaptive
  clipping's `count_releases` count releases of noise multiplier `count_noise_multiplier` (when
  given): one Gaussian mechanism with μ² = (s/σ)² + k/z_b² (`fedmf.privacy.adaptive_clip`)."""
  sigma = validate_noise_multiplier(noise_multiplier)
  delta = gaussian_curve.validate_delta(delta)
  s = float(sensitivity)
  if not (math.isfinite(s) and s >= 0):
    raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
  with np.errstate(over="ignore"):
    mu = float(np.float64(s) / np.float64(sigma))
  _check_mu(mu, f"noise multiplier {sigma:g} is too small for sensitivity {s:.6g}")
  rho = float(gaussian_curve.rho_zcdp(s, sigma))
  releases = int(count_releases) if count_noise_multiplier is not None else 0
  if count_noise_multiplier is not None:
    z = float(count_noise_multiplier)
    if not (math.isfinite(z) and z >= 0):
      raise FedmfUserError(f"count noise multiplier must be a finite number >= 0, got {z!r}")
    mu = adaptive_clip.combined_mu(mu, z, releases)
    _check_mu(mu, f"count noise multiplier {z:g} is too small for {releases} count releases")
    rho = mu * mu / 2.0
  eps = gaussian_epsilon_with(mu, delta, accountant) if mu > 0 else 0.0
  return GaussianAccounting(
    sensitivity=s,
    sensitivity_method=sensitivity_method,
    sensitivity_algorithm=sensitivity_algorithm,
    noise_multiplier=sigma,
    rho=rho,
    epsilon=eps,
    delta=delta,
    accountant=accountant,
    count_noise_multiplier=None
    if count_noise_multiplier is None
    else float(count_noise_multiplier),
    count_releases=releases,
  )


def account_estimate(
  sens,
  sigma: float,
  delta: float,
  accountant: Accountant = CLAIM_ACCOUNTANT,
  count_noise_multiplier: Optional[float] = None,
  count_releases: int = 0,
) -> GaussianAccounting:
  """`account_sensitivity` of a sensitivity estimate (value, method and algorithm carried over)."""
  return account_sensitivity(
    sens.value,
    sigma,
    delta,
    sensitivity_method=sens.method,
    sensitivity_algorithm=sens.algorithm,
    accountant=accountant,
    count_noise_multiplier=count_noise_multiplier,
    count_releases=count_releases,
  )


def account(
  strategy: Any,
  schema: ParticipationSchema,
  noise_multiplier: float,
  delta: float,
  *,
  method: str = "auto",
  accountant: Accountant = CLAIM_ACCOUNTANT,
  count_noise_multiplier: Optional[float] = None,
) -> GaussianAccounting:
  """Sensitivity, ρ-zCDP and (ε, δ) of a strategy under a participation schema.

  Args:
    strategy: A strategy object, dict or path (`fedmf.mf.strategies.load_strategy`).
    schema: n rounds released, min-sep b, max participations k.
    noise_multiplier: σ, applied to C as loaded.
    delta: δ ∈ (0, 1).
    method: Sensitivity method (`fedmf.mf.strategy.Strategy.sensitivity`).
    accountant: 'analytic' (default): the exact ε of the single Gaussian mechanism the claim is
      (Balle & Wang 2018, Thm. 8); 'pld': dp_accounting's PLD (as BLT Table 4), pessimistic by its
      discretization, as a cross-check.
    count_noise_multiplier: z_b of adaptive clipping (None: a fixed clip); a device in k rounds
      (the schema's effective k) is in k count releases, composed with the matrix mechanism.
  """
  sigma = validate_noise_multiplier(noise_multiplier)
  delta = gaussian_curve.validate_delta(delta)
  sens = strategy_sensitivity(strategy, schema, method)
  return account_estimate(
    sens, sigma, delta, accountant, count_noise_multiplier, schema.effective_max_participations
  )


def calibrate_sigma(
  epsilon_of: Callable[[float], float],
  target_epsilon: float,
  upper: float,
  *,
  rtol: float = 1e-4,
  step: float = 4.0,
  floor: float = 1e-3,
  ceiling: float = math.inf,
) -> float:
  """THE calibrator: the smallest σ (to a relative `rtol`) with epsilon_of(σ) ≤ target, for any ε(σ)
  that decreases in σ (an accountant's ε of an event, a claim, an amplified strategy).

  Bracketed from the guess `upper` by factors of `step` (up while ε is above the target, to at
  most `ceiling`; then down until it is above), then the Illinois variant of regula falsi on log ε
  against log σ (nearly linear), so a calibration costs about 6-10 evaluations of ε instead of the
  ~20 of a bisection. If even `floor` reaches the target, the least σ tried that reaches it is
  returned. The σ returned always satisfies ε(σ) ≤ target (the conservative side).

  Why not dp_accounting's `mechanism_calibration.calibrate_dp_mechanism`: it searches an event's
  parameter with a fresh dp_accounting accountant per step, while a claim's ε here is the exact
  analytic curve (no dp_accounting accountant); its bisection takes about twice the evaluations
  (each a PLD grid of seconds at large μ); and its bracket search starts by evaluating the lower
  endpoint, where PLD at a tiny σ needs huge memory.
  """
  target = gaussian_curve.validate_epsilon(target_epsilon)
  log_target = math.log(target)
  log_step = math.log(step)

  def g(x: float) -> float:
    eps = epsilon_of(math.exp(x))
    return (math.log(eps) if eps > 0 else -745.0) - log_target if math.isfinite(eps) else 745.0

  hi = math.log(upper)
  g_hi = g(hi)
  for _ in range(200):
    if g_hi <= 0:
      break
    hi += log_step
    if hi > math.log(ceiling):
      raise FedmfUserError(f"no noise multiplier <= {ceiling:g} reaches epsilon {target_epsilon}")
    g_hi = g(hi)
  else:
    raise FedmfUserError(f"no noise multiplier reaches epsilon {target_epsilon:g}")
  lo, g_lo = hi, g_hi
  for _ in range(60):
    lo -= log_step
    if lo < math.log(floor):
      return math.exp(hi)  # Even tiny noise reaches the target: conservative.
    g_lo = g(lo)
    if g_lo > 0:
      break
    hi, g_hi = lo, g_lo
  side = 0
  while hi - lo > rtol:
    x = hi - g_hi * (hi - lo) / (g_hi - g_lo)
    x = min(max(x, lo + 0.01 * (hi - lo)), hi - 0.01 * (hi - lo))
    gx = g(x)
    if gx > 0:
      lo, g_lo = x, gx
      if side == -1:
        g_hi /= 2.0
      side = -1
    else:
      hi, g_hi = x, gx
      if side == 1:
        g_lo /= 2.0
      side = 1
  return math.exp(hi)


def calibrate_from_exact(
  epsilon_of: Callable[[float], float],
  target_epsilon: float,
  exact_sigma: float,
  rtol: float = 1e-4,
) -> float:
  """σ for a target ε when `exact_sigma` inverts the exact curve of the same mechanism: that σ
  (raised by 1e-12 against rounding) if `epsilon_of` agrees there (the analytic accountant
  does), else the least σ above it where `epsilon_of` (PLD, pessimistic) reaches the target, by
  `calibrate_sigma` in steps of 1e-3."""
  sigma = exact_sigma * (1.0 + 1e-12)
  if epsilon_of(sigma) <= target_epsilon:
    return sigma
  return calibrate_sigma(epsilon_of, target_epsilon, sigma, rtol=rtol, step=1.0 + 1e-3)


def adaptive_epsilon_function(
  sens,
  delta: float,
  accountant: Accountant,
  releases: int,
  count_noise_multiplier: Optional[float] = None,
  count_budget_fraction: Optional[float] = None,
) -> Callable[[float], GaussianAccounting]:
  """σ -> the accounting of the matrix mechanism with sensitivity estimate `sens` at σ, composed
  with adaptive clipping's k = `releases` count releases: of a fixed noise multiplier z_b, or of
  the z_b that spends the fraction f of μ² on the counts (z_b then follows σ). Without either, the
  fixed-clip accounting. Its `.epsilon` is the `epsilon_of(σ)` that `calibrate_sigma` inverts
  (decreasing in σ)."""

  def accounting_of(sigma: float) -> GaussianAccounting:
    z = count_noise_multiplier
    if count_budget_fraction is not None:
      z = adaptive_clip.count_noise_for_fraction(
        sens.value / sigma, releases, count_budget_fraction
      )
    return account_estimate(sens, sigma, delta, accountant, z, releases)

  return accounting_of


def _exact_sigma(sens, mu: float, releases: int, z: Optional[float], fraction: Optional[float]):
  """σ whose exact-curve μ is the target's μ: μ_mm = s/σ with μ_mm² = μ² − k/z_b² for a fixed z_b,
  (1 − f)·μ² for a budget fraction f, μ² without counts."""
  if fraction is not None:
    return sens.value / (mu * math.sqrt(1.0 - fraction))
  count = adaptive_clip.count_mu(z, releases)
  if count >= mu:
    raise FedmfUserError(
      f"adaptive clipping's {releases} count releases at count noise multiplier {z:g} alone "
      f"exceed the target (their mu {count:.4g} >= the target's {mu:.4g}): raise "
      "adaptive_clip.count_noise_multiplier or use adaptive_clip.count_budget_fraction"
    )
  return sens.value / math.sqrt(mu * mu - count * count)


def calibrate_noise_multiplier(
  strategy: Any,
  schema: ParticipationSchema,
  target_epsilon: float,
  delta: float,
  *,
  method: str = "auto",
  accountant: Accountant = CLAIM_ACCOUNTANT,
  count_noise_multiplier: Optional[float] = None,
  count_budget_fraction: Optional[float] = None,
) -> GaussianAccounting:
  """The smallest σ giving ε ≤ target at δ for the claim (strategy, schema); returns its accounting.

  Inverts the exact Gaussian curve for μ = s/σ (exact to 1e-12: the answer for the analytic
  accountant); for PLD (pessimistic by about its discretization) `calibrate_from_exact` then raises
  σ to within 1e-4 of the least σ whose PLD ε reaches the target, each grid estimated against the
  limits first, and all of them together too.

  With adaptive clipping (`count_noise_multiplier` z_b, or `count_budget_fraction` f) the count
  releases of the schema's k participations are composed in (`adaptive_epsilon_function`): σ
  leaves the target's μ² minus the counts' k/z_b², or (1 − f) of it; the returned accounting holds
  the z_b used.
  """
  target_epsilon = gaussian_curve.validate_epsilon(target_epsilon)
  delta = gaussian_curve.validate_delta(delta)
  sens = strategy_sensitivity(strategy, schema, method)
  releases = schema.effective_max_participations
  mu = gaussian_curve.gaussian_mu_for_epsilon(target_epsilon, delta)
  _check_mu(mu, f"target epsilon {target_epsilon:g} is too large to calibrate")
  accounting_of = adaptive_epsilon_function(
    sens, delta, accountant, releases, count_noise_multiplier, count_budget_fraction
  )
  grids = [0]

  def epsilon_of(sigma: float) -> float:
    grids[0] += 1
    if accountant == "pld" and sens.value > 0 and grids[0] > 1:  # Grids' time adds up.
      z = count_noise_multiplier
      if count_budget_fraction is not None:
        z = adaptive_clip.count_noise_for_fraction(
          sens.value / sigma, releases, count_budget_fraction
        )
      mu_sigma = adaptive_clip.combined_mu(sens.value / sigma, z, releases)
      resources.check(
        resources.Cost(pld_gaussian_cost(mu_sigma).steps * grids[0]),
        f"calibrating σ with the PLD accountant ({grids[0]} grids so far)",
      )
    return accounting_of(sigma).epsilon

  if count_noise_multiplier is None and count_budget_fraction is None:
    exact = sens.value / mu
  else:
    exact = _exact_sigma(sens, mu, releases, count_noise_multiplier, count_budget_fraction)
  sigma = calibrate_from_exact(epsilon_of, target_epsilon, exact)
  result = accounting_of(sigma)
  if result.epsilon <= target_epsilon:
    return result
  # Never report an uncalibrated σ as calibrated.
  raise FedmfUserError(
    f"calibration did not reach epsilon {target_epsilon:g} with the {accountant} accountant "
    f"(epsilon {result.epsilon:.6g} at noise multiplier {result.noise_multiplier:.6g})"
  )


# ---------------------------------------------------------------------------------------------------
# Amplified BandMF and DP-SGD (PLD; calibration by dp_accounting).


def amplified_bandmf_epsilon(
  noise_multiplier: float,
  n: int,
  bands: int,
  sampling_probability: float,
  delta: float,
  max_column_norm: float = 1.0,
) -> float:
  """ε at δ of amplified BandMF (`events.amplified_bandmf_event`)."""
  return pld_epsilon(
    events.amplified_bandmf_event(
      noise_multiplier, n, bands, sampling_probability, max_column_norm
    ),
    delta,
  )


def dpsgd_epsilon(
  noise_multiplier: float, steps: int, delta: float, sampling_probability: float | None = None
) -> float:
  """ε of DP-SGD (C = I): `steps` Gaussian steps, optionally Poisson-subsampled with rate q.

  Without sampling, `steps` compositions of Gaussian(σ) are one Gaussian with μ = √steps/σ, so the
  exact analytic curve is used; with sampling, PLD.
  """
  sigma = validate_noise_multiplier(noise_multiplier)
  if sampling_probability is None or float(sampling_probability) == 1.0:
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
      raise FedmfUserError(f"steps must be an integer >= 1, got {steps!r}")
    return float(gaussian_curve.gaussian_epsilon(math.sqrt(steps) / sigma, delta))
  return pld_epsilon(events.dpsgd_event(sigma, steps, sampling_probability), delta)


def calibrate_event_noise(
  make_event,
  target_epsilon: float,
  delta: float,
  rtol: float = 1e-4,
  min_noise: float = 0.1,
  max_noise: float = 1e7,
) -> float:
  """The smallest σ (to `rtol`) whose event `make_event(σ)` has PLD ε ≤ target at δ.

  `calibrate_sigma` from σ = 1, up to `max_noise` (at small ε amplified BandMF needs σ near 1e6)
  or down to `min_noise` (PLD at a tiny σ needs huge memory); if even `min_noise` reaches the
  target, the least σ tried that reaches it is returned, which is conservative.
  """
  delta = gaussian_curve.validate_delta(delta)
  return calibrate_sigma(
    lambda sigma: pld_epsilon(make_event(sigma), delta),
    target_epsilon,
    1.0,
    rtol=rtol,
    step=2.0,
    floor=min_noise,
    ceiling=max_noise,
  )


def calibrate_dpsgd(
  target_epsilon: float,
  steps: int,
  delta: float,
  sampling_probability: float | None = None,
  rtol: float = 1e-4,
) -> float:
  """The noise multiplier σ for DP-SGD reaching `target_epsilon`."""
  if sampling_probability is None or float(sampling_probability) == 1.0:
    return (
      math.sqrt(steps)
      / gaussian_curve.gaussian_mu_for_epsilon(target_epsilon, delta)
      * (1.0 + 1e-12)
    )
  return calibrate_event_noise(
    lambda s: events.dpsgd_event(s, steps, sampling_probability), target_epsilon, delta, rtol=rtol
  )
