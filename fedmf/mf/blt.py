"""The BLT strategy: C = BLT(θ, ω) (BLT §2). Its math is `fedmf.mf.blt_math`, its optimizer
`fedmf.mf.blt_optimize`."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import blt_optimize
from fedmf.mf import checks
from fedmf.mf import resources
from fedmf.mf import strategy as strategy_lib
from fedmf.mf.blt_math import (
  BltStream,
  blt_coefs,
  blt_stream,
  check_blt_sensitivity_assumptions,
)
from fedmf.mf.sensitivity import AssumptionError


def blt_error_cost(n: int, nbuf: int) -> resources.Cost:
  """The errors: C⁻¹'s coefficients by `lfilter` over the n coefficients of C, O(n²).

  (Exact to ~1e-15; the O(n·nbuf) IIR form q(x)/p(x) loses ~1e-9 to the ill-conditioned
  polynomial coefficients at n = 2052.)
  """
  return resources.Cost.of(
    f'the O(n²) inverse Toeplitz filter for the errors (n={n})',
    resources.FLOAT * n * (2.0 * nbuf + 8.0),
    0.5 * float(n) ** 2 / resources.VECTOR_RATE,
  )


@dataclasses.dataclass(frozen=True, eq=False)
class Blt(strategy_lib.Strategy):
  """Buffered linear Toeplitz C with buffer decays θ and output scales ω (BLT §2).

  JSON: {"mechanism": "blt", "buf_decay": [...], "output_scale": [...]}, θ distinct in (0, 1),
  ω ≥ 0. C = LtToep(c), c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1}; no horizon.
  """

  buf_decay: np.ndarray
  output_scale: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = 'blt'
  optimizer_options: ClassVar[tuple[str, ...]] = ("buffers",)
  conditioning_field: ClassVar[str] = "strategy fields 'buf_decay' and 'output_scale'"

  @property
  def num_buffers(self) -> int:
    return len(self.buf_decay)

  @classmethod
  def from_dict(cls, obj):
    buf_decay = checks.float_vector(obj, 'buf_decay')
    output_scale = checks.float_vector(obj, 'output_scale')
    if len(buf_decay) != len(output_scale):
      raise checks.StrategyError(
        f"strategy fields 'buf_decay' and 'output_scale' must have equal length, got "
        f"{len(buf_decay)} and {len(output_scale)}"
      )
    outside = np.flatnonzero((buf_decay <= 0) | (buf_decay >= 1))
    if outside.size:
      i = outside[0]
      raise checks.StrategyError(
        f"strategy field 'buf_decay' must lie in (0, 1), got {buf_decay[i]!r} at index {i}"
      )
    if len(np.unique(buf_decay)) != len(buf_decay):
      raise checks.StrategyError("strategy field 'buf_decay' must have distinct values")
    negative = np.flatnonzero(output_scale < 0)
    if negative.size:
      i = negative[0]
      raise checks.StrategyError(
        f"strategy field 'output_scale' must be >= 0, got {output_scale[i]!r} at index {i}"
      )
    strategy = cls(
      checks.readonly(buf_decay),
      checks.readonly(output_scale),
      metadata=checks.extra_fields(obj, ('buf_decay', 'output_scale')),
    )
    strategy.check_conditioning()
    return strategy

  def fields(self):
    return {'buf_decay': self.buf_decay.tolist(), 'output_scale': self.output_scale.tolist()}

  def describe(self) -> str:
    return f'blt ({self.num_buffers} buffer{"s" if self.num_buffers != 1 else ""})'

  def toeplitz_coefs(self, n: int) -> np.ndarray:
    self.check_horizon(n)
    return blt_coefs(self.buf_decay, self.output_scale, n)

  def noise_stream(self, n: Optional[int] = None) -> BltStream:
    return blt_stream(self.buf_decay, self.output_scale)

  def conditioning(self, n: Optional[int] = None) -> strategy_lib.Conditioning:
    """The supremum over all rounds, in closed form (C and C⁻¹ are Toeplitz: column 0 and the
    last row are the largest; the diagonal is c_0 = 1).

    s² = Σ c_t² = 1 + ωᵀQω with Q_jl = 1/(1 - θ_j θ_l). C⁻¹'s stream (BLT Alg. 2) has state
    S_{t+1} = M S_t + 1·z_t with M = diag(θ) - 1ωᵀ, whose eigenvalues are θ̂ (`inverse_blt`), and
    ĉ_t = -ωᵀ M^{t-1} 1 for t ≥ 1. So the noise is bounded iff every |θ̂| < 1, and then
    r² = Σ ĉ_t² = 1 + ωᵀPω with P = M P Mᵀ + 11ᵀ (a discrete Lyapunov equation).
    """
    import scipy.linalg  # pylint: disable=g-import-not-at-top

    theta, omega = self.buf_decay, self.output_scale
    q = 1.0 / (1.0 - np.outer(theta, theta))
    s = float(np.sqrt(1.0 + omega @ q @ omega))
    if not s <= strategy_lib.MAX_COLUMN_NORM:
      return strategy_lib.Conditioning(s, np.inf)
    transition = np.diag(theta) - np.outer(np.ones_like(theta), omega)
    theta_hat = np.linalg.eigvals(transition)
    worst = theta_hat[np.argmax(np.abs(theta_hat))]
    if not abs(worst) < 1.0:
      value = f'{worst.real:.6g}' if worst.imag == 0 else f'{worst:.6g}'
      return strategy_lib.Conditioning(
        s,
        np.inf,
        unstable=f'the inverse BLT has a buffer decay θ̂ = {value} with |θ̂| ≥ 1, so its noise '
        f'grows without bound',
      )
    p = scipy.linalg.solve_discrete_lyapunov(transition, np.ones((len(theta), len(theta))))
    return strategy_lib.Conditioning(s, float(np.sqrt(1.0 + omega @ p @ omega)))

  def exact_sensitivity_cost(self, schema):
    try:
      check_blt_sensitivity_assumptions(self.buf_decay, self.output_scale)
    except AssumptionError:
      return None
    n, k = schema.n, schema.effective_max_participations
    return resources.Cost.of(
      'the BLT coefficients and the worst pattern (BLT Thm 3.1)',
      resources.FLOAT * n * (2.0 * self.num_buffers + 6.0),
      float(n) * (self.num_buffers + k) / resources.VECTOR_RATE,
    )

  def error_cost(self, n, dense_workload=False):
    if dense_workload:
      return super().error_cost(n, True)
    return blt_error_cost(n, self.num_buffers)

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    n, nbuf = schema.n, options.buffers or 5
    return resources.Cost.of(
      "the optimizer's powers of the decays", resources.FLOAT * n * (8.0 * nbuf + 12.0)
    ) + blt_error_cost(n, nbuf)

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):
    objective = options.objective or 'max'
    buf_decay, output_scale, info = blt_optimize.optimize_blt(
      schema.n,
      schema.min_sep,
      schema.max_participations,
      num_buffers=options.buffers,
      objective=objective,
      seed=options.seed,
      progress=options.progress,
      **options.max_iter_kwargs(),
    )
    strategy = cls.from_dict(
      {'mechanism': cls.mechanism, 'buf_decay': list(buf_decay), 'output_scale': list(output_scale)}
    )
    return strategy, {**info, 'objective': objective}
