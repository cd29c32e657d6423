"""Sensitivity and error of a strategy: the dispatch every tool uses.

One concept: given a loaded strategy (see `fedmf.mf.strategies`), a horizon n and a participation
schema (b = `min_sep`, k = `max_participations`), compute its sensitivity (saying how it was
obtained) and its per-round errors, with the structured formula of each mechanism. Notation follows
docs/architecture.md; every returned sensitivity, error and loss is unsquared.

Loss definitions (BandMF Eq. 3–4; BLT §3):
  per-round error e_i = ‖row_i(B)‖ with B = A C⁻¹ (tree: A times the per-round decoder),
  MaxError = max_i e_i, RmsError = sqrt(mean_i e_i²), MaxLoss = sens·MaxError, RmsLoss = sens·RmsError.
With noise multiplier σ applied to C as loaded (noise ζσ·z on C x), the RMSE of the released
estimates A x is ζσ·RmsError; with σ calibrated for sensitivity 1 it is ζσ·RmsLoss.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Union

import numpy as np

from fedmf.mf import resources
from fedmf.mf import workloads
from fedmf.mf import strategies as st
from fedmf.mf.schema import ParticipationSchema
from fedmf.mf.sensitivity import Sensitivity

Workload = Union[None, str, np.ndarray]


def sensitivity(
  strategy: Any,
  n: int | ParticipationSchema,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  method: str = "auto",
) -> Sensitivity:
  """Sensitivity of `strategy` under a participation schema (or n, b, k); see Strategy.sensitivity.

  min_sep None means single participation (or any rounds, when max_participations > 1).
  """
  strategy = st.load_strategy(strategy)
  schema = ParticipationSchema.of(n, min_sep, max_participations)
  return strategy.checked_sensitivity(schema, method)


def _at(strategy, n: int) -> str:
  return f"{strategy.describe()} at n={n}"


def _is_dense(workload: Workload) -> bool:
  """Whether the errors need the dense route (any workload but the prefix sum)."""
  if workload is None or isinstance(workload, str):
    return workload not in (None, "prefix")
  return True  # An explicit matrix (a prefix-sum one is detected once it is checked).


def _workload_matrix(workload: Workload, n: int) -> Optional[np.ndarray]:
  """None for the prefix-sum workload (structured formulas apply), else the dense A."""
  if workload is None or (isinstance(workload, str) and workload == "prefix"):
    return None
  a = (
    workloads.by_name(workload, n)
    if isinstance(workload, str)
    else np.asarray(workload, dtype=np.float64)
  )
  if a.shape != (n, n):
    raise st.StrategyError(f"workload must be an {n}×{n} matrix, got shape {a.shape}")
  return None if workloads.is_prefix_sum(a) else a


def decoder_row_sq_norms(strategy: Any, n: int, workload: Workload = None) -> np.ndarray:
  """Squared per-round errors ‖row_i(A C⁻¹)‖², sensitivity excluded, in float64."""
  strategy = st.load_strategy(strategy)
  strategy.check_horizon(n)
  resources.check(strategy.error_cost(n, _is_dense(workload)), f"the errors of {_at(strategy, n)}")
  return strategy.decoder_row_sq_norms(n, _workload_matrix(workload, n))


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """Errors and losses of a strategy under a participation schema (all unsquared)."""

  mechanism: str
  n: int
  min_sep: Optional[int]
  max_participations: Optional[int]
  effective_max_participations: int
  workload: str
  sensitivity: float
  sensitivity_method: str
  sensitivity_algorithm: str
  max_error: float
  rms_error: float
  max_loss: float
  rms_loss: float
  per_round_error: np.ndarray = dataclasses.field(repr=False)

  def rmse(self, noise_multiplier: float) -> float:
    """RMSE of the released estimates when noise multiplier σ is applied to C as loaded (ζ = 1)."""
    return noise_multiplier * self.rms_error

  def to_dict(self, include_per_round: bool = False) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    per_round = out.pop("per_round_error")
    if include_per_round:
      out["per_round_error"] = per_round.tolist()
    return out


def evaluate(
  strategy: Any,
  n: int | ParticipationSchema,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  workload: Workload = None,
  method: str = "auto",
) -> Evaluation:
  """Sensitivity, MaxError, RmsError, MaxLoss and RmsLoss of `strategy` (see module docstring)."""
  strategy = st.load_strategy(strategy)
  schema = ParticipationSchema.of(n, min_sep, max_participations)
  strategy.check_horizon(schema.n)
  # Estimated before any work: refused in one line naming the estimate and the limit.
  resources.check(
    strategy.evaluation_cost(schema, _is_dense(workload), method),
    f"evaluating {_at(strategy, schema.n)}",
  )
  sens = strategy.sensitivity(schema, method)
  sq = decoder_row_sq_norms(strategy, schema.n, workload)
  per_round = np.sqrt(np.maximum(sq, 0.0))
  max_error = float(per_round.max())
  rms_error = float(math.sqrt(np.mean(sq)))
  if not (math.isfinite(sens.value) and math.isfinite(rms_error) and math.isfinite(max_error)):
    # The conditioning check at load makes this unreachable for loaded strategies; never print inf.
    raise st.StrategyError(
      f"evaluating {_at(strategy, schema.n)} overflows float64: sensitivity {sens.value:.3g}, "
      f"max error {max_error:.3g}"
    )
  workload_name = (
    workload if isinstance(workload, str) else ("prefix" if workload is None else "custom")
  )
  return Evaluation(
    mechanism=strategy.mechanism,
    n=schema.n,
    min_sep=schema.min_sep,
    max_participations=schema.max_participations,
    effective_max_participations=schema.effective_max_participations,
    workload=workload_name,
    sensitivity=sens.value,
    sensitivity_method=sens.method,
    sensitivity_algorithm=sens.algorithm,
    max_error=max_error,
    rms_error=rms_error,
    max_loss=sens.value * max_error,
    rms_loss=sens.value * rms_error,
    per_round_error=per_round,
  )
