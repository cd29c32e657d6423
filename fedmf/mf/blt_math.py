"""Buffered linear Toeplitz (BLT) matrices (BLT, "Don't Use Tree Aggregation, Use BLTs"): the math.

One concept: C = BLT(θ, ω) = LtToep(c) with c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1}
(notation of docs/architecture.md: θ = `buf_decay`, ω = `output_scale`, nbuf
buffers, inverse (θ̂, ω̂) = (`inv_buf_decay`, `inv_output_scale`)). Its
generating function is C(x) = p(x)/q(x) with q(x) = Π_j(1-θ_j x) and
p(x) = Π_j(1-θ̂_j x), so C⁻¹ is the nbuf-buffer BLT(θ̂, ω̂). This module
holds the inverse, BLT Alg. 5, streaming products with C and C⁻¹ (BLT Alg.
2/3) and the O(n·nbuf) losses (BLT Prop 3.3 corrected, Thm 3.1); the optimizer
(BLT Alg. 4) is `fedmf.mf.blt_optimize`, the strategy `fedmf.mf.blt.Blt`.
Float64 throughout; every returned error, sensitivity and loss is unsquared.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedmf.mf import sensitivity
from fedmf.mf import streaming
from fedmf.mf.sensitivity import AssumptionError


def _vec(x: Any, name: str) -> np.ndarray:
  v = np.asarray(x, dtype=np.float64).ravel()
  if v.size == 0:
    raise ValueError(f'{name} must be non-empty')
  return v


def _pair(buf_decay: Any, output_scale: Any) -> tuple[np.ndarray, np.ndarray]:
  theta = _vec(buf_decay, 'buf_decay')
  omega = _vec(output_scale, 'output_scale')
  if theta.shape != omega.shape:
    raise ValueError(f'buf_decay and output_scale differ in length: {theta.size} vs {omega.size}')
  return theta, omega


def powers(decay: np.ndarray, n: int) -> np.ndarray:
  """P[i, j] = decay_j ** i for i < n (with 0 ** 0 = 1)."""
  return np.power(decay[None, :], np.arange(n, dtype=np.float64)[:, None])


def blt_coefs(buf_decay: Any, output_scale: Any, n: int) -> np.ndarray:
  """Toeplitz coefficients of BLT(θ, ω): c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1} (BLT §2.4)."""
  theta, omega = _pair(buf_decay, output_scale)
  c = np.empty(n, dtype=np.result_type(theta, omega))
  if n == 0:
    return c
  c[0] = 1.0
  c[1:] = powers(theta, n - 1) @ omega
  return c


def _q_poly(decay: np.ndarray) -> np.ndarray:
  """Ascending coefficients of q(x) = Π_j (1 - θ_j x) (= np.poly(θ))."""
  return np.poly(decay)


def _p_poly(buf_decay: np.ndarray, output_scale: np.ndarray) -> np.ndarray:
  """Ascending coefficients of p(x) = q(x) + x Σ_j ω_j Π_{l≠j}(1 - θ_l x) (BLT §2.4)."""
  q = _q_poly(buf_decay)
  p = q.astype(np.result_type(q, output_scale))
  for j in range(buf_decay.size):
    p[1:] += output_scale[j] * np.poly(np.delete(buf_decay, j))
  return p


def blt_inverse_coefs(buf_decay: Any, output_scale: Any, n: int) -> np.ndarray:
  """Coefficients ĉ of C⁻¹ without root finding: ĉ = lfilter(q, p, impulse).

  C⁻¹(x) = q(x)/p(x) (BLT §2.4); an IIR filter of order nbuf, O(n·nbuf).
  """
  import scipy.signal  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  theta, omega = _pair(buf_decay, output_scale)
  impulse = np.zeros(n)
  if n:
    impulse[0] = 1.0
  return scipy.signal.lfilter(_q_poly(theta), _p_poly(theta, omega), impulse)


def output_scale_from_decays(buf_decay: Any, inv_buf_decay: Any) -> np.ndarray:
  """The unique ω with BLT(θ, ω)⁻¹ = BLT(θ̂, ·) (BLT Alg. 5, Lemma 5.2 of [15]).

  Alg. 5 reads ω_i = f(1/θ_i) / Π_{j≠i}(1 - θ_j/θ_i) with f = (p - q)/x.
  Since q(1/θ_i) = 0, f(1/θ_i) = θ_i p(1/θ_i), which simplifies to the
  division-free form used here:

    ω_i = Π_l (θ_i - θ̂_l) / Π_{j≠i} (θ_i - θ_j).

  Requires distinct θ (θ̂ may contain zeros in this form; Alg. 5 as printed
  needs them non-zero). Calling it with the roles swapped,
  output_scale_from_decays(θ̂, θ), gives ω̂. Works with complex input too.
  """
  theta = np.asarray(buf_decay).ravel()
  theta_hat = np.asarray(inv_buf_decay).ravel()
  if theta.shape != theta_hat.shape or theta.size == 0:
    raise ValueError('buf_decay and inv_buf_decay must be non-empty and of equal length')
  diff = theta[:, None] - theta[None, :]
  np.fill_diagonal(diff, 1.0)
  denom = np.prod(diff, axis=1)
  if np.any(denom == 0.0):
    raise ValueError('buf_decay values must be distinct')
  numer = np.prod(theta[:, None] - theta_hat[None, :], axis=1)
  return numer / denom


def inverse_blt(
  buf_decay: Any, output_scale: Any, imag_tol: float = 1e-10
) -> tuple[np.ndarray, np.ndarray]:
  """(θ̂, ω̂) with BLT(θ, ω)⁻¹ = BLT(θ̂, ω̂) (BLT §2.4 and Alg. 5).

  θ̂ are the reciprocals of the roots of p(x) = q(x) + x Σ_j ω_j Π_{l≠j}(1-θ_l x),
  i.e. the roots of the monic x^nbuf p(1/x). Equivalently they are the
  eigenvalues of the C⁻¹ streaming transition diag(θ) - 1 ωᵀ (BLT Alg. 2),
  which is how they are computed here (zero θ̂ are returned as zeros).
  ω̂ = output_scale_from_decays(θ̂, θ) (Alg. 5, roles swapped). Returned
  sorted by decreasing θ̂. Raises ValueError if θ̂ is complex or repeated.
  """
  theta, omega = _pair(buf_decay, output_scale)
  transition = np.diag(theta) - np.outer(np.ones_like(theta), omega)
  roots = np.linalg.eigvals(transition)
  if np.max(np.abs(roots.imag), initial=0.0) > imag_tol * max(1.0, np.max(np.abs(roots))):
    raise ValueError(f'inverse BLT has complex buffer decays: {roots}')
  theta_hat = np.sort(roots.real)[::-1].copy()
  if np.any(np.diff(theta_hat) == 0.0):
    raise ValueError('inverse BLT has repeated buffer decays')
  omega_hat = output_scale_from_decays(theta_hat, theta)
  return theta_hat, omega_hat


@dataclasses.dataclass(frozen=True)
class BltStream(streaming.NoiseStream):
  """Round t's [C⁻¹ z]_t for C = BLT(θ, ω), with no horizon (BLT Alg. 2, with C's own θ, ω):

      y_t = z_t - ω_0 S_0 - ω_1 S_1 - …,    S_j ← θ_j S_j + y_t,    S = 0 before round 0.

  State: (t, per tensor the nbuf buffers stacked as one [nbuf, *shape] array, the same recursion
  on the float64 impulse δ_{t,0} with the running Σ ĉ² of its outputs). C⁻¹ is Toeplitz with
  coefficients ĉ (the impulse response), so ‖row_t of C⁻¹‖² = Σ_{s≤t} ĉ_s².

  The memory term is a chain of subtractions in buffer order, one rounding per operation: TF's
  graph optimizer rewrites a chain of additions into AddN and reorders it, which would make the
  TFF aggregator differ from eager TF and numpy by an ulp; subtractions it leaves alone. Stacking
  the buffers per tensor keeps the aggregator's state at one tensor per model tensor (fewer
  tensors to move through TFF's execution context; issue 11).
  """

  buf_decay: tuple[float, ...]
  output_scale: tuple[float, ...]

  def model_buffers(self, rounds: int) -> int:
    return len(self.buf_decay)

  def init(self, specs, ops):
    nbuf = len(self.buf_decay)
    return (
      streaming.round_counter(ops),
      tuple(ops.zeros((nbuf,) + tuple(spec.shape), spec.dtype) for spec in specs),
      (ops.zeros((nbuf,), ops.float64), ops.constant(0.0, ops.float64)),
    )

  def _apply(self, z, buffers, ops):
    y = z
    for j, omega in enumerate(self.output_scale):
      y = y - omega * buffers[j]
    decay = np.reshape(self.buf_decay, (-1,) + (1,) * len(z.shape))
    return y, ops.constant(decay, buffers.dtype) * buffers + y[None]

  def step(self, state, z, ops):
    t, buffers, (impulse, cum) = state
    outputs, new_buffers = [], []
    for zk, bufs in zip(z(0), buffers):
      y, bufs = self._apply(zk, bufs, ops)
      outputs.append(y)
      new_buffers.append(bufs)
    c_hat, impulse = self._apply(ops.is_first_round(t, ops.float64), impulse, ops)
    return outputs, (t + 1, tuple(new_buffers), (impulse, cum + c_hat * c_hat))

  def row_norm(self, state, ops):
    t, _, (impulse, cum) = state
    c_hat, _ = self._apply(ops.is_first_round(t, ops.float64), impulse, ops)
    return ops.sqrt(cum + c_hat * c_hat)

  def host_kernel(self, specs):
    return BltKernel(self, specs)


class BltKernel(streaming.HostKernel):
  """`BltStream.step` in numpy, in place: one pass over the buffers per round, chunk by chunk.

  The same operations in the same order as the definition (float32 θ, ω; `out=` temporaries), so
  the same bits; tests/mf/test_host_kernels.py checks it.
  """

  def __init__(self, stream: BltStream, specs):
    super().__init__(stream, specs)
    self._buffers = []
    for spec in self.specs:
      buf = np.empty((len(stream.buf_decay), int(np.prod(spec.shape))), spec.dtype)
      buf.fill(0)  # Commits the pages now: the memory is held from round 0, not on first write.
      self._buffers.append(buf)

  def step(self, z):
    stream = self.stream
    outputs = []
    for zk, buf, spec in zip(z(0), self._buffers, self.specs):
      dtype = buf.dtype.type
      omega = [dtype(w) for w in stream.output_scale]
      theta = [dtype(d) for d in stream.buf_decay]
      zk = np.asarray(zk, buf.dtype).reshape(-1)
      y = np.empty_like(zk)
      tmp = np.empty(min(streaming.CHUNK, zk.size), buf.dtype)
      for lo, hi in streaming.chunks(zk.size):
        out, t = y[lo:hi], tmp[: hi - lo]
        np.subtract(zk[lo:hi], np.multiply(omega[0], buf[0, lo:hi], out=t), out=out)
        for j in range(1, len(omega)):
          np.subtract(out, np.multiply(omega[j], buf[j, lo:hi], out=t), out=out)
        for j in range(len(theta)):
          s = buf[j, lo:hi]
          np.add(np.multiply(theta[j], s, out=s), out, out=s)
      outputs.append(y.reshape(spec.shape))
    self._advance_scalars()
    return outputs

  def buffers(self):
    return list(self._buffers)

  def tensor_state(self, copy):
    return tuple(
      (np.array if copy else np.asarray)(buf).reshape((-1,) + spec.shape)
      for buf, spec in zip(self._buffers, self.specs)
    )

  def restore_tensors(self, tensors):
    for buf, value, spec in zip(self._buffers, tensors, self.specs):
      value = streaming.check_shape(value, (buf.shape[0],) + spec.shape, 'BLT buffers')
      buf[...] = value.reshape(buf.shape)


def blt_stream(buf_decay: Any, output_scale: Any) -> BltStream:
  """The C⁻¹ stream of BLT(θ, ω)."""
  theta, omega = _pair(buf_decay, output_scale)
  return BltStream(tuple(float(x) for x in theta), tuple(float(x) for x in omega))


def blt_multiply(buf_decay: Any, output_scale: Any, x: Any) -> np.ndarray:
  """C x along axis 0 of x (BLT Alg. 3: y_t = x_t + ωᵀS, S ← diag(θ)S + 1·x_t); a reference."""
  theta, omega = _pair(buf_decay, output_scale)
  x = np.asarray(x, dtype=np.float64)
  extra = (1,) * (x.ndim - 1)
  decay, scale = theta.reshape((-1,) + extra), omega.reshape((-1,) + extra)
  state = np.zeros((theta.size,) + x.shape[1:])
  out = np.empty_like(x)
  for t, row in enumerate(x):
    out[t] = row + np.sum(scale * state, axis=0)
    state = decay * state + row[None]
  return out


def blt_solve(buf_decay: Any, output_scale: Any, z: Any) -> np.ndarray:
  """C⁻¹ z along axis 0 of z by streaming (`BltStream`); a reference for tests."""
  return streaming.inverse_noise(blt_stream(buf_decay, output_scale), z)


def check_blt_sensitivity_assumptions(buf_decay: Any, output_scale: Any) -> None:
  """Raises AssumptionError unless θ ∈ (0,1), ω ≥ 0 and Σω ≤ 1 (BLT Thm 3.1).

  Then c is non-negative and non-increasing (c_1 = Σω ≤ 1 = c_0, and
  c_i = Σ ω_j θ_j^{i-1} decreases for i ≥ 1).
  """
  theta, omega = _pair(buf_decay, output_scale)
  if not np.all((theta > 0.0) & (theta < 1.0)):
    raise AssumptionError(f'buf_decay must lie in (0, 1), got {theta}')
  if not np.all(omega >= 0.0):
    raise AssumptionError(f'output_scale must be >= 0, got {omega}')
  if not np.sum(omega) <= 1.0:
    raise AssumptionError(f'sum(output_scale) = {np.sum(omega)} > 1: coefficients increase')


def blt_sensitivity(
  buf_decay: Any,
  output_scale: Any,
  n: int,
  min_sep: int,
  max_participations: int,
  check: bool = True,
) -> float:
  """Exact b-min-sep sensitivity ‖C u(π*)‖, π* = (0, b, 2b, …) < n (BLT Thm 3.1).

  O(n·(nbuf + k)). With check=True raises AssumptionError when the theorem's
  assumptions fail; with check=False the value is only a lower bound then.
  """
  if check:
    check_blt_sensitivity_assumptions(buf_decay, output_scale)
  c = blt_coefs(buf_decay, output_scale, n)
  cbar = sensitivity.worst_pattern_response(
    c, sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  )
  return float(np.sqrt(cbar @ cbar))


def _decoder(buf_decay: Any, output_scale: Any, n: int) -> np.ndarray:
  """b_i = Σ_{j≤i} ĉ_j, B = A C⁻¹ = LtToep(b) (BLT Prop 3.3 corrected)."""
  return np.cumsum(blt_inverse_coefs(buf_decay, output_scale, n))


def blt_max_error(buf_decay: Any, output_scale: Any, n: int) -> float:
  """MaxError = sqrt(Σ_i b_i²) (BLT Prop 3.3)."""
  b = _decoder(buf_decay, output_scale, n)
  return float(np.sqrt(b @ b))


def blt_rms_error(buf_decay: Any, output_scale: Any, n: int) -> float:
  """RmsError = sqrt(Σ_i (n-i) b_i² / n) (BLT Prop 3.3)."""
  b = _decoder(buf_decay, output_scale, n)
  return float(np.sqrt(np.sum(np.arange(n, 0, -1) * b * b) / n))


def blt_max_loss(
  buf_decay: Any, output_scale: Any, n: int, min_sep: int, max_participations: int
) -> float:
  """MaxLoss = MaxError · sens (BLT Eq. 10, Thm 3.1)."""
  return blt_max_error(buf_decay, output_scale, n) * blt_sensitivity(
    buf_decay, output_scale, n, min_sep, max_participations
  )


def blt_rms_loss(
  buf_decay: Any, output_scale: Any, n: int, min_sep: int, max_participations: int
) -> float:
  """RmsLoss = RmsError · sens (BLT Eq. 9, Thm 3.1)."""
  return blt_rms_error(buf_decay, output_scale, n) * blt_sensitivity(
    buf_decay, output_scale, n, min_sep, max_participations
  )
