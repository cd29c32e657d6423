"""Tests for fedmf.mf.blt: golden values, inverse, Alg. 5, streaming, losses, optimizer."""

import numpy as np
import pytest

from fedmf.mf import blt_optimize
from fedmf.mf import blt_math
from fedmf.mf import toeplitz_math
from fedmf.mf import streaming
from fedmf.mf import workloads
from tests.mf.brute_force import brute_force_patterns

# jax_privacy's golden values (its buffered_toeplitz tests).
GOLD_DECAY = [0.9999528892, 0.9857068667]
GOLD_SCALE = [0.0122853238, 0.1878393665]
GOLD_N = 100_000


def _random_interlaced(rng, nbuf):
  """θ_1 > θ̂_1 > θ_2 > … in (0, 1), so ω > 0 (see blt_optimize._interlaced_from_params)."""
  s = np.sort(rng.uniform(0.02, 0.995, 2 * nbuf))[::-1]
  return s[0::2], s[1::2]


def _alg5_literal(theta, theta_hat):
  """BLT Alg. 5 as printed: ω_i = f(1/θ_i) / Π_{j≠i}(1 - θ_j/θ_i), f = (p-q)/x."""
  p = np.polynomial.Polynomial(np.poly(theta_hat))  # ascending in x
  q = np.polynomial.Polynomial(np.poly(theta))
  f_coef = (p - q).coef[1:]  # (p - q)/x; p(0) = q(0) = 1.
  f = np.polynomial.Polynomial(f_coef)
  out = []
  for i, t in enumerate(theta):
    others = np.delete(theta, i)
    out.append(f(1.0 / t) / np.prod(1.0 - others / t))
  return np.array(out)


# ---------------------------------------------------------------------------
# Golden values.
# ---------------------------------------------------------------------------


def test_golden_first_coefficients():
  np.testing.assert_allclose(
    blt_math.blt_coefs(GOLD_DECAY, GOLD_SCALE, 5),
    [1, 0.2001246903, 0.1974392984, 0.1947922810, 0.1921830894],
    rtol=0,
    atol=1e-10,
  )


def test_golden_single_participation_losses():
  n = GOLD_N
  # Single participation (k = 1, or b >= n): sens = ‖first column‖ = ‖c‖.
  sens = blt_math.blt_sensitivity(GOLD_DECAY, GOLD_SCALE, n, 1, 1)
  assert sens == pytest.approx(blt_math.blt_sensitivity(GOLD_DECAY, GOLD_SCALE, n, n, 7))
  assert sens == pytest.approx(np.linalg.norm(blt_math.blt_coefs(GOLD_DECAY, GOLD_SCALE, n)))
  # The published parameters are rounded to 10 digits, hence rel=1e-8.
  assert sens**2 == pytest.approx(4.166791846704, rel=1e-8)
  max_err = blt_math.blt_max_error(GOLD_DECAY, GOLD_SCALE, n)
  assert max_err**2 == pytest.approx(6.733124995051, rel=1e-8)
  max_loss = blt_math.blt_max_loss(GOLD_DECAY, GOLD_SCALE, n, n, 1)
  assert max_loss**2 == pytest.approx(28.05553033222, rel=1e-8)
  assert max_loss == pytest.approx(5.296747146, rel=1e-8)


def test_golden_inverse():
  theta_hat, omega_hat = blt_math.inverse_blt(GOLD_DECAY, GOLD_SCALE)
  np.testing.assert_allclose(theta_hat, [0.9991333338232633, 0.7864017317767367], rtol=1e-8)
  np.testing.assert_allclose(omega_hat, [-5.1725898811e-05, -0.20007296440118855], rtol=1e-7)


@pytest.mark.parametrize(
  'min_sep,k,expected',
  [(1, 12, 67.76863612), (3, 4, 9.701490024), (4, 2, 3.778520088), (5, 3, 5.539304402)],
)
def test_min_sep_sensitivity_reference_table(min_sep, k, expected):
  theta, omega, n = [0.9, 0.5], [0.2, 0.3], 12
  sens = blt_math.blt_sensitivity(theta, omega, n, min_sep, k)
  assert sens**2 == pytest.approx(expected, rel=1e-8)
  # Independent brute force over 0/1 patterns (X >= 0 here).
  m = toeplitz_math.lt_toeplitz(blt_math.blt_coefs(theta, omega, n), n)
  brute = max(np.sum(m[:, list(p)].sum(axis=1) ** 2) for p in brute_force_patterns(n, min_sep, k))
  assert sens**2 == pytest.approx(brute, rel=1e-12)


