"""The banded Toeplitz strategy C = LtToep(coefficients) and its optimizer (Scaling BandMF §3).

The algebra of LtToep (inverse, errors, sensitivity, the loss and its gradient) is
`fedmf.mf.toeplitz_math`; column-normalized and horizon-bounded variants stream through
`fedmf.mf.banded_stream`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import banded_matrix
from fedmf.mf import banded_stream
from fedmf.mf import checks
from fedmf.mf import lbfgs
from fedmf.mf import resources
from fedmf.mf import sensitivity
from fedmf.mf import strategy as strategy_lib
from fedmf.mf.toeplitz_math import (
  as_coefs,
  error_weights,
  band_toeplitz_loss_and_grad,
  inverse_coefs,
  inverse_energy,
  sqrt_coefs,
)


def optimize_band_toeplitz(
  n: int,
  bands: int,
  min_sep: int,
  max_participations: int,
  objective: str = 'rms',
  progress: lbfgs.ProgressFn = None,
  max_iter: int = 1000,
  init: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, dict]:
  """Optimal `bands`-banded Toeplitz coefficients (Scaling BandMF Prop 3.1, §3).

  Minimizes sens²·err² (objective 'rms' → RmsLoss, 'max' → MaxLoss) of the
  un-normalized C = LtToep(θ), θ ∈ R^bands with θ_0 = 1 (the loss is
  scale-invariant), by L-BFGS with the analytic gradient of
  `band_toeplitz_loss_and_grad`, warm-started at the truncated square-root
  coefficients. The sensitivity is ‖C u(π*)‖ (see
  `toeplitz_min_sep_sensitivity_sq`); it is exact when bands ≤ min_sep or the
  result is non-negative and non-increasing, reported in info['sens_exact'].

  The returned coefficients are not column-normalized; use
  `column_normalized_matrix` to evaluate the column-normalized variant.

  Returns:
    (coefs, info) with info keys loss, sens, error, objective, sens_exact,
    iterations, evaluations, seconds, converged, message.
  """
  if bands < 1 or bands > n:
    raise ValueError(f'bands must be in [1, n], got {bands}')
  weights = error_weights(n, objective)
  shifts = sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  x0 = sqrt_coefs(bands) if init is None else as_coefs(init, bands)
  x0 = x0 / x0[0]
  start = time.perf_counter()
  evaluations = [0]  # Counts the progress reports' evaluations too.

  def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
    coefs = np.concatenate([[1.0], x])
    loss_sq, _, _, grad = band_toeplitz_loss_and_grad(coefs, n, shifts, weights)
    evaluations[0] += 1
    # Optimize log(loss²) for a well-scaled objective.
    return float(np.log(loss_sq)), grad[1:] / loss_sq

  def on_step(step: lbfgs.Step) -> None:
    progress(
      {
        'stage': 'band_toeplitz',
        'iteration': step.iteration,
        'loss': float(np.exp(0.5 * fun(step.x)[0])),
      }
    )

  if bands == 1:
    coefs = np.ones(1)
    res = None
  else:
    res = lbfgs.minimize(
      fun,
      x0[1:],
      max_iter=max_iter,
      memory=20,
      line_search='scipy',
      ftol=1e-13,
      gtol=1e-10,
      on_step=None if progress is None else on_step,
    )
    coefs = np.concatenate([[1.0], res.x])
  loss_sq, sens_sq, err_sq, _ = band_toeplitz_loss_and_grad(coefs, n, shifts, weights)
  nonneg_noninc = bool(np.all(coefs >= 0.0) and np.all(np.diff(coefs) <= 0.0))
  info = {
    'loss': float(np.sqrt(loss_sq)),
    'sens': float(np.sqrt(sens_sq)),
    'error': float(np.sqrt(err_sq)),
    'objective': objective,
    'sens_exact': bool(bands <= min_sep or nonneg_noninc),
    'iterations': 0 if res is None else res.iterations,
    'evaluations': evaluations[0],
    'seconds': time.perf_counter() - start,
    'converged': True if res is None else res.converged,
    'message': '' if res is None else str(res.message),
  }
  if progress is not None:
    progress({'stage': 'band_toeplitz', 'done': True, **info})
  return coefs, info


# ----------------------------------------------------------------------------
# The banded Toeplitz strategy.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class BandToeplitz(strategy_lib.Strategy):
  """C = LtToep(coefficients), banded to len(coefficients), optionally column-normalized at n.

  JSON: {"mechanism": "band-toeplitz", "coefficients": [...], "column_normalized": bool}. Column
  normalization (BandMF-scaling §3.1) happens at the evaluation n, after which C is no longer
  Toeplitz (its noise stream then needs the horizon n).

  C⁻¹ is the IIR filter 1/c(x). When it is stable its noise is bounded over all rounds and checked
  once, at load. The optimizer can return a C⁻¹ with a pole just outside the unit circle when
  b̂ ≈ n (e.g. n = 128, b = 1, k = 100, b̂ = 128: modulus 1.00026): harmless over the n rounds it
  was built for, unbounded after. Such a strategy is checked at every use, for that use's n, and
  its noise stream needs the horizon.
  """

  coefficients: np.ndarray
  column_normalized: bool = False
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = 'band-toeplitz'
  optimizer_options: ClassVar[tuple[str, ...]] = ("bands", "column_normalize")
  conditioning_field: ClassVar[str] = "strategy field 'coefficients'"

  @property
  def bands(self) -> int:
    return len(self.coefficients)

  @classmethod
  def from_dict(cls, obj):
    coefficients = checks.float_vector(obj, 'coefficients')
    if coefficients[0] == 0:
      raise checks.StrategyError(
        "strategy field 'coefficients': the diagonal coefficient coefficients[0] must be non-zero"
      )
    normalized = obj.get('column_normalized', False)
    if not isinstance(normalized, bool):
      raise checks.StrategyError(
        f"strategy field 'column_normalized' must be true or false, got "
        f"{checks.short_repr(normalized)}"
      )
    # The step-down recursion of the conditioning check is O(b̂²).
    resources.check(
      resources.Cost.of(
        "the Schur–Cohn stability test of C⁻¹",
        4.0 * resources.FLOAT * len(coefficients),
        len(coefficients) / resources.PYTHON_RATE
        + float(len(coefficients)) ** 2 / resources.VECTOR_RATE,
      ),
      f"loading band-toeplitz ({len(coefficients)} bands)",
    )
    strategy = cls(
      checks.readonly(coefficients),
      normalized,
      metadata=checks.extra_fields(obj, ('coefficients', 'column_normalized')),
    )
    strategy.check_conditioning()
    return strategy

  def fields(self):
    return {'coefficients': self.coefficients.tolist(), 'column_normalized': self.column_normalized}

  def describe(self) -> str:
    norm = ', column-normalized' if self.column_normalized else ''
    return f'band-toeplitz ({self.bands} band{"s" if self.bands != 1 else ""}{norm})'

  # --- conditioning ---------------------------------------------------------------------------

  @functools.cached_property
  def _inverse_energy(self) -> tuple[float, Optional[str]]:
    """Σ (c_0 ĉ_t)² over all rounds (that of c / c_0, free of c_0's scale) and why it is infinite."""
    return inverse_energy(self.coefficients / self.coefficients[0])

  @property
  def stable(self) -> bool:
    """Whether C⁻¹'s noise stays bounded over all rounds (its poles lie inside the unit circle)."""
    return self._inverse_energy[1] is None

  def conditioning(self, n: Optional[int] = None) -> strategy_lib.Conditioning:
    """Stable C⁻¹: the supremum over all rounds, in closed form. Unstable: exact at n (O(n·b̂)).

    Unnormalized: s = ‖c‖ (column 0), r = ‖ĉ‖ = √(Σ ĉ²). Column-normalized at n: s = 1 and
    row i of C⁻¹ is ‖c[:n-i]‖ times that of LtToep(c)⁻¹, so r = max_i ‖c[:n-i]‖·‖ĉ[:i+1]‖,
    whose supremum over n is ‖c‖·‖ĉ‖.
    """
    energy, unstable = self._inverse_energy
    c0 = abs(float(self.coefficients[0]))
    relative_norm = float(np.linalg.norm(self.coefficients / c0))  # ‖c‖ / |c_0|
    norm = c0 * relative_norm
    # Column-normalized, the last column is c_0/|c_0| at every n, so max_t |C_tt| = 1.
    diagonal = 1.0 if self.column_normalized else c0
    if unstable is None:
      if self.column_normalized:
        return strategy_lib.Conditioning(1.0, relative_norm * float(np.sqrt(energy)), diagonal)
      return strategy_lib.Conditioning(norm, float(np.sqrt(energy)) / c0, diagonal)
    if n is None:
      # No horizon yet: check n = 1 (s, r and κ only grow with n), the rest at every use's n.
      if self.column_normalized:
        return strategy_lib.Conditioning(1.0, 1.0, diagonal, 1, unstable)
      return strategy_lib.Conditioning(c0, 1.0 / c0, diagonal, 1, unstable)
    resources.check(
      resources.Cost.of(
        "C⁻¹'s impulse response",
        4.0 * resources.FLOAT * n,
        float(n) * min(self.bands, n) / resources.VECTOR_RATE,
      ),
      f"checking the conditioning of band-toeplitz at n={n}",
    )
    c = as_coefs(self.coefficients, n)
    rows = np.sqrt(np.cumsum(inverse_coefs(c, n) ** 2))  # ‖ĉ[:i+1]‖
    if not self.column_normalized:
      return strategy_lib.Conditioning(norm, float(rows[-1]), diagonal, n, unstable)
    columns = np.sqrt(np.cumsum(c * c))[::-1]  # ‖c[:n-i]‖
    return strategy_lib.Conditioning(1.0, float(np.max(columns * rows)), diagonal, n, unstable)

  def check_horizon(self, n: int) -> None:
    super().check_horizon(n)
    if not self.stable:  # A C⁻¹ that grows: check this use's n (stable ones passed at load).
      checked = self.__dict__.setdefault('_checked_rounds', set())
      if n not in checked:
        self.check_conditioning(int(n))
        checked.add(n)

  # --- C ----------------------------------------------------------------------------------------

  def toeplitz_coefs(self, n: int) -> Optional[np.ndarray]:
    if self.column_normalized:
      return None
    self.check_horizon(n)
    return as_coefs(self.coefficients, n)

  def banded_theta(self, n: int) -> np.ndarray:

    self.check_horizon(n)
    bands = min(self.bands, n)
    theta = np.repeat(self.coefficients[:bands, None], n, axis=1)
    rows = np.arange(bands)[:, None] + np.arange(n)[None, :]
    theta[rows >= n] = 0.0
    if self.column_normalized:
      theta = banded_matrix.normalize_columns(theta)
    return theta

  def noise_stream(self, n: Optional[int] = None):

    if n is None and (self.column_normalized or not self.stable):
      why = (
        'its columns are normalized at n'
        if self.column_normalized
        else f'{self._inverse_energy[1]}; it is checked and bounded for the n rounds it runs'
      )
      raise checks.StrategyError(
        f'this band-toeplitz strategy needs the horizon n (num_rounds): {why}'
      )
    if not self.column_normalized:
      if self.stable:
        return banded_stream.toeplitz_stream(self.coefficients)
      self.check_horizon(n)
      return banded_stream.toeplitz_stream(self.coefficients, rounds=int(n))
    return banded_stream.banded_stream(self.banded_theta(n))

  # --- resources --------------------------------------------------------------------------------

  def _monotone(self) -> bool:
    """BLT Thm 3.1's assumption on the coefficients (with `sensitivity`'s tolerance)."""
    c = self.coefficients
    tol = 1e-12 * max(float(np.max(np.abs(c))), 1.0)
    return bool(np.all(c >= -tol) and np.all(np.diff(c) <= tol))

  def exact_sensitivity_cost(self, schema):

    n, k = schema.n, schema.effective_max_participations
    if not self.column_normalized and self._monotone():
      return resources.Cost.of(
        'the Toeplitz coefficients and the worst pattern (BLT Thm 3.1)',
        6.0 * resources.FLOAT * n,
        float(n) * k / resources.VECTOR_RATE,
      )
    return banded_matrix.banded_sensitivity_cost(schema, self.bands)

  def error_cost(self, n, dense_workload=False):

    if dense_workload:
      return super().error_cost(n, True)
    if self.column_normalized:
      return banded_matrix.banded_error_cost(n, self.bands) + resources.Cost.of(
        'the column-normalized band', 6.0 * resources.FLOAT * min(self.bands, n) * float(n)
      )
    return resources.Cost.of(
      'the inverse Toeplitz filter for the errors',
      8.0 * resources.FLOAT * n,
      float(n) * min(self.bands, n) / resources.VECTOR_RATE,
    )

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    n, bands = schema.n, options.band_count(schema)
    probe = cls(np.ones(bands), options.column_normalize)  # Costs depend on n and b̂ only.
    return resources.Cost.of(
      'the optimizer\'s filters', 12.0 * resources.FLOAT * n
    ) + probe.evaluation_cost(schema)

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):
    bands = options.band_count(schema)
    objective = options.objective or 'rms'
    coefs, info = optimize_band_toeplitz(
      schema.n,
      bands,
      schema.min_sep,
      schema.max_participations,
      objective=objective,
      progress=options.progress,
      **options.max_iter_kwargs(),
    )
    strategy = cls.from_dict(
      {
        'mechanism': cls.mechanism,
        'coefficients': list(coefs),
        'column_normalized': options.column_normalize,
      }
    )
    return strategy, {'objective': objective, 'bands': bands, **info}
