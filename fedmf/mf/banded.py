"""The BandMF strategy: a column-normalized b̂-banded C over n rounds (Scaling BandMF §3.1).

The band's algebra is `fedmf.mf.banded_matrix`, its noise stream `fedmf.mf.banded_stream`, its
optimizer `fedmf.mf.banded_optimize`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import banded_optimize
from fedmf.mf import checks
from fedmf.mf import resources
from fedmf.mf import strategy as strategy_lib
from fedmf.mf.banded_matrix import (
  banded_error_cost,
  banded_gradient_cost,
  banded_sensitivity_cost,
  inverse_row_sq_norms,
  normalize_columns,
)
from fedmf.mf.banded_stream import BandedStream, banded_stream


# L-BFGS iterations after which `banded_optimize`'s stopping rule (rtol 1e-6) ends, rounded up from
# the measured 58 (n = 256, b̂ = 64), 100 (1026, 171) and 132 (2052, 342; 136 evaluations) from the
# square-root Toeplitz start, and from the nested coarse start (`banded_optimize.uses_coarse_start`)
# 108-110 (2052, 342; 111-113 evaluations, after 87 at 1026, 171) with 10 L-BFGS pairs, 111
# (113 evaluations, after 82) with 5 (`banded_optimize.LBFGS_MEMORY`).
EXPECTED_ITERATIONS = 160
EXPECTED_ITERATIONS_AFTER_COARSE = 130


@dataclasses.dataclass(frozen=True, eq=False)
class BandMF(strategy_lib.Strategy):
  """Column-normalized b̂-banded C over `n` rounds (Scaling BandMF §3.1).

  JSON: {"mechanism": "bandmf", "n": N, "bands": BH, "columns": [[...], ...]}, columns[j] = column
  j of C from the diagonal down, min(b̂, n-j) entries, possibly unnormalized. C is used
  column-normalized, so sens² = k_eff whenever b ≥ b̂. A file built for n serves any n' ≤ n through
  its leading n'×n' block, normalized at n'. `theta[r, j]` holds the raw C[j+r, j].
  """

  n: int
  bands: int
  theta: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "bandmf"
  optimizer_options: ClassVar[tuple[str, ...]] = ("bands",)
  bands_chosen_under_amplification: ClassVar[bool] = True
  conditioning_field: ClassVar[str] = "strategy field 'columns'"

  @property
  def columns(self) -> list[list[float]]:
    return [self.theta[: min(self.bands, self.n - j), j].tolist() for j in range(self.n)]

  @classmethod
  def from_dict(cls, obj):
    n = checks.positive_int(obj, "n")
    bands = checks.positive_int(obj, "bands")
    if bands > n:
      raise checks.StrategyError(f"strategy field 'bands' ({bands}) must not exceed 'n' ({n})")
    columns = obj.get("columns")
    if columns is None:
      raise checks.StrategyError("strategy field 'columns' is missing")
    if isinstance(columns, np.ndarray):
      columns = list(columns)
    if not isinstance(columns, (list, tuple)) or len(columns) != n:
      got = len(columns) if isinstance(columns, (list, tuple)) else type(columns).__name__
      raise checks.StrategyError(
        f"strategy field 'columns' must be a list of n={n} columns, got {got}"
      )
    resources.check_memory(
      3.0 * resources.FLOAT * bands * n, f"its {bands}×{n} band", f"loading bandmf (n={n})"
    )
    theta = np.zeros((bands, n))
    for j, column in enumerate(columns):
      expected = min(bands, n - j)
      values = checks.float_array(column, f"strategy field 'columns[{j}]'", 1)
      if len(values) != expected:
        raise checks.StrategyError(
          f"strategy field 'columns[{j}]' must have min(bands, n-j) = {expected} entries, got {values.size}"
        )
      if values[0] == 0:
        raise checks.StrategyError(
          f"strategy field 'columns[{j}]': the diagonal entry must be non-zero"
        )
      theta[:expected, j] = values
    strategy = cls(
      n,
      bands,
      checks.readonly(theta),
      metadata=checks.extra_fields(obj, ("n", "bands", "columns")),
    )
    strategy.check_conditioning()
    return strategy

  def fields(self):
    return {"n": self.n, "bands": self.bands, "columns": self.columns}

  def describe(self) -> str:
    return f"bandmf (n={self.n}, {self.bands} band{'s' if self.bands != 1 else ''})"

  @classmethod
  def default_poisson_groups(cls, options):
    return options.bands  # One group per band.

  def poisson_amplification(self, rounds, groups):
    # Column-normalized C: the max column norm is 1 (BandMF §5 Thm 4).
    theta = self.banded_theta(rounds)
    return strategy_lib.AMPLIFIED_BANDMF if theta.shape[0] == groups else None

  @property
  def horizon(self) -> int:
    return self.n

  def banded_theta(self, n: int) -> np.ndarray:
    """Columns truncated to the leading n×n block, then normalized (unit-norm columns of C)."""
    self.check_horizon(n)
    return normalize_columns(self.theta, n)

  def noise_stream(self, n: Optional[int] = None) -> BandedStream:
    return banded_stream(self.banded_theta(self.n if n is None else n))

  def conditioning(self, n: Optional[int] = None) -> strategy_lib.Conditioning:
    """Unit columns (s = 1) and the exact r over the horizon, in O(n·b̂²).

    Evaluating at n' < n renormalizes the truncated columns, which scales row t of C⁻¹ by
    ‖truncated column t‖ ≤ ‖column t‖, so r, and κ, at n' never exceed their value at n.
    """
    n = self.n if n is None else n
    theta = self.banded_theta(n)
    gain = float(np.sqrt(np.max(inverse_row_sq_norms(theta))))
    return strategy_lib.Conditioning(1.0, gain, float(np.max(np.abs(theta[0]))), n)

  def exact_sensitivity_cost(self, schema):
    return banded_sensitivity_cost(schema, self.bands)

  def error_cost(self, n, dense_workload=False):
    return super().error_cost(n, True) if dense_workload else banded_error_cost(n, self.bands)

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    """The expected evaluations of `banded_optimize.optimize_bandmf` (its stopping rule ends near
    EXPECTED_ITERATIONS; a smaller --max-iter caps them), each a forward and reverse block pass,
    the L-BFGS history (2·memory vectors of the band), and the final evaluation."""
    n, bands = schema.n, options.band_count(schema)
    rms = (options.objective or "rms") == "rms"
    return _optimize_cost(n, bands, options.max_iter, rms) + banded_error_cost(n, bands)

  @classmethod
  def optimizer_iterations(cls, options):
    # At most its budget (per level of the nested start); the stopping rule usually ends it sooner.
    return options.max_iter

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):

    bands = options.band_count(schema)
    theta, info = banded_optimize.optimize_bandmf(
      schema.n,
      bands,
      min_sep=schema.min_sep,
      max_participations=schema.max_participations,
      objective=options.objective or "rms",
      progress=options.progress,
      **options.max_iter_kwargs(),
    )
    columns = [list(theta[: min(bands, schema.n - j), j]) for j in range(schema.n)]
    strategy = cls.from_dict(
      {"mechanism": cls.mechanism, "n": schema.n, "bands": bands, "columns": columns}
    )
    return strategy, {"objective": options.objective or "rms", "bands": bands, **info}


def _optimize_cost(n: int, bands: int, max_iter: Optional[int], rms: bool) -> resources.Cost:
  """The L-BFGS iterations at (n, b̂), each a forward and reverse block pass and the L-BFGS history
  (2·memory vectors of the band), after those of the coarse level when the nested start applies."""
  bands = min(bands, n)
  coarse = rms and banded_optimize.uses_coarse_start(n, bands)
  expected = EXPECTED_ITERATIONS_AFTER_COARSE if coarse else EXPECTED_ITERATIONS
  iterations = min(expected, max_iter or expected)
  step = banded_gradient_cost(n, bands)
  history = resources.FLOAT * 2.0 * banded_optimize.LBFGS_MEMORY * bands * float(n)
  cost = resources.Cost.of(
    f"{iterations} L-BFGS iterations of {step.steps[0].what}",
    step.memory_bytes + history,
    (1.05 * iterations + 1.0) * step.seconds,
  )
  if not coarse:
    return cost
  return _optimize_cost((n + 1) // 2, (bands + 1) // 2, max_iter, rms) + cost
