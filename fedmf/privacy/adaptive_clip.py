"""Quantile-based adaptive clipping (Andrew et al. 2021): its parameters and what its counts cost.

One concept: a clip norm ζ that follows a quantile of the clients' update norms, and the privacy of
the count releases that move it. In round t every client update is clipped to ζ_t and each client
reports b_i = 1 if its update was within ζ_t (‖Δ_i‖ ≤ ζ_t, and not zeroed), else 0. The server
releases the count with Gaussian noise and moves ζ geometrically toward the target quantile γ
(Andrew et al. Alg. 1 with the geometric update of their §3, as tensorflow_privacy's
`QuantileEstimatorQuery(geometric_update=True)`):

  b̃_t     = min(1, max(0, (Σ_i b_i + (z_b / 2)·ξ_t) / n_t)),   ξ_t ~ N(0, 1)
  ζ_{t+1} = ζ_t · exp(−η (b̃_t − γ))

with n_t the round's clients (public under zero-out adjacency: a neighbouring run has the same
cohorts); a round without clients leaves ζ as it is. The TensorFlow implementation, shared by the
training program and the `tff.aggregators` factory so both give the same ζ bit for bit, is
`fedmf.tff.adaptive_clip`.

Privacy (zero-out adjacency; docs/mechanisms.md, *Adaptive clipping*). Centred as b_i − ½, a
client's report changes by at most ½ when the client is zeroed out (its report becomes 0), so one
count release is a Gaussian mechanism with noise multiplier z_b = std / ½ (the `count_noise_
multiplier`), and a device in k rounds is in k releases: μ_count = √k / z_b. Round t's correlated
noise is scaled by ζ_t, a function of earlier releases only, so dividing round t's release by ζ_t
gives the fixed-clip mechanism with unit clip on adaptively chosen inputs (Denisov et al. 2022,
Thm. 2.1): μ_mm = s / σ as without adaptive clipping. The two compose as one Gaussian mechanism
(Andrew et al. Thm. 1 for one round; Dong, Roth and Su 2022, Cor. 3.3 for μ-GDP):

  μ² = (s / σ)² + k / z_b²,   ρ = μ² / 2.

Adding the worst case of each part is an upper bound (exact when the pattern that maximizes the
matrix mechanism's sensitivity has k participations, as it does for every strategy with X ≥ 0).

Andrew et al. (§3) recommend a count noise σ_b = m / 20 for m expected clients per round, i.e.
z_b = m / 10 (`default_count_noise_multiplier`); `count_budget_fraction` f instead spends the
fraction f of the total μ² (equivalently of ρ) on the counts.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Optional

from fedmf.errors import FedmfUserError

# Andrew et al. §3: σ_b = m / 20 for m expected clients per round. fedmf's count noise multiplier
# is std / sensitivity with sensitivity ½ (the centred report), so z_b = 2 σ_b = m / 10.
RECOMMENDED_COUNT_STD_PER_CLIENT = 1.0 / 20.0


def _number(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise FedmfUserError(f"{name} must be a number, got {type(value).__name__} {str(value)[:40]!r}")
  number = float(value)
  if not math.isfinite(number):
    raise FedmfUserError(f"{name} must be finite, got {value!r}")
  return number


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
  """The adaptive clip's parameters (config section `adaptive_clip`; docs/simulation.md).

  Attributes:
    target_quantile: γ in [0, 1], the fraction of client updates ζ should leave unclipped.
    initial: ζ_0 > 0, the clip norm of round 0.
    learning_rate: η ≥ 0 of the geometric update (ζ changes by at most a factor e^η a round).
    count_noise_multiplier: z_b ≥ 0, std of the count's noise divided by ½ (the sensitivity of a
      client's centred report), as accounted (the papers' cheap simulation scales it like σ).
      None: Andrew et al.'s recommendation, z_b = m / 10 for m clients per round.
    count_budget_fraction: f in (0, 1): instead of z_b, spend the fraction f of the total μ² on
      the counts (z_b then follows from σ, the sensitivity and k).
  """

  target_quantile: float = 0.5
  initial: float = 0.1
  learning_rate: float = 0.2
  count_noise_multiplier: Optional[float] = None
  count_budget_fraction: Optional[float] = None

  def validate(self, prefix: str = "adaptive_clip.") -> "AdaptiveClip":
    """Returns self; raises FedmfUserError naming the key of a value out of range."""
    gamma = _number(f"{prefix}target_quantile", self.target_quantile)
    if not 0.0 <= gamma <= 1.0:
      raise FedmfUserError(
        f"{prefix}target_quantile must lie in [0, 1], got {self.target_quantile!r}"
      )
    initial = _number(f"{prefix}initial", self.initial)
    if not initial > 0.0:
      raise FedmfUserError(f"{prefix}initial must be a number > 0, got {self.initial!r}")
    if not _number(f"{prefix}learning_rate", self.learning_rate) >= 0.0:
      raise FedmfUserError(f"{prefix}learning_rate must be >= 0, got {self.learning_rate!r}")
    if self.count_noise_multiplier is not None:
      if not _number(f"{prefix}count_noise_multiplier", self.count_noise_multiplier) >= 0.0:
        raise FedmfUserError(
          f"{prefix}count_noise_multiplier must be >= 0, got {self.count_noise_multiplier!r}"
        )
    if self.count_budget_fraction is not None:
      fraction = _number(f"{prefix}count_budget_fraction", self.count_budget_fraction)
      if not 0.0 < fraction < 1.0:
        raise FedmfUserError(
          f"{prefix}count_budget_fraction must lie in (0, 1), got {self.count_budget_fraction!r}"
        )
      if self.count_noise_multiplier is not None:
        raise FedmfUserError(
          f"give {prefix}count_noise_multiplier or {prefix}count_budget_fraction, not both"
        )
    return self

  def with_count_noise(self, count_noise_multiplier: float) -> "AdaptiveClip":
    """The same clip with z_b resolved (no budget fraction left)."""
    return dataclasses.replace(
      self, count_noise_multiplier=float(count_noise_multiplier), count_budget_fraction=None
    )


def default_count_noise_multiplier(clients_per_round: float) -> float:
  """Andrew et al.'s σ_b = m / 20 as fedmf's z_b = std / ½ = m / 10 (m: clients per round)."""
  return 2.0 * RECOMMENDED_COUNT_STD_PER_CLIENT * float(clients_per_round)


def count_mu(count_noise_multiplier: Optional[float], releases: int) -> float:
  """μ of a device's `releases` count releases: √k / z_b (0 without adaptive clipping or releases;
  inf when z_b = 0, i.e. exact counts)."""
  if count_noise_multiplier is None or releases <= 0:
    return 0.0
  if count_noise_multiplier == 0:
    return math.inf
  return math.sqrt(releases) / float(count_noise_multiplier)


def combined_mu(
  mechanism_mu: float, count_noise_multiplier: Optional[float], releases: int
) -> float:
  """μ = √(μ_mm² + k / z_b²): the matrix mechanism and the count releases as one Gaussian."""
  return math.hypot(mechanism_mu, count_mu(count_noise_multiplier, releases))


def count_noise_for_fraction(mechanism_mu: float, releases: int, fraction: float) -> float:
  """z_b that spends the fraction f of μ² on the counts: k / z_b² = f / (1 - f) · μ_mm²."""
  if releases <= 0 or mechanism_mu <= 0:
    return math.inf
  return math.sqrt(releases * (1.0 - fraction) / fraction) / mechanism_mu


def describe(clip: AdaptiveClip) -> str:
  """The clip in words, for plans and reports."""
  z = clip.count_noise_multiplier
  count = "count noise multiplier " + (f"{z:.6g}" if z is not None else "(not resolved)")
  return (
    f"adaptive clipping to the {clip.target_quantile:g} quantile of the update norms "
    f"(Andrew et al. 2021: initial clip {clip.initial:g}, learning rate {clip.learning_rate:g}, "
    f"{count})"
  )