# ---------------------------------------------------------------------------
# Inverse BLT and Alg. 5.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('nbuf', [1, 2, 3, 4])
def test_inverse_blt_matches_dense_inverse(nbuf):
  rng = np.random.default_rng(nbuf)
  theta, theta_hat_true = _random_interlaced(rng, nbuf)
  omega = blt_math.output_scale_from_decays(theta, theta_hat_true)
  assert np.all(omega > 0) and omega.sum() < 1
  n = 60
  c = blt_math.blt_coefs(theta, omega, n)
  dense_inv = np.linalg.inv(toeplitz_math.lt_toeplitz(c, n))
  theta_hat, omega_hat = blt_math.inverse_blt(theta, omega)
  np.testing.assert_allclose(theta_hat, np.sort(theta_hat_true)[::-1], rtol=1e-9)
  np.testing.assert_allclose(
    blt_math.blt_coefs(theta_hat, omega_hat, n), dense_inv[:, 0], atol=1e-10
  )
  np.testing.assert_allclose(toeplitz_math.inverse_coefs(c, n), dense_inv[:, 0], atol=1e-10)
  np.testing.assert_allclose(
    blt_math.blt_inverse_coefs(theta, omega, n), dense_inv[:, 0], atol=1e-10
  )
  # The inverse of the inverse is the original.
  theta2, omega2 = blt_math.inverse_blt(theta_hat, omega_hat)
  np.testing.assert_allclose(theta2, theta, rtol=1e-8)
  np.testing.assert_allclose(omega2, omega, rtol=1e-7, atol=1e-12)


def test_inverse_blt_non_interlaced_negative_scale():
  # θ = [.9, .5], ω = [.5, -.2] has complex θ̂: refused with a ValueError.
  with pytest.raises(ValueError, match='complex'):
    blt_math.inverse_blt([0.9, 0.5], [0.5, -0.2])
  # Mixed-sign ω with a real inverse; check it against lfilter.
  theta, omega = np.array([0.9, 0.5]), np.array([0.1, -0.05])
  theta_hat, omega_hat = blt_math.inverse_blt(theta, omega)
  n = 40
  np.testing.assert_allclose(
    blt_math.blt_coefs(theta_hat, omega_hat, n),
    toeplitz_math.inverse_coefs(blt_math.blt_coefs(theta, omega, n), n),
    atol=1e-12,
  )


@pytest.mark.parametrize('nbuf', [1, 2, 3, 5])
def test_alg5_closed_form_equals_literal_and_round_trips(nbuf):
  rng = np.random.default_rng(10 + nbuf)
  theta = np.sort(rng.uniform(0.05, 0.99, nbuf))[::-1]
  theta_hat = np.sort(rng.uniform(0.05, 0.99, nbuf))[::-1]  # any pair
  omega = blt_math.output_scale_from_decays(theta, theta_hat)
  np.testing.assert_allclose(omega, _alg5_literal(theta, theta_hat), rtol=1e-8, atol=1e-12)
  got_hat, got_omega_hat = blt_math.inverse_blt(theta, omega)
  np.testing.assert_allclose(got_hat, np.sort(theta_hat)[::-1], rtol=1e-7)
  np.testing.assert_allclose(
    got_omega_hat, blt_math.output_scale_from_decays(got_hat, theta), rtol=1e-12
  )


def test_alg5_requires_distinct_decays():
  with pytest.raises(ValueError):
    blt_math.output_scale_from_decays([0.5, 0.5], [0.4, 0.3])


# ---------------------------------------------------------------------------
# Streaming.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize('shape', [(), (3,), (2, 2)])
def test_streams_match_dense(shape):
  rng = np.random.default_rng(5)
  theta, theta_hat = _random_interlaced(rng, 3)
  omega = blt_math.output_scale_from_decays(theta, theta_hat)
  n = 25
  c_dense = toeplitz_math.lt_toeplitz(blt_math.blt_coefs(theta, omega, n), n)
  x = rng.normal(size=(n,) + shape)
  flat = x.reshape(n, -1)
  expected_mul = (c_dense @ flat).reshape(x.shape)
  expected_inv = np.linalg.solve(c_dense, flat).reshape(x.shape)
  np.testing.assert_allclose(blt_math.blt_multiply(theta, omega, x), expected_mul, atol=1e-12)
  np.testing.assert_allclose(blt_math.blt_solve(theta, omega, x), expected_inv, atol=1e-10)
  # O(nbuf·d) state and no horizon: keep going past n.
  stream = blt_math.blt_stream(theta, omega)
  assert stream.horizon is None
  state = stream.init([streaming.Spec(shape)], streaming.NUMPY)
  assert [b.shape for b in state[1][0]] == [shape] * 3
  longer = np.concatenate([x, rng.normal(size=(5,) + shape)])
  outs = streaming.inverse_noise(stream, longer)
  np.testing.assert_allclose(outs[:n], expected_inv, atol=1e-10)
  np.testing.assert_allclose(blt_math.blt_multiply(theta, omega, outs), longer, atol=1e-10)
  # ‖row_t of C⁻¹‖ from the float64 impulse channel.
  np.testing.assert_allclose(
    streaming.row_norms(stream, n), np.linalg.norm(np.linalg.inv(c_dense), axis=1), rtol=1e-10
  )


