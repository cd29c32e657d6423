"""Sensitivity and error of a strategy: the dispatch every tool uses.

One concept: given a loaded strategy (see `fedmf.mf.strategies`), a horizon n and a participation
schema (b = `min_sep`, k = `max_participations`), compute its sensitivity (saying how it was
obtained) and its per-round errors, with the structured formula of each mechanism. Notation follows
docs/architecture.md; every returned sensitivity, error and loss is unsquared.

Loss definitions (000 Eq. 3–4; 001 §3):
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
import scipy.linalg

from fedmf.mf import sensitivity as sens_lib
from fedmf.mf import strategies as st
from fedmf.mf.sensitivity import AssumptionError, Sensitivity

SENSITIVITY_METHODS = ("auto", "upper-bound", "lower-bound")

Workload = Union[None, str, np.ndarray]


def _participation(n: int, min_sep: Optional[int], max_participations: Optional[int]) -> tuple[int, int]:
  """(b, k_eff); min_sep None means single participation."""
  if min_sep is None:
    return n, 1
  if isinstance(min_sep, bool) or int(min_sep) != min_sep or min_sep < 1:
    raise st.StrategyError(f"min_sep must be an integer >= 1, got {min_sep!r}")
  if max_participations is not None and (int(max_participations) != max_participations or max_participations < 1):
    raise st.StrategyError(f"max_participations must be an integer >= 1, got {max_participations!r}")
  return int(min_sep), sens_lib.effective_max_participations(n, int(min_sep), max_participations)


def _auto_sensitivity(strategy: st.Strategy, n: int, b: int, k: int) -> Sensitivity:
  if isinstance(strategy, st.DpSgd):
    # C = I: every participation adds an orthogonal unit vector.
    return Sensitivity(math.sqrt(k), "exact", "identity")
  if st.is_toeplitz(strategy):
    try:
      return sens_lib.toeplitz_sensitivity_exact(st.toeplitz_coefs(strategy, n), n, b, k)
    except AssumptionError:
      pass  # e.g. a BLT with Σω > 1 or a non-monotone banded Toeplitz: fall through to valid bounds.
  if isinstance(strategy, (st.BandMF, st.BandToeplitz)):
    theta = st.banded_theta(strategy, n)
    bands = theta.shape[0]
    if b >= bands:
      return sens_lib.banded_sensitivity_exact_from_norms(np.sum(theta * theta, axis=0), bands, b, k)
  c = st.strategy_matrix(strategy, n)
  if k == 1:
    return sens_lib.single_participation_sensitivity(c)
  return sens_lib.gram_upper_bound(c, b, k)


def sensitivity(strategy: Any, n: int, min_sep: Optional[int], max_participations: Optional[int] = None,
                method: str = "auto") -> Sensitivity:
  """Sensitivity of `strategy` over n rounds under b-min-sep with at most k participations.

  method:
    'auto': an exact value where a theorem applies (identity; BLT/Toeplitz Thm 3.1 with its
      assumptions checked; banded with b >= b̂, 000 Thm 2; max column norm for k = 1), and
      otherwise the general upper bound (003 Alg. 3). Never an optimistic value.
    'upper-bound': the general two-stage VecSens bound over |CᵀC| (003 Alg. 3).
    'lower-bound': ‖C u(π*)‖ with π* = (0, b, 2b, …) (001 Remark 3.2), labelled as such.
  """
  strategy = st.load_strategy(strategy)
  st.check_horizon(strategy, n)
  b, k = _participation(n, min_sep, max_participations)
  if method == "auto":
    return _auto_sensitivity(strategy, n, b, k)
  if method == "upper-bound":
    return sens_lib.gram_upper_bound(st.strategy_matrix(strategy, n), b, k)
  if method == "lower-bound":
    return sens_lib.toeplitz_lower_bound(st.strategy_matrix(strategy, n), b, k)
  raise st.StrategyError(f"sensitivity method must be one of {', '.join(SENSITIVITY_METHODS)}, got {method!r}")


def _workload_matrix(workload: Workload, n: int) -> Optional[np.ndarray]:
  """None for the prefix-sum workload (structured formulas apply), else the dense A."""
  from fedmf.mf import workloads
  if workload is None or (isinstance(workload, str) and workload == "prefix"):
    return None
  a = workloads.by_name(workload, n) if isinstance(workload, str) else np.asarray(workload, dtype=np.float64)
  if a.shape != (n, n):
    raise st.StrategyError(f"workload must be an {n}×{n} matrix, got shape {a.shape}")
  return None if workloads.is_prefix_sum(a) else a


def decoder_row_sq_norms(strategy: Any, n: int, workload: Workload = None) -> np.ndarray:
  """Squared per-round errors ‖row_i(A C⁻¹)‖², sensitivity excluded, in float64.

  Prefix sums use structured formulas: O(n·b̂) for Toeplitz and BLT (002 Prop 3.1, 001 Prop 3.3),
  O(n²·b̂) time and O(n·b̂) memory for general banded (002 Alg. 3). Other workloads use dense
  triangular solves (fine for n up to a few thousand).
  """
  strategy = st.load_strategy(strategy)
  st.check_horizon(strategy, n)
  a = _workload_matrix(workload, n)
  if isinstance(strategy, st.Tree):
    from fedmf.mf import tree
    if a is None:
      return np.asarray(tree.decoder_row_sq_norms(n, strategy.variant), dtype=np.float64)
    if strategy.variant == "full-honaker":
      b_mat = a @ np.linalg.pinv(tree.tree_matrix(n))  # The optimal decoder for A is A C⁺.
    else:
      b_mat = a @ tree.per_round_decoder(n, strategy.variant)
    return np.sum(b_mat * b_mat, axis=1)
  if a is None and st.is_toeplitz(strategy):
    from fedmf.mf import toeplitz
    return np.asarray(toeplitz.decoder_row_sq_norms(st.toeplitz_coefs(strategy, n), n), dtype=np.float64)
  if a is None:
    from fedmf.mf import banded
    return np.asarray(banded.decoder_row_sq_norms(st.banded_theta(strategy, n)), dtype=np.float64)
  c = st.strategy_matrix(strategy, n)
  # B = A C⁻¹  <=>  Cᵀ Bᵀ = Aᵀ, with C lower triangular.
  b_mat = scipy.linalg.solve_triangular(c.T, a.T, lower=False).T
  return np.sum(b_mat * b_mat, axis=1)


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


def evaluate(strategy: Any, n: int, min_sep: Optional[int], max_participations: Optional[int] = None,
             workload: Workload = None, method: str = "auto") -> Evaluation:
  """Sensitivity, MaxError, RmsError, MaxLoss and RmsLoss of `strategy` (see module docstring)."""
  strategy = st.load_strategy(strategy)
  sens = sensitivity(strategy, n, min_sep, max_participations, method)
  sq = decoder_row_sq_norms(strategy, n, workload)
  per_round = np.sqrt(np.maximum(sq, 0.0))
  max_error = float(per_round.max())
  rms_error = float(math.sqrt(np.mean(sq)))
  _, k_eff = _participation(n, min_sep, max_participations)
  workload_name = workload if isinstance(workload, str) else ("prefix" if workload is None else "custom")
  return Evaluation(
      mechanism=strategy.mechanism, n=n, min_sep=min_sep, max_participations=max_participations,
      effective_max_participations=k_eff, workload=workload_name,
      sensitivity=sens.value, sensitivity_method=sens.method, sensitivity_algorithm=sens.algorithm,
      max_error=max_error, rms_error=rms_error,
      max_loss=sens.value * max_error, rms_loss=sens.value * rms_error,
      per_round_error=per_round)
