"""The noise check: does the noise the held-out canaries measured match the noise the claim assumes?

One concept: a held-out canary was never inserted, so its per-round projections p (n rounds) are
the noise alone (and the real clients' tiny projections), an independent sample of the released
noise in one direction of model space. K held-out canaries are K i.i.d. samples of N(0, σ²Σ') with
Σ' the noise covariance really added; the claim says Σ' = Σ = P Pᵀ (notation of
docs/empirical-privacy.md). Whitened, z = W p / σ should be N(0, I).

* Scale: r = Σ z² / (nK), the measured per-round noise variance over the claimed one; nK·r/r_true
  ~ χ²_{nK}, which gives an exact 95% interval for r_true. The real clients' updates project on
  the directions too (variance v_s = ‖Σ clipped‖²/(ζ²N) in round s), and consecutive rounds'
  updates point alike, so after whitening they can add up coherently: at most
  Σ_t (Σ_s |W_ts| √v_s)² / (nσ²) of the claimed variance (Cauchy–Schwarz), which is what a
  measured excess is checked against (an excess within it is the clients', not the noise's; a
  deficit is never explained by them).
* The leak of the measured noise: for the canaries' pattern π, the Gaussian μ the noise really
  added gives is μ'² = 1_πᵀ (σ²Σ')⁻¹ 1_π (the optimal test of N(0, σ²Σ') against N(1_π, σ²Σ')).
  With S the sample covariance of the K held-out projections, q = 1_πᵀ S⁻¹ 1_π satisfies
  μ'²/q ~ χ²_{K−n+1}/K exactly (a property of the Wishart distribution: Muirhead 1982, Thm.
  3.2.12), so q(K − n + 1)/K is unbiased for μ'² and the χ² quantiles give a 95% interval. It
  needs K > n held-out canaries. A noise of rank r < n (rounds that repeat or negate others'
  noise) has μ' = ∞ when the pattern moves the releases outside its range, and χ²_{K−r+1} on it
  otherwise. Unlike the canary statistics, whose whitening is the claim's,
  this sees a wrong correlation: noise that cancels where the claim says it adds up.

Both assume Gaussian noise with mean zero (any linear noise stream's), and are estimates with
intervals, not bounds valid against every mechanism.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import scipy.stats

from fedmf.privacy import gaussian_curve

# Held-out canaries beyond the rounds the covariance estimate needs (K ≥ n + MIN_EXTRA).
MIN_EXTRA = 10
# Eigenvalues of the whitened sample covariance below this fraction of the largest are rounding:
# the measured noise has no variance there.
RANK_TOLERANCE = 1e-10


@dataclasses.dataclass(frozen=True)
class NoiseCheck:
  """The noise check's numbers (`to_dict` is the JSON object `noise_check`)."""

  samples: int
  rounds: int
  variance_ratio: float
  variance_ratio_interval: tuple[float, float]
  claimed_mu: float
  measured_mu: Optional[float] = None
  measured_mu_interval: Optional[tuple[float, float]] = None
  measured_epsilon: Optional[float] = None
  note: Optional[str] = None
  # The real clients' share of the whitened variance on the canary directions (their updates
  # project on them too: ‖Σ clipped‖²/(ζ²N) per round), when known: if their projections were
  # independent across rounds, and at most (coherent across rounds).
  clients_fraction: Optional[float] = None
  clients_fraction_max: Optional[float] = None

  @property
  def scale_consistent(self) -> bool:
    lo, hi = self.variance_ratio_interval
    return bool(lo <= 1.0 + (self.clients_fraction_max or 0.0) and hi >= 1.0)

  @property
  def leak_consistent(self) -> Optional[bool]:
    if self.measured_mu_interval is None:
      return None
    lo, hi = self.measured_mu_interval
    return bool(lo <= self.claimed_mu <= hi)

  def to_dict(self) -> dict[str, Any]:
    return {
      "held_out_samples": self.samples,
      "rounds": self.rounds,
      "variance_ratio": self.variance_ratio,
      "variance_ratio_interval": list(self.variance_ratio_interval),
      "scale_consistent": self.scale_consistent,
      "claimed_mu": self.claimed_mu,
      "measured_noise_mu": self.measured_mu,
      "measured_noise_mu_interval": (
        None if self.measured_mu_interval is None else list(self.measured_mu_interval)
      ),
      "measured_noise_epsilon": self.measured_epsilon,
      "leak_consistent": self.leak_consistent,
      "clients_variance_fraction": self.clients_fraction,
      "clients_variance_fraction_max": self.clients_fraction_max,
      "note": self.note,
    }

  def _clients_said(self) -> str:
    if self.clients_fraction_max is None or self.clients_fraction_max < 0.01:
      return ""
    return (
      f" (the real clients' updates, which project on the canary directions too, make up "
      f"{self.clients_fraction:.3g} to at most {self.clients_fraction_max:.3g} of the claimed "
      "noise variance there: large when the noise is small, as in a cheap simulation)"
    )

  def warnings(self) -> list[str]:
    out = []
    if not self.scale_consistent:
      lo, hi = self.variance_ratio_interval
      out.append(
        f"noise check: the held-out canaries measured {self.variance_ratio:.4g}× the claimed "
        f"noise variance (95% {lo:.4g}-{hi:.4g}), not 1"
        + (
          f" nor up to the clients' share {1 + self.clients_fraction_max:.4g}"
          if self.clients_fraction_max
          else ""
        )
        + self._clients_said()
      )
    if self.leak_consistent is False:
      lo, hi = self.measured_mu_interval
      out.append(
        f"noise check: under the noise the held-out canaries measured, the canaries' pattern has "
        f"mu {self.measured_mu:.4g} (95% {lo:.4g}-{hi:.4g}), not the claimed {self.claimed_mu:.4g}: "
        "the noise's correlation or scale differs from the claim"
        + (" (it leaks MORE than claimed)" if lo > self.claimed_mu else " (it leaks less)")
        + self._clients_said()
      )
    return out


