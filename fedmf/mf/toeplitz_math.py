"""Lower-triangular Toeplitz matrices C = LtToep(coefs): inverse, errors, sensitivity, loss.

One concept: the algebra of C = LtToep(coefs) (notation of docs/architecture.md:
`coefs[0]` is the diagonal, A is the prefix-sum workload, B = A C⁻¹ the
decoder, `min_sep` = b, `max_participations` = k). For Toeplitz C the inverse
and the decoder are Toeplitz too, so every loss for the prefix-sum workload
costs O(n · len(coefs)) instead of O(n²):

  ĉ = coefficients of C⁻¹,  b_i = Σ_{j≤i} ĉ_j  (B = LtToep(b)),
  MaxError = sqrt(Σ_i b_i²),  RmsError = sqrt(Σ_i (n-i) b_i² / n).

(BLT Prop 3.3, corrected as in docs/mechanisms.md.) The banded Toeplitz loss follows Scaling
BandMF Prop 3.1; its optimizer and the strategy are in `fedmf.mf.toeplitz`. All quantities are float64 and
unsquared unless the name ends in `_sq`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fedmf.mf import sensitivity

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
]


def as_coefs(coefs: Any, n: int) -> np.ndarray:
  """Returns the first n coefficients as float64, zero-padded to length n."""
  c = np.asarray(coefs, dtype=np.float64).ravel()
  out = np.zeros(n, dtype=np.float64)
  m = min(n, c.size)
  out[:m] = c[:m]
  return out


def lt_toeplitz(coefs: Any, n: int) -> np.ndarray:
  """Dense n×n lower-triangular Toeplitz matrix with C[i, j] = coefs[i-j]."""
  c = as_coefs(coefs, n)
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
    as_coefs(coefs, n), sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  )
  return float(cbar @ cbar)


def error_weights(n: int, objective: str) -> np.ndarray:
  """Weights on b_i² giving MaxError² ('max') or RmsError² ('rms')."""
  if objective == 'max':
    return np.ones(n, dtype=np.float64)
  if objective == 'rms':
    return np.arange(n, 0, -1, dtype=np.float64) / n
  raise ValueError(f"objective must be 'max' or 'rms', got {objective!r}")


# Above this n·bands the banded-Toeplitz loss uses FFT products (O(n log n)) instead of the IIR
# recursion (O(n·bands), sequential): Scaling BandMF §3's regime (n = 10⁶, 1024 bands). Below it
# the recursion is kept, so that strategies optimized at small sizes stay bit for bit the same.
FFT_WORK = 2**26


def inverse_series_fft(coefs: Any, n: int) -> np.ndarray:
  """The first n coefficients ĉ of 1/c(x), i.e. C⁻¹ e_0 for C = LtToep(coefs), in O(n log n).

  Newton's iteration for the reciprocal of a power series (Kung 1974; von zur Gathen & Gerhard,
  Modern Computer Algebra, Alg. 9.3): g ← g − g·(c·g − 1) mod x^{2m} doubles the correct
  coefficients per step, each step two FFT products of length ≤ 2m.
  """
  import scipy.signal  # pylint: disable=g-import-not-at-top

  c = np.asarray(coefs, dtype=np.float64).ravel()[:n]
  if c.size == 0 or c[0] == 0.0:
    raise ValueError('coefs[0] (the diagonal) must be non-zero')
  g = np.array([1.0 / c[0]])
  m = 1
  while m < n:
    m2 = min(2 * m, n)
    # c·g agrees with 1 on its first m coefficients; its next m2 - m are the residual h.
    h = scipy.signal.fftconvolve(c[:m2], g)[m:m2]
    g = np.concatenate([g, -scipy.signal.fftconvolve(g[: m2 - m], h)[: m2 - m]])
    m = m2
  return g


def band_toeplitz_loss_and_grad(
  coefs: np.ndarray, n: int, shifts: list[int], weights: np.ndarray
) -> tuple[float, float, float, np.ndarray]:
  """Squared loss sens²·err² of LtToep(coefs) and its gradient w.r.t. coefs.

  Cost O(n · bands), or O(n log n) by FFT products above `FFT_WORK`. Returns (loss_sq, sens_sq,
  err_sq, grad).

  Error (Scaling BandMF Prop 3.1): ĉ = C⁻¹ e_0 by lfilter, b = cumsum(ĉ) = C⁻¹·1,
  err² = Σ w_i b_i². Adjoint: with g = ∂err²/∂ĉ, dĉ = -C⁻¹ LtToep(ĉ) dc, so
  ∂err²/∂c = -LtToep(ĉ)ᵀ C⁻ᵀ g; C⁻ᵀ is the same lfilter run backwards.
  Sensitivity (BLT Alg. 4): c̄ = Σ_m shift(c, m·b), sens² = ‖c̄‖²,
  ∂sens²/∂c_t = 2 Σ_m c̄_{t+m·b}.
  """
  import scipy.signal  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  bands = coefs.size
  fft = n * bands > FFT_WORK
  if fft:
    chat = inverse_series_fft(coefs, n)
  else:
    impulse = np.zeros(n)
    impulse[0] = 1.0
    chat = scipy.signal.lfilter([1.0], coefs, impulse)
  b = np.cumsum(chat)
  err_sq = float(np.sum(weights * b * b))
  g_b = 2.0 * weights * b
  g_chat = np.cumsum(g_b[::-1])[::-1]
  if fft:
    # C⁻ᵀ g = LtToep(ĉ)ᵀ g: (C⁻ᵀ g)_t = Σ_{i≥t} ĉ_{i-t} g_i, a correlation by FFT.
    v = scipy.signal.fftconvolve(g_chat, chat[::-1])[n - 1 : 2 * n - 1]
  else:
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
