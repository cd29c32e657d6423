"""Privacy accounting for Gaussian matrix mechanisms: sensitivity, noise multiplier → ρ-zCDP and (ε, δ).

One concept: a matrix mechanism releasing ``C x + σ z`` with sensitivity ``s`` under a participation
schema Π is a single Gaussian mechanism with noise multiplier ``σ / s`` (notation of
``docs/architecture.md``; digest ``../shared/notes/mechanisms.md``, section Accounting). Hence

* ρ-zCDP with ρ = s² / (2σ²)  (Bun & Steinke 2016, Prop. 1.6);
* (ε, δ)-DP from the exact Gaussian curve (Balle & Wang 2018, Thm. 8), with μ = s/σ:
  δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2),
  which is what dp_accounting's PLD accountant computes (up to its pessimistic discretization) for
  one ``GaussianDpEvent(σ/s)``.

Also here: σ calibration for a target ε (bisection on the analytic curve), amplified BandMF
(000 §5 Thm. 4, 002 Prop. 2.1: ``ceil(n/b̂)`` Poisson-subsampled Gaussian steps, PLD), DP-SGD with and
without Poisson amplification, and per-round ε curves over realized participation (001 §1, App. C).

Every sensitivity is unsquared; ``min_sep`` is the gap b (|i-j| ≥ b), never b-1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
from scipy import special

from fedmf.errors import FedmfUserError

# Default PLD discretization (dp_accounting's own default). PLD ε is a pessimistic (upper) estimate.
PLD_VALUE_DISCRETIZATION = 1e-4

_ACCOUNTANTS = ("pld", "analytic")


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
  """

  sensitivity: float
  sensitivity_method: str
  sensitivity_algorithm: str
  noise_multiplier: float
  rho: float
  epsilon: float
  delta: float
  accountant: str

  @property
  def effective_noise_multiplier(self) -> float:
    """σ / s: the noise multiplier of the equivalent single Gaussian mechanism."""
    return self.noise_multiplier / self.sensitivity if self.sensitivity > 0 else math.inf

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------
# Validation (one-line user errors).


def validate_delta(delta: float) -> float:
  delta = float(delta)
  if not (math.isfinite(delta) and 0.0 < delta < 1.0):
    raise FedmfUserError(f"delta must be in (0, 1), got {delta!r}")
  return delta


def validate_noise_multiplier(noise_multiplier: float) -> float:
  sigma = float(noise_multiplier)
  if not (math.isfinite(sigma) and sigma > 0.0):
    raise FedmfUserError(f"noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
  return sigma


def validate_epsilon(epsilon: float) -> float:
  eps = float(epsilon)
  if not (math.isfinite(eps) and eps > 0.0):
    raise FedmfUserError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
  return eps


# ---------------------------------------------------------------------------------------------------
# The analytic Gaussian curve (Balle & Wang 2018, Thm. 8; digest, Accounting).


def rho_zcdp(sensitivity: float | np.ndarray, noise_multiplier: float) -> float | np.ndarray:
  """ρ = s² / (2σ²) (Bun & Steinke 2016, Prop. 1.6)."""
  return np.square(sensitivity) / (2.0 * float(noise_multiplier) ** 2)


def _log_gaussian_delta(epsilon: np.ndarray, mu: np.ndarray) -> np.ndarray:
  """log δ(ε) for the Gaussian mechanism with μ = s/σ > 0, stable for tiny δ and large ε.

  δ = Φ(a) - e^ε Φ(b), a = -ε/μ + μ/2, b = -ε/μ - μ/2, so
  log δ = log Φ(a) + log(1 - exp(ε + log Φ(b) - log Φ(a))), and the exponent is < 0.
  """
  epsilon = np.asarray(epsilon, dtype=np.float64)
  mu = np.asarray(mu, dtype=np.float64)
  a = -epsilon / mu + mu / 2.0
  b = -epsilon / mu - mu / 2.0
  log_pa = special.log_ndtr(a)
  x = epsilon + special.log_ndtr(b) - log_pa
  x = np.minimum(x, -1e-300)  # Guard rounding; mathematically x < 0.
  # log(1 - e^x): log(-expm1(x)) near 0, log1p(-exp(x)) for very negative x (Mächler 2012).
  with np.errstate(divide="ignore", invalid="ignore"):
    log1mexp = np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))
  return log_pa + log1mexp