def noise_check(
  held_out_projections: np.ndarray,
  whitening: np.ndarray,
  noise_multiplier: float,
  pattern: np.ndarray,
  claimed_mu: float,
  delta: float,
  clients_variance: Optional[float] = None,
) -> NoiseCheck:
  """The check of the module docstring.

  Args:
    held_out_projections: (n, K) projections of the released sums on K held-out directions, over ζ.
    whitening: W of `empirical_statistics.release_whitening`.
    noise_multiplier: σ of the noise the claim says was added.
    pattern: (n,) bool, the rounds of the pattern whose leak is measured (the canaries' strongest).
    claimed_mu: ‖W 1_π‖/σ, the μ the claimed noise gives that pattern over the per-round releases
      (a square C: the analytic μ; the tree: less, see `empirical_statistics`).
    delta: for `measured_epsilon`.
    clients_variance: the real clients' variance on a canary direction, over ζ² (‖Σ clipped‖²/
      (ζ²N)), per round (n,) or one mean for every round; a measured variance above the claimed
      one by at most their coherent share is consistent (module docstring).
  """
  p = np.asarray(held_out_projections, np.float64)
  n, k = p.shape
  z = np.asarray(whitening, np.float64) @ p / noise_multiplier
  dof = n * k
  ratio = float(np.sum(z * z) / dof)
  fraction = fraction_max = None
  if clients_variance is not None:
    w = np.asarray(whitening, np.float64)
    v = np.broadcast_to(np.asarray(clients_variance, np.float64), (n,))
    fraction = float(np.sum((w * w) @ v) / (n * noise_multiplier**2))
    fraction_max = float(np.sum((np.abs(w) @ np.sqrt(v)) ** 2) / (n * noise_multiplier**2))
  interval = (
    float(dof * ratio / scipy.stats.chi2.ppf(0.975, dof)),
    float(dof * ratio / scipy.stats.chi2.ppf(0.025, dof)),
  )
  if k < n + MIN_EXTRA:
    return NoiseCheck(
      k, n, ratio, interval, claimed_mu,
      note=f"the leak of the measured noise needs more held-out canaries ({k}) than rounds ({n}) "
      f"plus {MIN_EXTRA}", clients_fraction=fraction, clients_fraction_max=fraction_max,
    )  # fmt: skip
  a = np.asarray(whitening, np.float64) @ np.asarray(pattern, np.float64) / noise_multiplier
  eigenvalues, eigenvectors = np.linalg.eigh(z @ z.T / k)
  coefficients = eigenvectors.T @ a
  # A noise of rank r < n (rounds that repeat or negate others' noise) gives K ≥ r samples spanning
  # exactly its range (almost surely): S's other eigenvalues are rounding. If the pattern moves
  # the releases outside that range, the noise hides it there not at all: μ' = ∞.
  null = eigenvalues <= RANK_TOLERANCE * eigenvalues.max()
  if np.linalg.norm(coefficients[null]) > RANK_TOLERANCE**0.5 * np.linalg.norm(a):
    return NoiseCheck(
      k, n, ratio, interval, claimed_mu, np.inf, (np.inf, np.inf), np.inf,
      note=f"the measured noise has rank {int((~null).sum())} of {n} rounds and none in a "
      "direction the canaries' pattern moves the releases", clients_fraction=fraction,
      clients_fraction_max=fraction_max,
    )  # fmt: skip
  q = float(np.sum(coefficients[~null] ** 2 / eigenvalues[~null]))
  free = k - int((~null).sum()) + 1  # μ'²/q ~ χ²_{K−r+1}/K on the noise's range (rank r)
  mu = float(np.sqrt(q * free / k))
  mu_interval = (
    float(np.sqrt(q * scipy.stats.chi2.ppf(0.025, free) / k)),
    float(np.sqrt(q * scipy.stats.chi2.ppf(0.975, free) / k)),
  )
  return NoiseCheck(
    k, n, ratio, interval, claimed_mu, mu, mu_interval,
    float(gaussian_curve.gaussian_epsilon(mu, delta)), clients_fraction=fraction,
    clients_fraction_max=fraction_max,
  )  # fmt: skip
