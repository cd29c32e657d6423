"""Estimators of ε from canary statistics: a Gaussian fit, and a one-run lower bound with confidence.

One concept: from one statistic per canary (higher = more likely inserted) and which canaries were
inserted, estimate and lower-bound the privacy loss. Generic: any canary experiment (fedmf's
training rounds, a user's TFF loop, `fedmf public-features`) passes its statistics and its claim.

* `gaussian_fit` (Andrew et al. 2024, §3-4: fit Gaussians to the inserted and the held-out
  statistics): μ̂ = (mean of inserted − mean of held-out) / sd of held-out, the μ of a μ-GDP
  mechanism (Dong, Roth & Su 2022) with that separation, and its ε at δ (the exact Gaussian curve,
  Balle & Wang 2018 Thm. 8). An estimate, not a bound: it assumes the statistics are Gaussian
  with equal variance, as they are under a correct Gaussian mechanism.

* `one_run_lower_bound` (Mahloujifar, Melis & Chaudhuri 2024, "Auditing f-differential privacy in
  one run", the audit with cap for the Gaussian trade-off curve; as in jax_privacy's
  `CanaryScoreAuditor.epsilon_one_run_fdp`): among m canaries each inserted on an independent fair
  coin, guess "inserted" for the k highest statistics; v of them are right. The largest μ whose
  μ-GDP claim these counts falsify at the stated significance is μ_lower; `epsilon_lower` is its ε
  at δ. Valid for any mechanism (no assumption on the statistics' distribution), in one run,
  because the coins are independent: with probability ≥ confidence, the mechanism is not
  μ-GDP for any μ < μ_lower, so ε_lower above the analytic ε of a μ-GDP claim refutes that
  claim. A few guess counts k are tried, with a Bonferroni correction over them. It is loose:
  with m canaries and perfect separation it cannot exceed a cap (about μ = 1.7 for m = 1000 at
  95%: docs/empirical-privacy.md), so it proves large leaks only with many canaries, and never
  proves privacy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import scipy.optimize
import scipy.special

from fedmf.privacy import accounting
from fedmf.privacy import gaussian_curve

CONFIDENCE = 0.95
# The guess counts tried, as fractions of the coin canaries (Bonferroni over the distinct counts).
GUESS_FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)
LOWER_BOUND_METHOD = (
  "f-DP one-run audit with cap for Gaussian DP (Mahloujifar, Melis & Chaudhuri 2024), Bonferroni "
  "over the guess counts"
)


@dataclasses.dataclass(frozen=True)
class GaussianFit:
  """Andrew et al.'s fit: Gaussians to the inserted and held-out statistics, μ̂ and its ε at δ.

  `mu_stderr` is the delta-method standard error of μ̂ (the means' and the held-out sd's sampling
  error); `epsilon_interval` the ε of μ̂ ± 1.96·stderr (clipped at 0).
  """

  inserted: int
  held_out: int
  inserted_mean: float
  inserted_sd: float
  held_out_mean: float
  held_out_sd: float
  mu: float
  mu_stderr: float
  epsilon: float
  epsilon_interval: tuple[float, float]

  def to_dict(self) -> dict:
    return {
      "inserted": self.inserted,
      "held_out": self.held_out,
      "inserted_mean": self.inserted_mean,
      "inserted_sd": self.inserted_sd,
      "held_out_mean": self.held_out_mean,
      "held_out_sd": self.held_out_sd,
      "mu_estimate": self.mu,
      "mu_stderr": self.mu_stderr,
      "epsilon_estimate": self.epsilon,
      "epsilon_estimate_interval": list(self.epsilon_interval),
    }


def _epsilon(mu: float, delta: float) -> float:
  return float(gaussian_curve.gaussian_epsilon(max(float(mu), 0.0), delta)) if mu > 0 else 0.0


def gaussian_fit(inserted: np.ndarray, held_out: np.ndarray, delta: float) -> GaussianFit:
  """μ̂ and ε̂ from the inserted and held-out canaries' statistics (NaNs are dropped).

  Raises ValueError with fewer than two statistics on either side.
  """
  x = np.asarray(inserted, np.float64)
  y = np.asarray(held_out, np.float64)
  x, y = x[np.isfinite(x)], y[np.isfinite(y)]
  if x.size < 2 or y.size < 2:
    raise ValueError(
      f"the Gaussian fit needs at least 2 inserted and 2 held-out canaries with a statistic, got "
      f"{x.size} and {y.size}"
    )
  mx, my = float(x.mean()), float(y.mean())
  sx, sy = float(x.std(ddof=1)), float(y.std(ddof=1))
  if not sy > 0:
    raise ValueError("the held-out canaries' statistics have no spread: no noise was measured")
  mu = (mx - my) / sy
  # Var(μ̂) ≈ (s_x²/n_x + s_y²/n_y)/s_y² + μ²/(2(n_y − 1)) (the sd's relative variance).
  stderr = math.sqrt(
    (sx * sx / x.size + sy * sy / y.size) / (sy * sy) + mu * mu / (2 * (y.size - 1))
  )
  lo, hi = mu - 1.959963984540054 * stderr, mu + 1.959963984540054 * stderr
  return GaussianFit(
    inserted=int(x.size),
    held_out=int(y.size),
    inserted_mean=mx,
    inserted_sd=sx,
    held_out_mean=my,
    held_out_sd=sy,
    mu=mu,
    mu_stderr=stderr,
    epsilon=_epsilon(mu, delta),
    epsilon_interval=(_epsilon(lo, delta), _epsilon(hi, delta)),
  )


@dataclasses.dataclass(frozen=True)
class LowerBound:
  """A one-run lower bound: with probability ≥ `confidence`, the mechanism is not μ-GDP for any
  μ < `mu`, hence ε at δ of any valid μ-GDP claim is ≥ `epsilon`.

  `guesses` and `correct` are those of the guess count that gave the bound (0, 0 when none
  falsified anything); `canaries` the coin canaries the audit used.
  """

  mu: float
  epsilon: float
  confidence: float
  canaries: int
  guesses: int
  correct: int
  method: str = LOWER_BOUND_METHOD

  def to_dict(self) -> dict:
    return {
      "mu_lower": self.mu,
      "epsilon_lower": self.epsilon,
      "confidence": self.confidence,
      "lower_bound_canaries": self.canaries,
      "lower_bound_guesses": self.guesses,
      "lower_bound_correct": self.correct,
      "lower_bound_method": self.method,
    }


def _phi(x: float) -> float:
  return 0.5 * math.erfc(-x / math.sqrt(2.0))


def fdp_audit_margin(mu: float, canaries: int, guesses: int, correct: int, significance: float):
  """> 0 when `correct` right guesses out of `guesses` among `canaries` coin canaries falsify
  μ-GDP at `significance` (the audit with cap of Mahloujifar, Melis & Chaudhuri 2024, for the
  Gaussian trade-off f(α) = Φ(Φ⁻¹(1 − α) − μ) of Dong, Roth & Su 2022; written after
  jax_privacy's `_epsilon_one_run_fdp`, parametrized by μ instead of ε at δ).

  It walks the correct guesses down from v − 1, raising the mass h of wrong guesses a μ-GDP
  mechanism must allow for the mass r of right ones (h ≥ f(1 − r) = Φ(Φ⁻¹(r) − μ)); the counts are
  impossible, at the significance, when r + h exceeds the guessed fraction k/m.
  """
  r = significance * correct / canaries
  h = significance * (guesses - correct) / canaries
  for i in range(correct - 1, -1, -1):
    h_new = max(h, _phi(float(scipy.special.ndtri(r)) - mu)) if r < 1.0 else 1.0
    if h_new == h:
      break  # Neither h nor r changes again.
    r = min(r + (i / (guesses - i)) * (h_new - h), 1.0)
    h = h_new
  return r + h - guesses / canaries


def fdp_mu_lower(canaries: int, guesses: int, correct: int, significance: float) -> float:
  """The largest μ whose μ-GDP claim the counts falsify at `significance` (0 if none)."""

  def margin(mu: float) -> float:
    return fdp_audit_margin(mu, canaries, guesses, correct, significance)

  if correct == 0 or margin(0.0) <= 0:
    return 0.0
  lo, hi = 0.0, 1.0
  while margin(hi) > 0:
    lo, hi = hi, 2.0 * hi
    if hi > accounting.MAX_MU:
      return accounting.MAX_MU
  return float(scipy.optimize.brentq(margin, lo, hi, xtol=1e-7))


def guess_counts(canaries: int) -> tuple[int, ...]:
  """The guess counts tried among `canaries` coin canaries (fixed before the statistics are seen)."""
  return tuple(sorted({max(1, int(round(f * canaries))) for f in GUESS_FRACTIONS}))


def one_run_lower_bound(
  scores: np.ndarray,
  inserted: np.ndarray,
  delta: float,
  *,
  confidence: float = CONFIDENCE,
  coins: Optional[np.ndarray] = None,
) -> LowerBound:
  """The one-run lower bound of the module docstring.

  Args:
    scores: one statistic per canary, higher when more likely inserted (NaN: no statistic, not
      guessed and not counted).
    inserted: bool per canary, whether it was inserted.
    delta: δ of the reported ε.
    confidence: the probability the bound holds (0.95).
    coins: bool per canary, whether its insertion was an independent fair coin (default: all).
      Only these canaries take part: the theorem needs the coins.
  """
  scores = np.asarray(scores, np.float64)
  inserted = np.asarray(inserted, bool)
  use = np.isfinite(scores) & (np.ones_like(inserted) if coins is None else np.asarray(coins, bool))
  s, truth = scores[use], inserted[use]
  m = int(s.size)
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
  if m == 0:
    return LowerBound(0.0, 0.0, confidence, 0, 0, 0)
  order = np.argsort(-s, kind="stable")
  counts = guess_counts(m)
  significance = (1.0 - confidence) / len(counts)
  best = (0.0, 0, 0)
  for k in counts:
    v = int(truth[order[:k]].sum())
    mu = fdp_mu_lower(m, k, v, significance)
    if mu > best[0]:
      best = (mu, k, v)
  mu, k, v = best
  return LowerBound(mu, _epsilon(mu, delta), confidence, m, k, v)