def gaussian_delta(epsilon: float | np.ndarray, mu: float | np.ndarray) -> float | np.ndarray:
  """δ(ε) of the Gaussian mechanism with μ = sensitivity / noise multiplier (exact)."""
  out = np.exp(_log_gaussian_delta(epsilon, mu))
  return float(out) if np.ndim(out) == 0 else out


def gaussian_epsilon(mu: float | np.ndarray, delta: float) -> float | np.ndarray:
  """The smallest ε with δ(ε) ≤ delta for the Gaussian mechanism with μ = s/σ (vectorized, exact).

  Vectorized bisection in float64 on the monotone curve δ(ε), bracketed by 0 and the zCDP
  conversion ε ≤ ρ + 2√(ρ log(1/δ)) (Bun & Steinke 2016, Prop. 1.3). μ = 0 gives ε = 0.
  """
  delta = validate_delta(delta)
  mu_arr = np.atleast_1d(np.asarray(mu, dtype=np.float64))
  if np.any(~np.isfinite(mu_arr)) or np.any(mu_arr < 0):
    raise ValueError("mu must be finite and >= 0")
  eps = np.zeros_like(mu_arr)
  log_delta = math.log(delta)
  pos = mu_arr > 0
  if np.any(pos):
    m = mu_arr[pos]
    # δ(0) = Φ(μ/2) - Φ(-μ/2); if already ≤ δ then ε = 0.
    need = _log_gaussian_delta(np.zeros_like(m), m) > log_delta
    lo = np.zeros_like(m)
    rho = m * m / 2.0
    hi = rho + 2.0 * np.sqrt(rho * math.log(1.0 / delta)) + 1e-12
    # Safety: widen hi until δ(hi) ≤ δ (never triggers in theory).
    for _ in range(60):
      bad = need & (_log_gaussian_delta(hi, m) > log_delta)
      if not np.any(bad):
        break
      hi = np.where(bad, 2.0 * hi + 1.0, hi)
    for _ in range(200):
      mid = 0.5 * (lo + hi)
      above = _log_gaussian_delta(mid, m) > log_delta
      lo = np.where(above, mid, lo)
      hi = np.where(above, hi, mid)
      if np.all(hi - lo <= 4 * np.finfo(np.float64).eps * np.maximum(hi, 1e-300)):
        break
    eps[pos] = np.where(need, hi, 0.0)
  return float(eps[0]) if np.ndim(mu) == 0 else eps


def gaussian_mu_for_epsilon(epsilon: float, delta: float) -> float:
  """The largest μ = s/σ whose Gaussian mechanism is (ε, δ)-DP (bisection on log μ)."""
  epsilon = validate_epsilon(epsilon)
  delta = validate_delta(delta)
  log_delta = math.log(delta)

  def too_big(mu: float) -> bool:
    return float(_log_gaussian_delta(np.float64(epsilon), np.float64(mu))) > log_delta

  lo, hi = 1e-12, 1.0
  while not too_big(hi):
    lo, hi = hi, hi * 2.0
    if hi > 1e12:
      raise FedmfUserError(f"target epsilon {epsilon} is too large to calibrate")
  while too_big(lo):
    lo /= 2.0
    if lo < 1e-300:
      raise FedmfUserError(f"target epsilon {epsilon} is too small to calibrate")
  for _ in range(200):
    mid = math.sqrt(lo * hi)
    if too_big(mid):
      hi = mid
    else:
      lo = mid
    if hi / lo - 1.0 < 1e-14:
      break
  return lo  # Conservative side: δ(ε; lo) ≤ δ.


# ---------------------------------------------------------------------------------------------------
# dp_accounting PLD (imported lazily: dp_accounting pulls in a few heavy modules).


def pld_epsilon(event: Any, delta: float,
                value_discretization_interval: float = PLD_VALUE_DISCRETIZATION) -> float:
  """ε at δ of a dp_accounting DpEvent via the PLD accountant (pessimistic estimate)."""
  from dp_accounting.pld import pld_privacy_accountant  # pylint: disable=g-import-not-at-top
  delta = validate_delta(delta)
  accountant = pld_privacy_accountant.PLDAccountant(
      value_discretization_interval=value_discretization_interval)
  accountant.compose(event)
  return float(accountant.get_epsilon(delta))


