"""Buffered linear Toeplitz (BLT) strategies (BLT, "Don't Use Tree Aggregation, Use BLTs").

One concept: C = BLT(θ, ω) = LtToep(c) with c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1}
(notation of docs/architecture.md: θ = `buf_decay`, ω = `output_scale`, nbuf
buffers, inverse (θ̂, ω̂) = (`inv_buf_decay`, `inv_output_scale`)). Its
generating function is C(x) = p(x)/q(x) with q(x) = Π_j(1-θ_j x) and
p(x) = Π_j(1-θ̂_j x), so C⁻¹ is the nbuf-buffer BLT(θ̂, ω̂). This module
holds the inverse, BLT Alg. 5, streaming products with C and C⁻¹ (BLT Alg.
2/3), the O(n·nbuf) losses (BLT Prop 3.3 corrected, Thm 3.1) and the BLT
optimizer (BLT Alg. 4). Float64 throughout; every returned error, sensitivity
and loss is unsquared.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import resources
from fedmf.mf import sensitivity
from fedmf.mf import strategy as strategy_lib
from fedmf.mf import streaming
from fedmf.mf.sensitivity import AssumptionError

__all__ = [
  'blt_coefs',
  'blt_inverse_coefs',
  'inverse_blt',
  'output_scale_from_decays',
  'BltStream',
  'blt_stream',
  'Blt',
  'blt_multiply',
  'blt_solve',
  'check_blt_sensitivity_assumptions',
  'blt_sensitivity',
  'blt_max_error',
  'blt_rms_error',
  'blt_max_loss',
  'blt_rms_loss',
  'blt_loss_and_grad',
  'optimize_blt',
]

ProgressFn = Optional[Callable[[dict], None]]
PENALTY_STRENGTH = 1e-7  # λ of BLT Alg. 4.


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


def _powers(decay: np.ndarray, n: int) -> np.ndarray:
  """P[i, j] = decay_j ** i for i < n (with 0 ** 0 = 1)."""
  return np.power(decay[None, :], np.arange(n, dtype=np.float64)[:, None])


def blt_coefs(buf_decay: Any, output_scale: Any, n: int) -> np.ndarray:
  """Toeplitz coefficients of BLT(θ, ω): c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1} (BLT §2.4)."""
  theta, omega = _pair(buf_decay, output_scale)
  c = np.empty(n, dtype=np.result_type(theta, omega))
  if n == 0:
    return c
  c[0] = 1.0
  c[1:] = _powers(theta, n - 1) @ omega
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


# ----------------------------------------------------------------------------
# Optimizer (BLT Alg. 4).
# ----------------------------------------------------------------------------


def _scale_and_jacobians(
  theta: np.ndarray, theta_hat: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """ω = output_scale_from_decays(θ, θ̂) with ∂ω/∂θ and ∂ω/∂θ̂ (nbuf × nbuf).

  From ω_i = Π_l(θ_i - θ̂_l) / Π_{j≠i}(θ_i - θ_j) (see that function):
    ∂ω_i/∂θ̂_l = -Π_{m≠l}(θ_i - θ̂_m) / Π_{j≠i}(θ_i - θ_j),
    ∂ω_i/∂θ_j = ω_i / (θ_i - θ_j)                                 (j ≠ i),
    ∂ω_i/∂θ_i = Σ_l Π_{m≠l}(θ_i - θ̂_m)/Π_{j≠i}(θ_i-θ_j) - Σ_{j≠i} ω_i/(θ_i-θ_j).
  """
  d = theta.size
  diff = theta[:, None] - theta[None, :]
  np.fill_diagonal(diff, 1.0)
  denom = np.prod(diff, axis=1)
  gaps = theta[:, None] - theta_hat[None, :]  # (i, l)
  # Products leaving one factor out, without dividing by a possibly-zero gap.
  leave_one = np.empty((d, d))
  for l in range(d):
    leave_one[:, l] = np.prod(np.delete(gaps, l, axis=1), axis=1)
  omega = np.prod(gaps, axis=1) / denom
  d_hat = -leave_one / denom[:, None]
  inv_diff = 1.0 / diff
  np.fill_diagonal(inv_diff, 0.0)
  d_theta = omega[:, None] * inv_diff
  diag = leave_one.sum(axis=1) / denom - omega * inv_diff.sum(axis=1)
  d_theta[np.arange(d), np.arange(d)] = diag
  return omega, d_theta, d_hat


def _interlaced_from_params(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """s_m = Π_{l≤m} sigmoid(u_l): 1 > s_1 > s_2 > … > s_{2d} > 0, and ∂s/∂u.

  θ = s[0::2], θ̂ = s[1::2] are strictly interlaced, θ_1 > θ̂_1 > θ_2 > …,
  which is equivalent to ω > 0 for θ, θ̂ ∈ (0, 1) (C(x) increases between
  its poles 1/θ_j, so each gap holds one zero 1/θ̂_j). It also implies Σω < 1:
  letting x → ∞ in C(x) = p(x)/q(x) gives 1 - Σ_j ω_j/θ_j = Π θ̂ / Π θ > 0,
  so Σω < Σ ω_j/θ_j < 1. This is the feasible set of BLT Alg. 4, where
  Thm 3.1 holds.
  """
  log_sig = -np.logaddexp(0.0, -u)  # log sigmoid(u)
  s = np.exp(np.cumsum(log_sig))
  one_minus = 1.0 / (1.0 + np.exp(u))  # 1 - sigmoid(u) = ∂ log sigmoid / ∂u
  # ∂s_m/∂u_l = s_m (1 - sigmoid(u_l)) for l ≤ m.
  jac = np.tril(s[:, None] * one_minus[None, :])
  return s, jac


def _params_from_interlaced(s: np.ndarray) -> np.ndarray:
  ratios = s / np.concatenate([[1.0], s[:-1]])
  return np.log(ratios) - np.log1p(-ratios)


def _coef_grad(
  g: np.ndarray, decay: np.ndarray, scale: np.ndarray, powers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """Pulls ∂L/∂c (c_i = Σ ω_j θ_j^{i-1}, i ≥ 1) back to (θ, ω)."""
  n = g.size
  g1 = g[1:]
  d_scale = powers.T @ g1  # Σ_i g_i θ^{i-1}
  # ∂c_i/∂θ_j = ω_j (i-1) θ_j^{i-2}.
  if n > 2:
    deriv = np.arange(1, n - 1, dtype=np.float64)[:, None] * powers[:-1]
    d_decay = scale * (deriv.T @ g1[1:])
  else:
    d_decay = np.zeros_like(decay)
  return d_decay, d_scale


def blt_loss_and_grad(
  theta: np.ndarray,
  theta_hat: np.ndarray,
  n: int,
  min_sep: int,
  max_participations: int,
  objective: str = 'max',
  penalty: float = PENALTY_STRENGTH,
) -> tuple[float, np.ndarray, np.ndarray, dict]:
  """BLT Alg. 4 loss err·sens + penalty of the pair (θ, θ̂), and its gradient.

  ω = Alg5(θ, θ̂), ω̂ = Alg5(θ̂, θ); sens = ‖c̄‖ (Thm 3.1); err from
  b = cumsum(ĉ) (Prop 3.3); penalty λ Σ(-log θ - log(1-θ) - log ω) plus
  λ Σ(-log θ̂ - log(1-θ̂)). Cost O(n·nbuf + n·k). Returns
  (loss, ∂loss/∂θ, ∂loss/∂θ̂, parts) with parts holding ω, ω̂, sens, err.
  """
  theta = np.asarray(theta, dtype=np.float64)
  theta_hat = np.asarray(theta_hat, dtype=np.float64)
  omega, dw_dt, dw_dth = _scale_and_jacobians(theta, theta_hat)
  omega_hat, dwh_dth, dwh_dt = _scale_and_jacobians(theta_hat, theta)
  pw = _powers(theta, n - 1)
  pw_hat = _powers(theta_hat, n - 1)
  c = np.empty(n)
  c[0] = 1.0
  c[1:] = pw @ omega
  chat = np.empty(n)
  chat[0] = 1.0
  chat[1:] = pw_hat @ omega_hat
  shifts = sensitivity.worst_pattern_offsets(n, min_sep, max_participations)
  cbar = sensitivity.worst_pattern_response(c, shifts)
  sens = float(np.sqrt(cbar @ cbar))
  if objective == 'max':
    weights = np.ones(n)
  elif objective == 'rms':
    weights = np.arange(n, 0, -1, dtype=np.float64) / n
  else:
    raise ValueError(f"objective must be 'max' or 'rms', got {objective!r}")
  b = np.cumsum(chat)
  err = float(np.sqrt(np.sum(weights * b * b)))
  # ∂sens/∂c_t = Σ_m c̄_{t+s_m} / sens; ∂err/∂ĉ = revcumsum(w b) / err.
  g_c = np.zeros(n)
  for s in shifts:
    g_c[: n - s] += cbar[s:]
  g_c *= err / sens
  g_chat = np.cumsum((weights * b)[::-1])[::-1] * (sens / err)
  gt_direct, g_omega = _coef_grad(g_c, theta, omega, pw)
  gth_direct, g_omega_hat = _coef_grad(g_chat, theta_hat, omega_hat, pw_hat)
  loss = err * sens
  if penalty:
    if np.any(omega <= 0.0):
      pen = np.inf
      g_omega_pen = np.zeros_like(omega)
    else:
      pen = penalty * float(np.sum(-np.log(omega)))
      g_omega_pen = -penalty / omega
    pen += penalty * float(
      np.sum(-np.log(theta) - np.log1p(-theta) - np.log(theta_hat) - np.log1p(-theta_hat))
    )
    loss = loss + pen
    g_omega = g_omega + g_omega_pen
    gt_direct = gt_direct + penalty * (-1.0 / theta + 1.0 / (1.0 - theta))
    gth_direct = gth_direct + penalty * (-1.0 / theta_hat + 1.0 / (1.0 - theta_hat))
  g_theta = gt_direct + dw_dt.T @ g_omega + dwh_dt.T @ g_omega_hat
  g_theta_hat = gth_direct + dw_dth.T @ g_omega + dwh_dth.T @ g_omega_hat
  parts = {'output_scale': omega, 'inv_output_scale': omega_hat, 'sens': sens, 'error': err}
  return float(loss), g_theta, g_theta_hat, parts


def _initial_interlaced(nbuf: int, n: int, rng: Optional[np.random.Generator]) -> np.ndarray:
  """2·nbuf decays 1 > s_1 > … > s_{2nbuf} > 0, spread in log(1 - s).

  The deterministic start (rng None) spaces -log(1-s) evenly between
  ~log(n) and ~log(1.5); random starts draw sorted uniform points there.
  """
  hi, lo = np.log(2.0 * n), np.log(1.5)
  m = 2 * nbuf
  if rng is None:
    t = np.linspace(hi, lo, m + 2)[1:-1]
  else:
    t = np.sort(rng.uniform(lo, hi, size=m))[::-1]
    t = t + np.linspace(1e-6, 0.0, m)  # keep strictly decreasing in s.
  return 1.0 - np.exp(-t)


def _optimize_fixed(
  nbuf: int,
  n: int,
  min_sep: int,
  max_participations: int,
  objective: str,
  num_starts: int,
  rng: np.random.Generator,
  penalty: float,
  max_iter: int,
  progress: ProgressFn,
) -> dict:
  """Best of `num_starts` L-BFGS runs for a fixed number of buffers."""
  import scipy.optimize  # Lazy: scipy.signal and scipy.optimize cost ~0.5 s to import.

  best = None
  rejected = []
  for start in range(num_starts):
    s0 = _initial_interlaced(nbuf, n, None if start == 0 else rng)
    u0 = _params_from_interlaced(s0)
    iters = [0]

    def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
      s, jac = _interlaced_from_params(u)
      try:
        loss, gt, gth, _ = blt_loss_and_grad(
          s[0::2], s[1::2], n, min_sep, max_participations, objective, penalty
        )
      except (ValueError, FloatingPointError, ZeroDivisionError):
        return 1e300, np.zeros_like(u)
      if not np.isfinite(loss):
        return 1e300, np.zeros_like(u)
      g_s = np.empty(2 * nbuf)
      g_s[0::2] = gt
      g_s[1::2] = gth
      return loss, jac.T @ g_s

    def callback(u: np.ndarray, start: int = start) -> None:
      iters[0] += 1
      if progress is not None and iters[0] % 10 == 0:
        progress(
          {
            'stage': 'blt',
            'num_buffers': nbuf,
            'start': start,
            'iteration': iters[0],
            'loss': fun(u)[0],
          }
        )

    with np.errstate(all='ignore'):
      res = scipy.optimize.minimize(
        fun,
        u0,
        jac=True,
        method='L-BFGS-B',
        callback=callback,
        options={'maxiter': max_iter, 'maxcor': 30, 'ftol': 1e-15, 'gtol': 1e-12},
      )
    s, _ = _interlaced_from_params(res.x)
    theta, theta_hat = s[0::2], s[1::2]
    record = {
      'num_buffers': nbuf,
      'start': start,
      'iterations': iters[0],
      'message': str(res.message),
    }
    try:
      with np.errstate(over='raise', invalid='raise', divide='raise', under='ignore'):
        omega = output_scale_from_decays(theta, theta_hat)
        check_blt_sensitivity_assumptions(theta, omega)
        if np.any(np.diff(theta) >= 0.0):
          raise ValueError('buf_decay not distinct')
        err_fn = blt_max_error if objective == 'max' else blt_rms_error
        sens = blt_sensitivity(theta, omega, n, min_sep, max_participations)
        loss = err_fn(theta, omega, n) * sens
      record.update(buf_decay=theta, output_scale=omega, loss=loss, valid=bool(np.isfinite(loss)))
    except (ValueError, FloatingPointError) as e:  # AssumptionError included.
      record.update(valid=False, loss=np.inf, reason=str(e))
    if progress is not None:
      progress(
        {
          'stage': 'blt',
          'num_buffers': nbuf,
          'start': start,
          'done': True,
          'loss': record['loss'],
          'valid': record['valid'],
        }
      )
    if not record['valid']:
      rejected.append(record)
    elif best is None or record['loss'] < best['loss']:
      best = record
  if best is None:
    return {'num_buffers': nbuf, 'valid': False, 'loss': np.inf, 'rejected': rejected}
  best['rejected'] = rejected
  return best


def optimize_blt(
  n: int,
  min_sep: int,
  max_participations: int,
  num_buffers: Optional[int] = None,
  objective: str = 'max',
  num_starts: int = 8,
  seed: int = 0,
  progress: ProgressFn = None,
  max_buffers: int = 5,
  penalty: float = PENALTY_STRENGTH,
  max_iter: int = 2000,
) -> tuple[np.ndarray, np.ndarray, dict]:
  """Optimizes BLT(θ, ω) for MaxLoss or RmsLoss (BLT Alg. 4).

  Variables are the interlaced pair θ_1 > θ̂_1 > θ_2 > … > θ̂_nbuf in (0, 1),
  parametrized by cumulative sigmoids; ω and ω̂ follow from Alg. 5. Interlacing
  is exactly the set where ω > 0, and it implies Σω < 1, so Thm 3.1 holds
  everywhere the optimizer looks (it is re-checked on the result). L-BFGS with
  analytic gradients, `num_starts` starts (the first deterministic, the rest
  random from `seed`). With num_buffers None, tries 1, 2, … up to
  `max_buffers` and stops once a buffer count does not improve the best loss
  by a relative 1e-6 (automatic choice of the number of buffers).

  Returns:
    (buf_decay, output_scale, info); info has loss (of `objective`), max_loss,
    rms_loss, sens, max_error, rms_error, inv_buf_decay, inv_output_scale,
    num_buffers, seconds and per_buffers (the best record per buffer count).
  """
  start_time = time.perf_counter()
  rng = np.random.default_rng(seed)
  counts = [num_buffers] if num_buffers is not None else list(range(1, max_buffers + 1))
  best = None
  per_buffers = []
  for nbuf in counts:
    if nbuf < 1:
      raise ValueError(f'num_buffers must be >= 1, got {nbuf}')
    t0 = time.perf_counter()
    rec = _optimize_fixed(
      nbuf, n, min_sep, max_participations, objective, num_starts, rng, penalty, max_iter, progress
    )
    rec['seconds'] = time.perf_counter() - t0
    per_buffers.append({k: v for k, v in rec.items()})
    improved = rec['valid'] and (best is None or rec['loss'] < best['loss'] * (1.0 - 1e-6))
    if improved:
      best = rec
    elif num_buffers is None and best is not None:
      break
  if best is None:
    raise RuntimeError(
      'BLT optimization found no solution satisfying the assumptions of BLT Thm 3.1'
    )
  theta, omega = best['buf_decay'], best['output_scale']
  theta_hat, omega_hat = inverse_blt(theta, omega)
  sens = blt_sensitivity(theta, omega, n, min_sep, max_participations)
  max_err = blt_max_error(theta, omega, n)
  rms_err = blt_rms_error(theta, omega, n)
  info = {
    'objective': objective,
    'loss': best['loss'],
    'max_loss': max_err * sens,
    'rms_loss': rms_err * sens,
    'sens': sens,
    'max_error': max_err,
    'rms_error': rms_err,
    'inv_buf_decay': theta_hat,
    'inv_output_scale': omega_hat,
    'num_buffers': int(theta.size),
    'seconds': time.perf_counter() - start_time,
    'per_buffers': per_buffers,
  }
  if progress is not None:
    progress(
      {
        'stage': 'blt',
        'done': True,
        'num_buffers': info['num_buffers'],
        'loss': info['loss'],
        'seconds': info['seconds'],
      }
    )
  return theta, omega, info


# ----------------------------------------------------------------------------
# The BLT strategy.
# ----------------------------------------------------------------------------


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
  conditioning_field: ClassVar[str] = "strategy fields 'buf_decay' and 'output_scale'"

  @property
  def num_buffers(self) -> int:
    return len(self.buf_decay)

  @classmethod
  def from_dict(cls, obj):
    buf_decay = strategy_lib.float_vector(obj, 'buf_decay')
    output_scale = strategy_lib.float_vector(obj, 'output_scale')
    if len(buf_decay) != len(output_scale):
      raise strategy_lib.StrategyError(
        f"strategy fields 'buf_decay' and 'output_scale' must have equal length, got "
        f"{len(buf_decay)} and {len(output_scale)}"
      )
    outside = np.flatnonzero((buf_decay <= 0) | (buf_decay >= 1))
    if outside.size:
      i = outside[0]
      raise strategy_lib.StrategyError(
        f"strategy field 'buf_decay' must lie in (0, 1), got {buf_decay[i]!r} at index {i}"
      )
    if len(np.unique(buf_decay)) != len(buf_decay):
      raise strategy_lib.StrategyError("strategy field 'buf_decay' must have distinct values")
    negative = np.flatnonzero(output_scale < 0)
    if negative.size:
      i = negative[0]
      raise strategy_lib.StrategyError(
        f"strategy field 'output_scale' must be >= 0, got {output_scale[i]!r} at index {i}"
      )
    strategy = cls(
      strategy_lib.readonly(buf_decay),
      strategy_lib.readonly(output_scale),
      metadata=strategy_lib.extra_fields(obj, ('buf_decay', 'output_scale')),
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
    buf_decay, output_scale, info = optimize_blt(
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
