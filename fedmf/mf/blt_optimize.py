"""The BLT optimizer (BLT Alg. 4): interlaced decays by cumulative sigmoids, analytic gradients,
multi-start L-BFGS through the shared driver (`fedmf.mf.lbfgs`), automatic buffer count."""

from __future__ import annotations

import time
from typing import Optional

import numpy as np

from fedmf.mf import lbfgs
from fedmf.mf import sensitivity
from fedmf.mf.blt_math import (
  powers,
  blt_max_error,
  blt_rms_error,
  blt_sensitivity,
  check_blt_sensitivity_assumptions,
  inverse_blt,
  output_scale_from_decays,
)

PENALTY_STRENGTH = 1e-7  # λ of BLT Alg. 4.


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
  pw = powers(theta, n - 1)
  pw_hat = powers(theta_hat, n - 1)
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
  progress: lbfgs.ProgressFn,
) -> dict:
  """Best of `num_starts` L-BFGS runs for a fixed number of buffers."""
  best = None
  rejected = []
  for start in range(num_starts):
    s0 = _initial_interlaced(nbuf, n, None if start == 0 else rng)
    u0 = _params_from_interlaced(s0)

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

    def on_step(step: lbfgs.Step, start: int = start) -> None:
      if step.iteration % 10 == 0:
        progress(
          {
            'stage': 'blt',
            'num_buffers': nbuf,
            'start': start,
            'iteration': step.iteration,
            'loss': fun(step.x)[0],
          }
        )

    with np.errstate(all='ignore'):
      res = lbfgs.minimize(
        fun,
        u0,
        max_iter=max_iter,
        memory=30,
        line_search='scipy',
        ftol=1e-15,
        gtol=1e-12,
        on_step=None if progress is None else on_step,
      )
    s, _ = _interlaced_from_params(res.x)
    theta, theta_hat = s[0::2], s[1::2]
    record = {
      'num_buffers': nbuf,
      'start': start,
      'iterations': res.iterations,
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
  progress: lbfgs.ProgressFn = None,
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