def pld_gaussian_epsilon(mu: float, delta: float) -> float:
  """ε of one ``GaussianDpEvent(1/μ)`` from the PLD accountant (digest, Accounting)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  if mu <= 0:
    return 0.0
  return pld_epsilon(dp_accounting.GaussianDpEvent(1.0 / mu), delta)


def gaussian_epsilon_with(mu: float, delta: float, accountant: str) -> float:
  if accountant == "pld":
    return pld_gaussian_epsilon(mu, delta)
  if accountant == "analytic":
    return float(gaussian_epsilon(mu, delta))
  raise FedmfUserError(f"accountant must be one of {_ACCOUNTANTS}, got {accountant!r}")


# ---------------------------------------------------------------------------------------------------
# Matrix-mechanism accounting.


def _sensitivity(strategy: Any, n: int, min_sep: int | None, max_participations: int | None,
                 method: str):
  from fedmf.mf.evaluation import sensitivity  # pylint: disable=g-import-not-at-top
  return sensitivity(strategy, n, min_sep, max_participations, method=method)


def _schema_sensitivity(strategy: Any, n: int, min_sep: int | None, max_participations: int | None,
                        method: str):
  """Validates (n, b, k), then the sensitivity (which also refuses a BandMF built for fewer rounds)."""
  n, min_sep, max_participations = _validate_schema(n, min_sep, max_participations)
  return _sensitivity(strategy, n, min_sep, max_participations, method)


def check_horizon(strategy: Any, n: int) -> None:
  """Refuses a strategy with a finite horizon (BandMF) built for fewer than n rounds."""
  from fedmf.mf.strategies import check_horizon as _check  # pylint: disable=g-import-not-at-top
  _check(strategy, int(n))


def account_sensitivity(sensitivity: float, noise_multiplier: float, delta: float, *,
                        sensitivity_method: str = "exact", sensitivity_algorithm: str = "",
                        accountant: str = "pld") -> GaussianAccounting:
  """ρ and ε of a Gaussian mechanism with a known (unsquared) sensitivity."""
  sigma = validate_noise_multiplier(noise_multiplier)
  delta = validate_delta(delta)
  s = float(sensitivity)
  if not (math.isfinite(s) and s >= 0):
    raise ValueError(f"sensitivity must be finite and >= 0, got {sensitivity!r}")
  mu = s / sigma
  eps = gaussian_epsilon_with(mu, delta, accountant) if mu > 0 else 0.0
  return GaussianAccounting(
      sensitivity=s, sensitivity_method=sensitivity_method,
      sensitivity_algorithm=sensitivity_algorithm, noise_multiplier=sigma,
      rho=float(rho_zcdp(s, sigma)), epsilon=eps, delta=delta, accountant=accountant)


def account(strategy: Any, n: int, min_sep: int | None, max_participations: int | None,
            noise_multiplier: float, delta: float, *, method: str = "auto",
            accountant: str = "pld") -> GaussianAccounting:
  """Sensitivity, ρ-zCDP and (ε, δ) of a strategy for n rounds under b-min-sep with ≤ k participations.

  Args:
    strategy: A strategy object, dict or path (``fedmf.mf.strategies.load_strategy``).
    n: Rounds released.
    min_sep: b (gap); None means single participation.
    max_participations: k; None means ceil(n / b) (unbounded but for the separation).
    noise_multiplier: σ.
    delta: δ ∈ (0, 1).
    method: Sensitivity method passed to ``fedmf.mf.evaluation.sensitivity``.
    accountant: 'pld' (default, as 001 Table 4) or 'analytic'.
  """
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top
  sigma = validate_noise_multiplier(noise_multiplier)
  delta = validate_delta(delta)
  sens = _schema_sensitivity(load_strategy(strategy), n, min_sep, max_participations, method)
  return account_sensitivity(sens.value, sigma, delta, sensitivity_method=sens.method,
                             sensitivity_algorithm=sens.algorithm, accountant=accountant)


def _validate_schema(n: int, min_sep: int | None, max_participations: int | None):
  if int(n) != n or n < 1:
    raise FedmfUserError(f"the number of rounds must be an integer >= 1, got {n!r}")
  n = int(n)
  if min_sep is not None:
    if int(min_sep) != min_sep or min_sep < 1:
      raise FedmfUserError(f"min-sep must be an integer >= 1, got {min_sep!r}")
    min_sep = int(min_sep)
  if max_participations is not None:
    if int(max_participations) != max_participations or max_participations < 1:
      raise FedmfUserError(f"max participations must be an integer >= 1, got {max_participations!r}")
    max_participations = int(max_participations)
  if min_sep is None and max_participations is not None and max_participations > 1:
    min_sep = 1  # k participations in any rounds.
  if min_sep is not None and max_participations is None:
    max_participations = -(-n // min_sep)  # Effective k = ceil(n/b).
  if max_participations == 1:
    min_sep = None
  return n, min_sep, max_participations


def calibrate_noise_multiplier(strategy: Any, n: int, min_sep: int | None,
                               max_participations: int | None, target_epsilon: float,
                               delta: float, *, method: str = "auto",
                               accountant: str = "pld") -> GaussianAccounting:
  """The smallest σ (up to 1e-12 relative) giving ε ≤ target at δ; returns its accounting.

  Bisection on the analytic curve (digest: "Calibrating σ for a target ε is a bisection on this").
  With accountant='pld' the PLD estimate (pessimistic by ≈ the discretization) is then checked and σ
  raised by small steps until the PLD ε is ≤ the target too.
  """
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top
  target_epsilon = validate_epsilon(target_epsilon)
  delta = validate_delta(delta)
  sens = _schema_sensitivity(load_strategy(strategy), n, min_sep, max_participations, method)
  mu = gaussian_mu_for_epsilon(target_epsilon, delta)
  sigma = sens.value / mu * (1.0 + 1e-12)
  result = account_sensitivity(sens.value, sigma, delta, sensitivity_method=sens.method,
                               sensitivity_algorithm=sens.algorithm, accountant=accountant)
  for _ in range(100):
    if result.epsilon <= target_epsilon:
      break
    sigma *= 1.0 + 1e-4
    result = account_sensitivity(sens.value, sigma, delta, sensitivity_method=sens.method,
                                 sensitivity_algorithm=sens.algorithm, accountant=accountant)
  return result


# ---------------------------------------------------------------------------------------------------
# Amplified BandMF and DP-SGD (centralized setting; PLD).


def poisson_gaussian_event(noise_multiplier: float, sampling_probability: float, steps: int):
  """``SelfComposed(PoissonSampled(q, Gaussian(σ)), steps)``; q = 1 means no sampling."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  sigma = validate_noise_multiplier(noise_multiplier)
  q = float(sampling_probability)
  if not 0.0 < q <= 1.0:
    raise FedmfUserError(f"sampling probability must be in (0, 1], got {sampling_probability!r}")
  if int(steps) != steps or steps < 1:
    raise FedmfUserError(f"steps must be an integer >= 1, got {steps!r}")
  event = dp_accounting.GaussianDpEvent(sigma)
  if q < 1.0:
    event = dp_accounting.PoissonSampledDpEvent(q, event)
  return dp_accounting.SelfComposedDpEvent(event, int(steps))


