"""What sums the clipped records under fedmf's DP mean: TFF's sum, or TFF's secure summation.

One concept: the `record_aggregation_factory` of TFF's `DifferentiallyPrivateFactory` pattern for
fedmf's aggregator (`fedmf.tff.aggregators`): the clipped records are summed by the factory the
user passes, and only then does the server add the correlated noise. Two factories are accepted,
because the accounting needs every client's contribution to the sum to have norm ≤ ζ_t:

* `tff.aggregators.SumFactory()`: the records are summed as they are.
* `tff.aggregators.SecureSumFactory(upper_bound_threshold=B, lower_bound_threshold=-B)` (constant
  float bounds [lo, hi], e.g. B = ζ, which TFF casts to the values' dtype): TFF clips each
  coordinate to [lo, hi], quantizes it to an
  integer in [0, 2³² − 1] (step Δ = (hi − lo)/(2³² − 1), rounding to nearest), sums the integers
  with `federated_secure_sum_bitwidth` and maps the sum back on the server (TFF's
  `secure_quantized_sum`). fedmf around it:
    1. clips each update to ζ_t·(1 − m) with m = √d·Δ/B + 2⁻²⁰ (d: the model's entries,
       B = min(hi, −lo); 2⁻²⁰ covers the float32 rounding of clipping and scaling), not ζ_t, and
       scales it by B/ζ_t (nothing to scale when a fixed ζ is B up to float32 rounding): the
       record r has norm ≤ B − √d·Δ, so every coordinate lies in [lo, hi] (TFF's coordinate clip
       changes nothing) and the dequantized record, within Δ/2 per coordinate of r, has norm ≤ B;
    2. sums the clipped, zeroed and client counts (and so adaptive clipping's count of clients
       within ζ_t) with `federated_secure_sum_bitwidth` too;
    3. multiplies the dequantized sum by ζ_t/B and only then adds the noise.
  The dequantized record is a function of the client's own clipped update (post-processing) with
  norm ≤ B·(ζ_t/B) = ζ_t: the sensitivity the noise is calibrated for, so the quantization does not
  enter the privacy analysis. Its cost is accuracy: per coordinate of the sum of n records,
  |secure − plain| ≤ n·ζ_t·(m + Δ/(2B)) (`quantization_error_bound`: the margin and the
  rounding), plus float32 rounding of the two sums.

In TFF's simulation runtime (the local C++ execution context fedmf uses) a secure sum runs as its
insecure equivalent, a plain sum, with the same arithmetic: enough to test the composition, not a
deployment of secure aggregation (that is the deployment's runtime).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np
import tensorflow_federated as tff

from fedmf.errors import FedmfUserError

# TFF's secure quantized sum maps [lo, hi] onto the integers 0 .. 2^32 - 1 (primitives._SECAGG_MAX).
SECURE_LEVELS = 2**32 - 1
# Relative slack in the clip margin for the float32 rounding of clipping and scaling a record (a few
# rounding errors of 2^-24 each).
FLOAT_SLACK = 2.0**-20


@dataclasses.dataclass(frozen=True)
class SecureBounds:
  """The constant float bounds [lower, upper] of a `SecureSumFactory` (TFF's quantization range)."""

  lower: float
  upper: float

  @property
  def bound(self) -> float:
    """B: the largest norm whose every coordinate lies in [lower, upper]."""
    return min(self.upper, -self.lower)

  @property
  def step(self) -> float:
    """Δ = (upper − lower) / (2³² − 1): TFF's quantization step."""
    return (self.upper - self.lower) / SECURE_LEVELS

  def as_dtype(self, dtype) -> "SecureBounds":
    """The bounds as TFF's process uses them: cast to the values' dtype (float32: 0.05 becomes
    0.0500000007)."""
    return SecureBounds(float(np.asarray(self.lower, dtype)), float(np.asarray(self.upper, dtype)))

  def margin(self, entries: int) -> float:
    """m = √d·Δ/B + 2⁻²⁰: the relative clip shrink that keeps a dequantized record's norm ≤ B."""
    return math.sqrt(entries) * self.step / self.bound + FLOAT_SLACK


def quantization_error_bound(
  clients: int, clip_norm: float, entries: int, bounds: SecureBounds
) -> float:
  """Bound on |secure sum − plain sum| per coordinate for `clients` records clipped to
  `clip_norm`: n·ζ·(m + Δ/(2B)), the margin and the rounding (float32 rounding of the sums aside)."""
  return clients * clip_norm * (bounds.margin(entries) + 0.5 * bounds.step / bounds.bound)


def secure_bounds(factory: Any) -> SecureBounds:
  """The constant bounds of a `tff.aggregators.SecureSumFactory` (refused: integer or estimated
  thresholds, and bounds that do not contain 0)."""
  # TFF keeps the thresholds as given (SecureSumFactory.__init__); they are checked against the
  # process's own measurements every round (`check_bounds`), so a TFF that stores them otherwise
  # fails loudly instead of quantizing against other bounds.
  upper = getattr(factory, "_upper_bound_threshold", None)
  lower = getattr(factory, "_lower_bound_threshold", None)
  floats = (float, np.floating)
  if not isinstance(upper, floats) or not (lower is None or isinstance(lower, floats)):
    raise FedmfUserError(
      "record_aggregation_factory: fedmf sums the clipped records with a SecureSumFactory of "
      "constant float bounds, e.g. SecureSumFactory(upper_bound_threshold=clip_norm, "
      f"lower_bound_threshold=-clip_norm); got upper {upper!r}, lower {lower!r}"
    )
  upper = float(upper)
  lower = -upper if lower is None else float(lower)
  if not (math.isfinite(upper) and math.isfinite(lower) and lower < 0.0 < upper):
    raise FedmfUserError(
      f"record_aggregation_factory: SecureSumFactory bounds [{lower:g}, {upper:g}] must be "
      "finite and contain 0 (a clipped update's coordinates lie in [-B, B])"
    )
  return SecureBounds(lower, upper)


@dataclasses.dataclass(frozen=True)
class RecordSum:
  """How the clipped records are summed: the factory, and for a secure sum its bounds."""

  factory: Any
  secure: Optional[SecureBounds] = None

  @classmethod
  def of(cls, factory: Any) -> Optional["RecordSum"]:
    """None for no factory (fedmf's own `tff.federated_sum`); refuses factories whose sum the
    accounting cannot vouch for."""
    if factory is None:
      return None
    if isinstance(factory, tff.aggregators.SecureSumFactory):
      return cls(factory, secure_bounds(factory))
    if isinstance(factory, tff.aggregators.SumFactory):
      return cls(factory)
    raise FedmfUserError(
      "record_aggregation_factory must be tff.aggregators.SumFactory() or "
      "tff.aggregators.SecureSumFactory(upper_bound_threshold=B, lower_bound_threshold=-B), got "
      f"{type(factory).__name__}: the accounting needs every client's contribution to the sum to "
      "keep norm <= clip_norm, which fedmf checks for these two"
    )


def sum_counts(flags, secure: bool):
  """The sum of 0/1 client flags at SERVER (a secure sum of 1-bit values under a secure sum)."""
  if secure:
    return tff.federated_secure_sum_bitwidth(flags, bitwidth=1)
  return tff.federated_sum(flags)
