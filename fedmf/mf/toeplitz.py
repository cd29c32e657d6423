"""Lower-triangular Toeplitz strategies and the banded-Toeplitz optimizer.

One concept: a strategy C = LtToep(coefs) (notation of docs/architecture.md:
`coefs[0]` is the diagonal, A is the prefix-sum workload, B = A C⁻¹ the
decoder, `min_sep` = b, `max_participations` = k). For Toeplitz C the inverse
and the decoder are Toeplitz too, so every loss for the prefix-sum workload
costs O(n · len(coefs)) instead of O(n²):

  ĉ = coefficients of C⁻¹,  b_i = Σ_{j≤i} ĉ_j  (B = LtToep(b)),
  MaxError = sqrt(Σ_i b_i²),  RmsError = sqrt(Σ_i (n-i) b_i² / n).

(BLT Prop 3.3, corrected as in docs/mechanisms.md.) The banded
Toeplitz optimizer follows Scaling BandMF Prop 3.1. All quantities are float64 and
unsquared unless the name ends in `_sq`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import resources
from fedmf.mf import sensitivity
from fedmf.mf import strategy as strategy_lib

__all__ = [
  'lt_toeplitz',
  'inverse_coefs',
  'prefix_decoder_coefs',
  'decoder_row_sq_norms',
  'max_error',
  'rms_error',
  'column_normalize',
  'column_normalized_matrix',
  'sqrt_coefs',
  'toeplitz_min_sep_sensitivity_sq',
  'band_toeplitz_loss_and_grad',
  'optimize_band_toeplitz',
]

ProgressFn = Optional[Callable[[dict], None]]


def _as_coefs(coefs: Any, n: int) -> np.ndarray:
  """Returns the first n coefficients as float64, zero-padded to length n."""
  c = np.asarray(coefs, dtype=np.float64).ravel()
  out = np.zeros(n, dtype=np.float64)
  m = min(n, c.size)
  out[:m] = c[:m]
  return out


def lt_toeplitz(coefs: Any, n: int) -> np.ndarray:
  """Dense n×n lower-triangular Toeplitz matrix with C[i, j] = coefs[i-j]."""
  c = _as_coefs(coefs, n)
  idx = np.arange(n)
  diff = idx[:, None] - idx[None, :]
  return np.where(diff >= 0, c[np.clip(diff, 0, n - 1)], 0.0)


def inverse_coefs(coefs: Any, n: int) -> np.ndarray:
  """First n Toeplitz coefficients ĉ of C⁻¹ for C = LtToep(coefs).

  Scalar forward substitution C ĉ = e_0, run as the IIR filter
  lfilter([1], coefs, impulse): O(n · len(coefs)).
  """
  import scipy.signal  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  c = _trim(np.asarray(coefs, dtype=np.float64).ravel()[:n])
  if c.size == 0 or c[0] == 0.0:
    raise ValueError('coefs[0] (the diagonal) must be non-zero')
  impulse = np.zeros(n, dtype=np.float64)
  impulse[0] = 1.0
  return scipy.signal.lfilter([1.0], c, impulse)


def _trim(c: np.ndarray) -> np.ndarray:
  """c without its trailing zeros: they add exact zeros to the recursion, at O(n) cost each
  (a banded or identity C padded to n coefficients would make `lfilter` O(n²))."""
  nonzero = np.flatnonzero(c)
  return c[: nonzero[-1] + 1] if nonzero.size else c[:1]


def inverse_energy(coefs: Any) -> tuple[float, Optional[str]]:
  """Σ_{t≥0} ĉ_t² over all rounds for C = LtToep(coefs), and why it is infinite (else None).

  C⁻¹ is the IIR filter 1/c(x) (x the delay); its impulse response ĉ stays square-summable iff
  every pole, i.e. every root of z^m c(1/z), lies strictly inside the unit circle. The
  Schur–Cohn / Levinson step-down recursion decides it and gives the sum without root finding:
  with a = c/c_0 and reflection coefficients k_j = a_j^{(j)},
      a^{(j-1)}_i = (a^{(j)}_i - k_j a^{(j)}_{j-i}) / (1 - k_j²),
  the filter is stable iff every |k_j| < 1, and then Σ ĉ² = 1 / (c_0² Π_j (1 - k_j²)) (the variance
  of the AR process driven by unit white noise). O(m²) for m coefficients.
  """
  c = _trim(np.asarray(coefs, dtype=np.float64).ravel())
  m = c.size - 1
  a = c / c[0]
  log_energy = -2.0 * np.log(abs(c[0]))
  for order in range(m, 0, -1):
    k = a[order]
    if not abs(k) < 1.0:
      return np.inf, _unstable_reason(c, order, k)
    a = (a[:order] - k * a[order:0:-1]) / (1.0 - k * k)
    log_energy -= np.log1p(-k * k)
  with np.errstate(over='ignore'):
    return float(np.exp(log_energy)), None


def _unstable_reason(c: np.ndarray, order: int, k: float) -> str:
  if c.size <= 1025:  # np.roots is O(m³): name the pole where that is cheap.
    pole = float(np.max(np.abs(np.roots(c))))
    return f"C⁻¹ has a pole of modulus {pole:.6g} ≥ 1, so its noise grows without bound"
  return (
    f"C⁻¹ has a pole on or outside the unit circle (Schur–Cohn reflection coefficient {k:.6g} "
    f"at order {order}), so its noise grows without bound"
  )


def prefix_decoder_coefs(coefs: Any, n: int) -> np.ndarray:
  """Coefficients b of B = A C⁻¹ = LtToep(b): b_i = Σ_{j≤i} ĉ_j (BLT Prop 3.3)."""
  return np.cumsum(inverse_coefs(coefs, n))


def decoder_row_sq_norms(coefs: Any, n: int) -> np.ndarray:
  """Squared norm of row i of B = LtToep(b), i.e. cumsum(b²) (per-round error²)."""
  b = prefix_decoder_coefs(coefs, n)
  return np.cumsum(b * b)


def max_error(coefs: Any, n: int) -> float:
  """MaxError(B) = max_i ‖row_i(B)‖ = sqrt(Σ_i b_i²) (BLT Prop 3.3)."""
  b = prefix_decoder_coefs(coefs, n)
  return float(np.sqrt(np.sum(b * b)))


def rms_error(coefs: Any, n: int) -> float:
  """RmsError(B) = ‖B‖_F / sqrt(n) = sqrt(Σ_i (n-i) b_i² / n) (BLT Prop 3.3)."""
  b = prefix_decoder_coefs(coefs, n)
  weights = np.arange(n, 0, -1, dtype=np.float64)
  return float(np.sqrt(np.sum(weights * b * b) / n))


def column_normalize(matrix: Any) -> np.ndarray:
  """Divides every column of a dense matrix by its Euclidean norm.

  Zero columns are left as they are.
  """
  m = np.asarray(matrix, dtype=np.float64)
  norms = np.linalg.norm(m, axis=0)
  norms = np.where(norms > 0.0, norms, 1.0)
  return m / norms[None, :]


def column_normalized_matrix(coefs: Any, n: int) -> np.ndarray:
  """Dense column-normalized banded Toeplitz C at horizon n (Scaling BandMF §3.1).

  Column j of LtToep(coefs) holds coefs[:n-j]; it is divided by its in-range
  norm ‖coefs[:n-j]‖, so the last columns are scaled up and the result is no
  longer Toeplitz. Every column has unit norm, hence sens² = k_eff for
  b-min-sep with b ≥ len(coefs).
  """
  return column_normalize(lt_toeplitz(coefs, n))


def sqrt_coefs(bands: int) -> np.ndarray:
  """Square-root-factorization coefficients truncated to `bands`.

  c_0 = 1, c_j = c_{j-1} (2j-1)/(2j) (coefficients of (1-x)^{-1/2}); the warm
  start of Scaling BandMF and docs/mechanisms.md.
  """
  c = np.ones(bands, dtype=np.float64)
  for j in range(1, bands):
    c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
  return c


def toeplitz_min_sep_sensitivity_sq(
  coefs: Any, n: int, min_sep: int, max_participations: int
) -> float:
  """sens² = ‖C u(π*)‖² with π* = (0, b, 2b, …) < n, at most k rounds.

  BLT Thm 3.1 / Alg. 4: exact when coefs are non-negative and non-increasing.
  It is also exact for any banded Toeplitz C with len(coefs) ≤ min_sep: the
  chosen columns are then disjoint and the column norms are non-increasing in
  j (the last columns are truncated), so 0, b, 2b, … maximizes the banded rule
  Σ_{j∈π} ‖C[:, j]‖². Otherwise it is only a lower bound (BLT Remark 3.2).
  """
  cbar = sensitivity.worst_pattern_response(
    _as_coefs(coefs, n), sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  )
  return float(cbar @ cbar)


def _error_weights(n: int, objective: str) -> np.ndarray:
  """Weights on b_i² giving MaxError² ('max') or RmsError² ('rms')."""
  if objective == 'max':
    return np.ones(n, dtype=np.float64)
  if objective == 'rms':
    return np.arange(n, 0, -1, dtype=np.float64) / n
  raise ValueError(f"objective must be 'max' or 'rms', got {objective!r}")


def band_toeplitz_loss_and_grad(
  coefs: np.ndarray, n: int, shifts: list[int], weights: np.ndarray
) -> tuple[float, float, float, np.ndarray]:
  """Squared loss sens²·err² of LtToep(coefs) and its gradient w.r.t. coefs.

  Cost O(n · bands). Returns (loss_sq, sens_sq, err_sq, grad).

  Error (Scaling BandMF Prop 3.1): ĉ = C⁻¹ e_0 by lfilter, b = cumsum(ĉ) = C⁻¹·1,
  err² = Σ w_i b_i². Adjoint: with g = ∂err²/∂ĉ, dĉ = -C⁻¹ LtToep(ĉ) dc, so
  ∂err²/∂c = -LtToep(ĉ)ᵀ C⁻ᵀ g; C⁻ᵀ is the same lfilter run backwards.
  Sensitivity (BLT Alg. 4): c̄ = Σ_m shift(c, m·b), sens² = ‖c̄‖²,
  ∂sens²/∂c_t = 2 Σ_m c̄_{t+m·b}.
  """
  import scipy.signal  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  bands = coefs.size
  impulse = np.zeros(n)
  impulse[0] = 1.0
  chat = scipy.signal.lfilter([1.0], coefs, impulse)
  b = np.cumsum(chat)
  err_sq = float(np.sum(weights * b * b))
  g_b = 2.0 * weights * b
  g_chat = np.cumsum(g_b[::-1])[::-1]
  v = scipy.signal.lfilter([1.0], coefs, g_chat[::-1])[::-1]  # C⁻ᵀ g_chat.
  # (LtToep(ĉ)ᵀ v)_t = Σ_{i≥t} ĉ_{i-t} v_i for t < bands: a correlation.
  corr = scipy.signal.fftconvolve(v, chat[::-1])[n - 1 : n - 1 + bands]
  g_err = -corr
  m = min(bands, n)
  cbar = np.zeros(n)
  for s in shifts:
    if s < n:
      cbar[s : s + m] += coefs[: min(m, n - s)]
  sens_sq = float(cbar @ cbar)
  g_sens = np.zeros(bands)
  for s in shifts:
    length = min(bands, n - s)
    g_sens[:length] += 2.0 * cbar[s : s + length]
  loss_sq = sens_sq * err_sq
  grad = err_sq * g_sens + sens_sq * g_err
  return loss_sq, sens_sq, err_sq, grad


def optimize_band_toeplitz(
  n: int,
  bands: int,
  min_sep: int,
  max_participations: int,
  objective: str = 'rms',
  progress: ProgressFn = None,
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
  import scipy.optimize  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  if bands < 1 or bands > n:
    raise ValueError(f'bands must be in [1, n], got {bands}')
  weights = _error_weights(n, objective)
  shifts = sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  x0 = sqrt_coefs(bands) if init is None else _as_coefs(init, bands)
  x0 = x0 / x0[0]
  start = time.perf_counter()
  state = {'evals': 0, 'iters': 0}

  def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
    coefs = np.concatenate([[1.0], x])
    loss_sq, _, _, grad = band_toeplitz_loss_and_grad(coefs, n, shifts, weights)
    state['evals'] += 1
    # Optimize log(loss²) for a well-scaled objective.
    return float(np.log(loss_sq)), grad[1:] / loss_sq

  def callback(xk: np.ndarray) -> None:
    state['iters'] += 1
    if progress is not None:
      progress(
        {
          'stage': 'band_toeplitz',
          'iteration': state['iters'],
          'loss': float(np.exp(0.5 * fun(xk)[0])),
        }
      )

  if bands == 1:
    coefs = np.ones(1)
    res = None
  else:
    res = scipy.optimize.minimize(
      fun,
      x0[1:],
      jac=True,
      method='L-BFGS-B',
      callback=callback,
      options={'maxiter': max_iter, 'maxcor': 20, 'ftol': 1e-13, 'gtol': 1e-10},
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
    'iterations': state['iters'],
    'evaluations': state['evals'],
    'seconds': time.perf_counter() - start,
    'converged': True if res is None else bool(res.success),
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
  conditioning_field: ClassVar[str] = "strategy field 'coefficients'"

  @property
  def bands(self) -> int:
    return len(self.coefficients)

  @classmethod
  def from_dict(cls, obj):
    coefficients = strategy_lib.float_vector(obj, 'coefficients')
    if coefficients[0] == 0:
      raise strategy_lib.StrategyError(
        "strategy field 'coefficients': the diagonal coefficient coefficients[0] must be non-zero"
      )
    normalized = obj.get('column_normalized', False)
    if not isinstance(normalized, bool):
      raise strategy_lib.StrategyError(
        f"strategy field 'column_normalized' must be true or false, got "
        f"{strategy_lib.short_repr(normalized)}"
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
      strategy_lib.readonly(coefficients),
      normalized,
      metadata=strategy_lib.extra_fields(obj, ('coefficients', 'column_normalized')),
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
    c = _as_coefs(self.coefficients, n)
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
    return _as_coefs(self.coefficients, n)

  def banded_theta(self, n: int) -> np.ndarray:
    from fedmf.mf import banded  # pylint: disable=g-import-not-at-top

    self.check_horizon(n)
    bands = min(self.bands, n)
    theta = np.repeat(self.coefficients[:bands, None], n, axis=1)
    rows = np.arange(bands)[:, None] + np.arange(n)[None, :]
    theta[rows >= n] = 0.0
    if self.column_normalized:
      theta = banded.normalize_columns(theta)
    return theta

  def noise_stream(self, n: Optional[int] = None):
    from fedmf.mf import banded  # pylint: disable=g-import-not-at-top

    if n is None and (self.column_normalized or not self.stable):
      why = (
        'its columns are normalized at n'
        if self.column_normalized
        else f'{self._inverse_energy[1]}; it is checked and bounded for the n rounds it runs'
      )
      raise strategy_lib.StrategyError(
        f'this band-toeplitz strategy needs the horizon n (num_rounds): {why}'
      )
    if not self.column_normalized:
      if self.stable:
        return banded.toeplitz_stream(self.coefficients)
      self.check_horizon(n)
      return banded.toeplitz_stream(self.coefficients, rounds=int(n))
    return banded.banded_stream(self.banded_theta(n))

  # --- resources --------------------------------------------------------------------------------

  def _monotone(self) -> bool:
    """BLT Thm 3.1's assumption on the coefficients (with `sensitivity`'s tolerance)."""
    c = self.coefficients
    tol = 1e-12 * max(float(np.max(np.abs(c))), 1.0)
    return bool(np.all(c >= -tol) and np.all(np.diff(c) <= tol))

  def exact_sensitivity_cost(self, schema):
    from fedmf.mf import banded  # pylint: disable=g-import-not-at-top

    n, k = schema.n, schema.effective_max_participations
    if not self.column_normalized and self._monotone():
      return resources.Cost.of(
        'the Toeplitz coefficients and the worst pattern (BLT Thm 3.1)',
        6.0 * resources.FLOAT * n,
        float(n) * k / resources.VECTOR_RATE,
      )
    return banded.banded_sensitivity_cost(schema, self.bands)

  def error_cost(self, n, dense_workload=False):
    from fedmf.mf import banded  # pylint: disable=g-import-not-at-top

    if dense_workload:
      return super().error_cost(n, True)
    if self.column_normalized:
      return banded.banded_error_cost(n, self.bands) + resources.Cost.of(
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