def amplified_bandmf_event(noise_multiplier: float, n: int, bands: int, sampling_probability: float,
                           max_column_norm: float = 1.0):
  """The DpEvent of amplified BandMF (000 §5 Thm. 4; 002 Prop. 2.1; digest, Amplified BandMF).

  Round i Poisson-samples group i mod b̂ with probability q = b̂·B/m; the mechanism is accounted as
  ``ceil(n/b̂)`` Poisson-subsampled Gaussian steps with σ_eff = σ / max column norm of C.
  (000 App. F Example F.1 prints n and m swapped; this is the corrected event.)
  """
  if int(bands) != bands or bands < 1:
    raise FedmfUserError(f"bands must be an integer >= 1, got {bands!r}")
  if not (math.isfinite(max_column_norm) and max_column_norm > 0):
    raise FedmfUserError(f"max column norm must be > 0, got {max_column_norm!r}")
  steps = -(-int(n) // int(bands))
  return poisson_gaussian_event(validate_noise_multiplier(noise_multiplier) / max_column_norm,
                                sampling_probability, steps)


def amplified_bandmf_epsilon(noise_multiplier: float, n: int, bands: int,
                             sampling_probability: float, delta: float,
                             max_column_norm: float = 1.0) -> float:
  """ε at δ of amplified BandMF (see ``amplified_bandmf_event``)."""
  return pld_epsilon(
      amplified_bandmf_event(noise_multiplier, n, bands, sampling_probability, max_column_norm),
      delta)


def bandmf_sampling_probability(batch_size: float, dataset_size: int, bands: int) -> float:
  """q = b̂·B/m: each of the b̂ groups (m/b̂ examples) is sampled with expected batch B."""
  q = float(bands) * float(batch_size) / float(dataset_size)
  if not 0 < q <= 1:
    raise FedmfUserError(f"sampling probability b̂·B/m = {q} is not in (0, 1]")
  return q


def dpsgd_epsilon(noise_multiplier: float, steps: int, delta: float,
                  sampling_probability: float | None = None) -> float:
  """ε of DP-SGD (C = I): ``steps`` Gaussian steps, optionally Poisson-subsampled with rate q.

  Without sampling, ``steps`` compositions of Gaussian(σ) are one Gaussian with μ = √steps/σ, so the
  exact analytic curve is used; with sampling, PLD.
  """
  sigma = validate_noise_multiplier(noise_multiplier)
  if sampling_probability is None or float(sampling_probability) == 1.0:
    if int(steps) != steps or steps < 1:
      raise FedmfUserError(f"steps must be an integer >= 1, got {steps!r}")
    return float(gaussian_epsilon(math.sqrt(steps) / sigma, delta))
  return pld_epsilon(poisson_gaussian_event(sigma, sampling_probability, steps), delta)


def calibrate_event_noise(epsilon_fn, target_epsilon: float, rtol: float = 1e-4,
                          min_noise: float = 0.1, max_noise: float = 1e7) -> float:
  """The smallest σ (to ``rtol``) with ``epsilon_fn(σ) ≤ target`` by bisection (ε decreasing in σ).

  The bracket grows geometrically from σ = 1, up to ``max_noise`` (digest: at small ε amplified
  BandMF needs σ near 1e6) and down to ``min_noise`` (below it PLD discretization needs huge
  memory; if even ``min_noise`` reaches the target, it is returned, which is conservative).
  """
  target_epsilon = validate_epsilon(target_epsilon)
  lo, hi = 1.0, 1.0
  if epsilon_fn(hi) > target_epsilon:
    while True:
      lo, hi = hi, hi * 2.0
      if hi > max_noise:
        raise FedmfUserError(f"no noise multiplier <= {max_noise:g} reaches epsilon {target_epsilon}")
      if epsilon_fn(hi) <= target_epsilon:
        break
  else:
    while True:
      if lo <= min_noise:
        return min_noise
      hi, lo = lo, max(lo / 2.0, min_noise)
      if epsilon_fn(lo) > target_epsilon:
        break
  while hi / lo - 1.0 > rtol:
    mid = math.sqrt(lo * hi)
    if epsilon_fn(mid) > target_epsilon:
      lo = mid
    else:
      hi = mid
  return hi


def calibrate_amplified_bandmf(target_epsilon: float, n: int, bands: int,
                               sampling_probability: float, delta: float,
                               max_column_norm: float = 1.0, rtol: float = 1e-4) -> float:
  """The noise multiplier σ for amplified BandMF reaching ``target_epsilon`` (PLD, bisection)."""
  return calibrate_event_noise(
      lambda s: amplified_bandmf_epsilon(s, n, bands, sampling_probability, delta,
                                         max_column_norm), target_epsilon, rtol=rtol)


def calibrate_dpsgd(target_epsilon: float, steps: int, delta: float,
                    sampling_probability: float | None = None, rtol: float = 1e-4) -> float:
  """The noise multiplier σ for DP-SGD reaching ``target_epsilon``."""
  if sampling_probability is None or float(sampling_probability) == 1.0:
    return math.sqrt(steps) / gaussian_mu_for_epsilon(target_epsilon, delta) * (1.0 + 1e-12)
  return calibrate_event_noise(
      lambda s: dpsgd_epsilon(s, steps, delta, sampling_probability), target_epsilon, rtol=rtol)