# ---------------------------------------------------------------------------
# Losses.
# ---------------------------------------------------------------------------


def test_losses_match_dense():
  rng = np.random.default_rng(7)
  theta, theta_hat = _random_interlaced(rng, 2)
  omega = blt_math.output_scale_from_decays(theta, theta_hat)
  n, min_sep, k = 13, 4, 3
  c_dense = toeplitz_math.lt_toeplitz(blt_math.blt_coefs(theta, omega, n), n)
  decoder = workloads.prefix_sum(n) @ np.linalg.inv(c_dense)
  max_err = np.sqrt(np.max(np.sum(decoder**2, axis=1)))
  rms_err = np.linalg.norm(decoder) / np.sqrt(n)
  brute_sens = np.sqrt(
    max(np.sum(c_dense[:, list(p)].sum(axis=1) ** 2) for p in brute_force_patterns(n, min_sep, k))
  )
  assert blt_math.blt_max_error(theta, omega, n) == pytest.approx(max_err, rel=1e-10)
  assert blt_math.blt_rms_error(theta, omega, n) == pytest.approx(rms_err, rel=1e-10)
  assert blt_math.blt_sensitivity(theta, omega, n, min_sep, k) == pytest.approx(
    brute_sens, rel=1e-12
  )
  assert blt_math.blt_max_loss(theta, omega, n, min_sep, k) == pytest.approx(
    max_err * brute_sens, rel=1e-10
  )
  assert blt_math.blt_rms_loss(theta, omega, n, min_sep, k) == pytest.approx(
    rms_err * brute_sens, rel=1e-10
  )


@pytest.mark.parametrize(
  'theta,omega',
  [
    ([0.9, 0.5], [0.5, -0.2]),  # ω < 0 (c_1 < c_2 although Σω ≤ 1)
    ([0.9, 0.5], [0.7, 0.4]),  # Σω > 1
    ([1.0, 0.5], [0.2, 0.3]),  # θ not in (0, 1)
  ],
)
def test_sensitivity_refuses_outside_thm31(theta, omega):
  with pytest.raises(ValueError):  # AssumptionError is a ValueError.
    blt_math.blt_sensitivity(theta, omega, 12, 3, 2)
  # Without the check it is only a lower bound, but it is still computed.
  assert blt_math.blt_sensitivity(theta, omega, 12, 3, 2, check=False) > 0


def test_interlaced_parametrization_is_feasible():
  rng = np.random.default_rng(11)
  for _ in range(200):
    nbuf = int(rng.integers(1, 6))
    u = rng.normal(0.0, 3.0, 2 * nbuf)
    s, _ = blt_optimize._interlaced_from_params(u)
    theta, theta_hat = s[0::2], s[1::2]
    if np.min(-np.diff(np.concatenate([[1.0], s]))) < 1e-9:
      continue  # too close to call in float64
    omega = blt_math.output_scale_from_decays(theta, theta_hat)
    blt_math.check_blt_sensitivity_assumptions(theta, omega)
  u = rng.normal(size=6)
  _, jac = blt_optimize._interlaced_from_params(u)
  h = 1e-6
  fd = np.stack(
    [
      (
        blt_optimize._interlaced_from_params(u + h * e)[0]
        - blt_optimize._interlaced_from_params(u - h * e)[0]
      )
      / (2 * h)
      for e in np.eye(6)
    ],
    axis=1,
  )
  np.testing.assert_allclose(jac, fd, rtol=1e-6, atol=1e-10)
  np.testing.assert_allclose(
    blt_optimize._interlaced_from_params(
      blt_optimize._params_from_interlaced(blt_optimize._interlaced_from_params(u)[0])
    )[0],
    blt_optimize._interlaced_from_params(u)[0],
    rtol=1e-12,
  )


