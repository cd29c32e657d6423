"""The exact privacy of one Gaussian mechanism: ρ-zCDP and its (ε, δ) curve, and their inputs.

One concept: the curve of a Gaussian mechanism with μ = s/σ (sensitivity over noise multiplier),

* ρ-zCDP with ρ = s² / (2σ²)  (Bun & Steinke 2016, Prop. 1.6);
* δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2)  (Balle & Wang 2018, Thm. 8),

evaluated in log space, and inverted for ε at δ and for μ at (ε, δ) by bisection in float64. It is
what dp_accounting's PLD accountant computes, up to its pessimistic discretization, for one
`GaussianDpEvent(σ/s)`; `fedmf.privacy.accounting` chooses between the two (docs/mechanisms.md,
Accounting). Kept apart from the accountants because everything that states a privacy level uses
it: the accountants, the audit's ε curve, the empirical (canary) estimators and public features.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from fedmf.errors import FedmfUserError

# ---------------------------------------------------------------------------------------------------
# Validation (one-line user errors).


def validate_delta(delta: float) -> float:
  delta = float(delta)
  if not (math.isfinite(delta) and 0.0 < delta < 1.0):
    raise FedmfUserError(f"delta must be in (0, 1), got {delta!r}")
  return delta


def validate_epsilon(epsilon: float) -> float:
  eps = float(epsilon)
  if not (math.isfinite(eps) and eps > 0.0):
    raise FedmfUserError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
  return eps


# ---------------------------------------------------------------------------------------------------
# The analytic Gaussian curve (Balle & Wang 2018, Thm. 8; docs/mechanisms.md, Accounting).


def rho_zcdp(sensitivity: float | np.ndarray, noise_multiplier: float) -> float | np.ndarray:
  """ρ = s² / (2σ²) (Bun & Steinke 2016, Prop. 1.6)."""
  # In numpy floats: a σ² that overflows gives ρ = 0 (its true value underflows) instead of an
  # OverflowError; otherwise the same operations as in Python floats.
  with np.errstate(over="ignore", under="ignore"):
    return np.square(sensitivity) / (2.0 * np.float64(noise_multiplier) ** 2)


def _log_gaussian_delta(epsilon: np.ndarray, mu: np.ndarray) -> np.ndarray:
  """log δ(ε) for the Gaussian mechanism with μ = s/σ > 0, stable for tiny δ and large ε.

  δ = Φ(a) - e^ε Φ(b), a = -ε/μ + μ/2, b = -ε/μ - μ/2, so
  log δ = log Φ(a) + log(1 - exp(ε + log Φ(b) - log Φ(a))), and the exponent is < 0.
  """
  epsilon = np.asarray(epsilon, dtype=np.float64)
  mu = np.asarray(mu, dtype=np.float64)
  # Far in the tails (ε/μ beyond ~1e154, e.g. the bracket search at μ = 1e-300) both log Φ are
  # -inf and x is NaN, which compares False and leaves the bisection's bracket as it is.
  with np.errstate(over="ignore", invalid="ignore"):
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