@pytest.mark.parametrize('objective', ['max', 'rms'])
@pytest.mark.parametrize('nbuf', [1, 3])
def test_loss_gradient_matches_finite_differences(objective, nbuf):
  rng = np.random.default_rng(nbuf)
  theta, theta_hat = _random_interlaced(rng, nbuf)
  n, min_sep, k = 50, 7, 4
  loss, g_theta, g_hat, parts = blt_optimize.blt_loss_and_grad(
    theta, theta_hat, n, min_sep, k, objective, penalty=1e-3
  )
  omega = parts['output_scale']
  err_fn = blt_math.blt_max_error if objective == 'max' else blt_math.blt_rms_error
  core = err_fn(theta, omega, n) * blt_math.blt_sensitivity(theta, omega, n, min_sep, k)
  assert loss > core
  assert blt_optimize.blt_loss_and_grad(theta, theta_hat, n, min_sep, k, objective, penalty=0.0)[
    0
  ] == pytest.approx(core, rel=1e-10)
  x = np.concatenate([theta, theta_hat])

  def f(v):
    return blt_optimize.blt_loss_and_grad(
      v[:nbuf], v[nbuf:], n, min_sep, k, objective, penalty=1e-3
    )[0]

  h = 1e-7
  fd = np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(2 * nbuf)])
  grad = np.concatenate([g_theta, g_hat])
  np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())


# ---------------------------------------------------------------------------
# Optimizer.
# ---------------------------------------------------------------------------


def test_optimize_blt_small_is_valid_and_improves_with_buffers():
  n, min_sep, k = 64, 8, 4
  events = []
  t1, w1, info1 = blt_optimize.optimize_blt(n, min_sep, k, num_buffers=1, num_starts=2, seed=0)
  t2, w2, info2 = blt_optimize.optimize_blt(
    n, min_sep, k, num_buffers=2, num_starts=2, seed=0, progress=events.append
  )
  assert events and events[-1]['done']
  for theta, omega, info in [(t1, w1, info1), (t2, w2, info2)]:
    blt_math.check_blt_sensitivity_assumptions(theta, omega)
    assert info['loss'] == pytest.approx(
      blt_math.blt_max_loss(theta, omega, n, min_sep, k), rel=1e-10
    )
    theta_hat, omega_hat = blt_math.inverse_blt(theta, omega)
    np.testing.assert_allclose(info['inv_buf_decay'], theta_hat)
    np.testing.assert_allclose(info['inv_output_scale'], omega_hat)
  assert info2['loss'] <= info1['loss'] * (1 + 1e-9)
  assert t2.shape == (2,)


def test_optimize_blt_automatic_buffers_rms():
  n, min_sep, k = 64, 16, 3
  theta, omega, info = blt_optimize.optimize_blt(
    n, min_sep, k, objective='rms', num_starts=2, max_buffers=3
  )
  assert info['loss'] == pytest.approx(info['rms_loss'])
  best_listed = min(r['loss'] for r in info['per_buffers'] if r['valid'])
  assert info['loss'] == pytest.approx(best_listed)
  assert 1 <= info['num_buffers'] <= 3


@pytest.mark.slow
def test_optimize_blt_stackoverflow_table3():
  # BLT Table 3 (first loss column is MaxLoss): 2 buffers 10.81, 3-5: 10.79.
  n, min_sep, k = 2052, 342, 6
  theta2, omega2, info2 = blt_optimize.optimize_blt(n, min_sep, k, num_buffers=2)
  assert info2['max_loss'] <= 10.81 + 5e-3
  assert info2['rms_loss'] == pytest.approx(9.34, abs=0.01)
  theta, omega, info = blt_optimize.optimize_blt(n, min_sep, k, objective='max')
  blt_math.check_blt_sensitivity_assumptions(theta, omega)
  assert info['max_loss'] <= 10.79
  assert info['max_loss'] == pytest.approx(
    blt_math.blt_max_loss(theta, omega, n, min_sep, k), rel=1e-10
  )
  assert info['seconds'] < 30


@pytest.mark.slow
def test_optimize_blt_reproduces_golden_single_participation():
  # jax_privacy's golden 2-buffer max-error BLT for n = 100000, k = 1.
  n = GOLD_N
  theta, omega, info = blt_optimize.optimize_blt(n, n, 1, num_buffers=2, num_starts=2)
  golden = blt_math.blt_max_loss(GOLD_DECAY, GOLD_SCALE, n, n, 1)
  assert info['max_loss'] <= golden * (1 + 1e-8)
  np.testing.assert_allclose(theta, GOLD_DECAY, rtol=1e-6)
  np.testing.assert_allclose(omega, GOLD_SCALE, rtol=1e-4)
