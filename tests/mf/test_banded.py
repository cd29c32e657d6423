"""Tests for fedmf.mf.banded and fedmf.mf.banded_optimize."""

import resource
import time
import tracemalloc

import numpy as np
import pytest
import scipy.optimize

from fedmf.mf import toeplitz_math
from fedmf.mf import banded_stream
from fedmf.mf import banded_matrix
from fedmf.mf import banded_optimize
from fedmf.mf import streaming
from fedmf.mf.checks import StrategyError
from fedmf.mf import workloads


def _random_theta(n, bands, seed=0):
  rng = np.random.default_rng(seed)
  theta = rng.uniform(-1.0, 1.0, (bands, n))
  theta[0] += 2.0  # dominant positive diagonal: well conditioned
  return banded_matrix.normalize_columns(theta, n)


# ---------------------------------------------------------------------------------------------
# Representation.


def test_columns_roundtrip_and_out_of_range_zero():
  cols = [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0, 8.0], [9.0]]
  theta = banded_matrix.columns_to_theta(cols)
  assert theta.shape == (3, 4)
  np.testing.assert_array_equal(theta[:, 0], [1, 2, 3])
  np.testing.assert_array_equal(theta[:, 1], [4, 5, 0])
  np.testing.assert_array_equal(theta[:, 2], [6, 7, 0])  # 8 is below row n-1: out of range
  out = banded_matrix.theta_to_columns(theta)
  assert [len(c) for c in out] == [3, 3, 2, 1]
  c = banded_matrix.banded_matrix(theta)
  np.testing.assert_array_equal(c[:, 2], [0, 0, 6, 7])
  np.testing.assert_array_equal(banded_matrix.theta_from_matrix(c, 3), theta)


def test_normalize_truncates_before_normalizing():
  theta = np.array([[3.0, 3.0, 3.0, 3.0, 1.0], [4.0, 4.0, 4.0, 4.0, 0.0]])
  full = banded_matrix.normalize_columns(theta, 5)
  np.testing.assert_allclose(full[:, 0], [0.6, 0.8])
  np.testing.assert_allclose(full[:, 4], [1.0, 0.0])
  short = banded_matrix.normalize_columns(theta, 4)
  assert short.shape == (2, 4)
  np.testing.assert_allclose(short[:, 2], [0.6, 0.8])
  np.testing.assert_allclose(short[:, 3], [1.0, 0.0])  # column 3 truncated to [3], then normalized
  c = banded_matrix.banded_matrix(short)
  np.testing.assert_allclose(np.linalg.norm(c, axis=0), 1.0)


def test_normalize_rejects_zero_column():
  # Column 2 of the 3×3 block is [0]: its 5 lies below the last row.
  with pytest.raises(ValueError, match='column 2'):
    banded_matrix.normalize_columns([[1.0, 1.0], [0.0, 1.0], [0.0, 5.0]], 3)


def test_sensitivity_sq():
  assert banded_matrix.sensitivity_sq(2052, 342, 342, 6) == 6
  assert banded_matrix.sensitivity_sq(10, 2, 4, None) == 3
  assert banded_matrix.sensitivity_sq(10, 2, 4, 2) == 2
  with pytest.raises(ValueError, match='min_sep'):
    banded_matrix.sensitivity_sq(10, 5, 4, 2)


# ---------------------------------------------------------------------------------------------
# Streaming.


@pytest.mark.parametrize('trailing', [(), (3,), (2, 2)])
@pytest.mark.parametrize('bands', [1, 3, 7])
def test_stream_matches_dense(trailing, bands):
  n = 11
  theta = _random_theta(n, bands, seed=bands)
  c = banded_matrix.banded_matrix(theta)
  rng = np.random.default_rng(1)
  z = rng.standard_normal((n,) + trailing)
  want_inv = np.linalg.solve(c, z.reshape(n, -1)).reshape(z.shape)
  stream = banded_stream.banded_stream(theta)
  np.testing.assert_allclose(streaming.inverse_noise(stream, z), want_inv, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(
    streaming.row_norms(stream, n), np.linalg.norm(np.linalg.inv(c), axis=1), rtol=1e-12
  )
  with pytest.raises(StrategyError, match='n=11'):
    streaming.inverse_noise(stream, np.zeros((n + 1,) + trailing))


def test_toeplitz_stream_has_no_horizon_and_tracks_row_norms():
  coefs = [1.0, -0.4, 0.3, 0.1]
  n = 30
  c = toeplitz_math.lt_toeplitz(coefs, n)
  z = np.random.default_rng(2).standard_normal((n, 2))
  stream = banded_stream.toeplitz_stream(coefs)
  assert stream.horizon is None
  np.testing.assert_allclose(streaming.inverse_noise(stream, z), np.linalg.solve(c, z), atol=1e-10)
  np.testing.assert_allclose(
    streaming.row_norms(stream, n), np.linalg.norm(np.linalg.inv(c), axis=1), rtol=1e-10
  )


def test_stream_rejects_a_zero_diagonal():
  theta = _random_theta(5, 2)
  theta[0, 2] = 0.0
  with pytest.raises(ValueError, match='diagonal'):
    banded_stream.banded_stream(theta)
  with pytest.raises(ValueError, match='diagonal'):
    banded_stream.toeplitz_stream([0.0, 1.0])


# ---------------------------------------------------------------------------------------------
# Error and gradients.


@pytest.mark.parametrize('n,bands', [(1, 1), (9, 1), (9, 3), (16, 16), (30, 5)])
@pytest.mark.parametrize('name', ['prefix', 'momentum'])
def test_decoder_row_sq_norms_match_dense(n, bands, name):
  theta = _random_theta(n, min(bands, n), seed=n)
  a = workloads.by_name(name, n)
  b = a @ np.linalg.inv(banded_matrix.banded_matrix(theta))
  workload = None if name == 'prefix' else a
  np.testing.assert_allclose(
    banded_matrix.decoder_row_sq_norms(theta, workload), np.sum(b * b, axis=1), rtol=1e-9
  )
  np.testing.assert_allclose(banded_matrix.loss_sq(theta, workload), np.sum(b * b), rtol=1e-9)


def test_identity_loss_is_45_at_n9():
  assert banded_matrix.loss_sq(np.ones((1, 9))) == pytest.approx(45.0)


@pytest.mark.parametrize('name', ['prefix', 'momentum'])
def test_theta_gradient_matches_finite_differences(name):
  n, bands = 10, 4
  rng = np.random.default_rng(3)
  theta = banded_matrix.columns_to_theta(rng.uniform(0.2, 1.0, (bands, n)), n)
  a = None if name == 'prefix' else workloads.momentum_with_cooldown(n, 0.9, 3)
  value, grad = banded_matrix.loss_sq_and_grad(theta, a)
  assert value == pytest.approx(banded_matrix.loss_sq(banded_matrix.normalize_columns(theta, n), a))
  eps = 1e-6
  for r, j in [(0, 0), (1, 3), (3, 2), (2, 7), (0, 9), (1, 8)]:
    e = np.zeros_like(theta)
    e[r, j] = eps
    fd = (
      banded_matrix.loss_sq(banded_matrix.normalize_columns(theta + e, n), a)
      - banded_matrix.loss_sq(banded_matrix.normalize_columns(theta - e, n), a)
    ) / (2 * eps)
    assert grad[r, j] == pytest.approx(fd, rel=1e-5, abs=1e-6)
  assert np.all(grad[3, 7:] == 0)  # out of range


def test_row_weighted_and_pnorm_gradients_match_finite_differences():
  n, bands = 9, 3
  rng = np.random.default_rng(4)
  theta = banded_matrix.columns_to_theta(rng.uniform(0.2, 1.0, (bands, n)), n)
  w = rng.uniform(0.0, 2.0, n)

  def weighted(t):
    return float(w @ banded_matrix.decoder_row_sq_norms(banded_matrix.normalize_columns(t, n)))

  def pnorm(t):
    r = banded_matrix.decoder_row_sq_norms(banded_matrix.normalize_columns(t, n))
    return float(np.sum(r**16) ** (1 / 16))

  value, grad = banded_matrix.loss_sq_and_grad(theta, row_weights=w)
  assert value == pytest.approx(weighted(theta))
  p_value, p_grad, _ = banded_matrix.loss_and_grad_with_row_weights(
    theta, None, lambda r: banded_optimize._pnorm_weights(r, 16)
  )  # pylint: disable=protected-access
  assert p_value == pytest.approx(pnorm(theta))
  eps = 1e-6
  for r, j in [(0, 0), (1, 4), (2, 6), (0, 8)]:
    e = np.zeros_like(theta)
    e[r, j] = eps
    assert grad[r, j] == pytest.approx(
      (weighted(theta + e) - weighted(theta - e)) / (2 * eps), rel=1e-5
    )
    assert p_grad[r, j] == pytest.approx(
      (pnorm(theta + e) - pnorm(theta - e)) / (2 * eps), rel=1e-5
    )


def test_x_route_gradient_matches_finite_differences():
  n, bands = 10, 3
  x_low = banded_matrix.gram_band(_random_theta(n, bands, seed=5))
  a = workloads.momentum_with_cooldown(n, 0.9, 4)
  value, grad = banded_optimize._x_value_and_grad(x_low, a)  # pylint: disable=protected-access
  c = banded_matrix.banded_matrix(banded_matrix.reverse_cholesky_banded(x_low))
  x_dense = c.T @ c
  assert value == pytest.approx(np.trace(a.T @ a @ np.linalg.inv(x_dense)))
  eps = 1e-6
  for r, j in [(1, 0), (1, 5), (2, 3), (2, 7)]:
    e = np.zeros_like(x_low)
    e[r, j] = eps
    fd = (
      banded_optimize._x_value_and_grad(x_low + e, a)[0]  # pylint: disable=protected-access
      - banded_optimize._x_value_and_grad(x_low - e, a)[0]
    ) / (2 * eps)  # pylint: disable=protected-access
    assert grad[r, j] == pytest.approx(fd, rel=1e-5)


def test_reverse_cholesky_roundtrip():
  theta = _random_theta(12, 4, seed=7)
  theta = theta * np.sign(theta[0])  # positive diagonal: the reverse Cholesky factor is unique
  np.testing.assert_allclose(
    banded_matrix.reverse_cholesky_banded(banded_matrix.gram_band(theta)), theta, atol=1e-12
  )
  c = banded_matrix.banded_matrix(theta)
  x_low = banded_matrix.gram_band(theta)
  np.testing.assert_allclose(
    banded_matrix.banded_matrix(x_low) + banded_matrix.banded_matrix(x_low).T - np.diag(x_low[0]),
    c.T @ c,
    atol=1e-12,
  )


def test_reverse_cholesky_rejects_indefinite():
  x_low = np.array([[1.0, 1.0, 1.0], [0.99, 0.99, 0.0]])
  with pytest.raises(np.linalg.LinAlgError):
    banded_matrix.reverse_cholesky_banded(x_low)


# ---------------------------------------------------------------------------------------------
# Optimization.

# Scaling BandMF App. B, Example B.1: optimal 3-banded column-normalized C for n = 9, prefix workload.
_B1_DIAG = [0.740, 0.822, 0.876, 0.821, 0.855, 0.882, 0.892, 0.936, 1.000]
_B1_SUB1 = [0.500, 0.492, 0.395, 0.462, 0.442, 0.403, 0.409, 0.353]
_B1_SUB2 = [0.450, 0.286, 0.278, 0.335, 0.272, 0.243, 0.194]


@pytest.mark.parametrize('method', ['x', 'theta'])
def test_example_b1_optimal_three_banded(method):
  theta, info = banded_optimize.optimize_bandmf(9, 3, method=method, rtol=1e-12)
  assert info['loss_sq'] == pytest.approx(24.881, abs=5e-4)
  assert banded_matrix.loss_sq(theta) == pytest.approx(info['loss_sq'], rel=1e-9)
  np.testing.assert_allclose(theta[0], _B1_DIAG, atol=2e-3)
  np.testing.assert_allclose(theta[1, :8], _B1_SUB1, atol=2e-3)
  np.testing.assert_allclose(theta[2, :7], _B1_SUB2, atol=2e-3)
  np.testing.assert_allclose(np.linalg.norm(banded_matrix.banded_matrix(theta), axis=0), 1.0)


def test_optimize_reports_sensitivity_and_progress():
  seen = []
  theta, info = banded_optimize.optimize_bandmf(
    20, 4, min_sep=5, max_participations=3, max_iter=15, progress=seen.append
  )
  assert theta.shape == (4, 20)
  assert info['sens_sq'] == 3
  assert info['expected_total_sq_error'] == pytest.approx(3 * info['loss_sq'])
  assert [d['iteration'] for d in seen] == list(range(1, len(seen) + 1))
  assert all(b['loss_sq'] <= a['loss_sq'] for a, b in zip(seen, seen[1:]))
  assert info['loss_sq'] < banded_matrix.loss_sq(banded_optimize.warm_start_theta(20, 4))


def test_optimize_momentum_workload_beats_warm_start():
  n = 24
  a = workloads.momentum_with_cooldown(n, 0.95, 6)
  theta, info = banded_optimize.optimize_bandmf(n, 4, workload=a, max_iter=60)
  assert banded_matrix.loss_sq(theta, a) == pytest.approx(info['loss_sq'], rel=1e-9)
  assert info['loss_sq'] < 0.99 * banded_matrix.loss_sq(banded_optimize.warm_start_theta(n, 4), a)


def test_max_objective_lowers_max_error():
  seen = []
  _, info_max = banded_optimize.optimize_bandmf(
    24, 4, objective='max', max_iter=200, progress=seen.append
  )
  _, info_rms = banded_optimize.optimize_bandmf(24, 4, max_iter=200)
  assert info_max['objective'] == 'max'
  assert info_max['max_row_sq'] < 0.95 * info_rms['max_row_sq']
  assert info_max['loss_sq'] > info_rms['loss_sq']
  assert [d['iteration'] for d in seen] == list(range(1, len(seen) + 1))


def test_methods_agree():
  _, info_x = banded_optimize.optimize_bandmf(32, 5, method='x', max_iter=300, rtol=1e-12)
  _, info_t = banded_optimize.optimize_bandmf(32, 5, method='theta', max_iter=300, rtol=1e-12)
  assert info_x['loss_sq'] == pytest.approx(info_t['loss_sq'], rel=1e-6)


def test_interpolate_theta_reproduces_a_bilinear_band_and_keeps_out_of_range_zero():
  # Bilinear interpolation with aligned corners is exact for a + b·r + c·j + d·r·j.
  def band(bands, n):
    r, j = np.arange(bands)[:, None] / (bands - 1), np.arange(n)[None, :] / (n - 1)
    return 1.0 + 0.5 * r - 0.25 * j + 0.125 * r * j

  fine = banded_optimize.interpolate_theta(band(5, 40), 79, 9)
  expected = band(9, 79)
  inside = np.arange(9)[:, None] + np.arange(79)[None, :] < 79
  np.testing.assert_allclose(fine[inside], expected[inside], rtol=1e-12)
  assert np.all(fine[~inside] == 0.0)
  same = _random_theta(30, 6)
  np.testing.assert_allclose(banded_optimize.interpolate_theta(same, 30, 6), same, rtol=1e-12)


def test_coarse_start_is_chosen_by_size_and_validated():
  assert banded_optimize.uses_coarse_start(2052, 342)
  assert not banded_optimize.uses_coarse_start(1024, 16)  # the slow Toeplitz-ratio test's size
  assert not banded_optimize.uses_coarse_start(256, 200)
  assert banded_optimize.uses_coarse_start(64, 8, 'coarse')
  assert not banded_optimize.uses_coarse_start(2052, 342, 'sqrt-toeplitz')
  with pytest.raises(ValueError, match='start must be'):
    banded_optimize.optimize_bandmf(10, 2, start='toeplitz')


def test_coarse_start_beats_the_cold_start_and_reaches_the_same_optimum():
  # Measured at this size: after 10 iterations 1331.98 against 1332.42 (the same 39-40 iterations
  # to the stopping rule; the saving grows with size: 109 against 133 at n = 2052, b̂ = 342).
  n, bands = 160, 20
  budget = dict(max_iter=10, rtol=0.0)
  _, cold = banded_optimize.optimize_bandmf(n, bands, start='sqrt-toeplitz', **budget)
  seen = []
  theta, warm = banded_optimize.optimize_bandmf(
    n, bands, start='coarse', progress=seen.append, **budget
  )
  assert cold['start'] == 'sqrt-toeplitz' and cold['coarse_iterations'] == 0
  assert warm['start'] == 'coarse' and warm['coarse_iterations'] > 0
  assert warm['loss_sq'] < cold['loss_sq']
  assert banded_matrix.loss_sq(theta) == pytest.approx(warm['loss_sq'], rel=1e-12)
  np.testing.assert_allclose(np.linalg.norm(banded_matrix.banded_matrix(theta), axis=0), 1.0)
  # Progress counts the fine level's iterations only (a progress bar bounds them by max_iter).
  assert [d['iteration'] for d in seen] == list(range(1, warm['iterations'] + 1))
  # Converged, both starts reach one optimum (the loss is not convex in theta, but here they agree).
  tight = dict(max_iter=2000, rtol=1e-12)
  _, cold = banded_optimize.optimize_bandmf(n, bands, start='sqrt-toeplitz', **tight)
  _, warm = banded_optimize.optimize_bandmf(n, bands, start='coarse', **tight)
  assert warm['loss_sq'] == pytest.approx(cold['loss_sq'], rel=1e-7)


def test_optimize_argument_errors():
  with pytest.raises(ValueError, match='min_sep'):
    banded_optimize.optimize_bandmf(10, 4, min_sep=3)
  with pytest.raises(ValueError, match='method'):
    banded_optimize.optimize_bandmf(10, 2, objective='max', method='x')
  with pytest.raises(ValueError, match='objective'):
    banded_optimize.optimize_bandmf(10, 2, objective='mean')
  theta, info = banded_optimize.optimize_bandmf(6, 1)
  np.testing.assert_array_equal(theta, np.ones((1, 6)))
  assert info['loss_sq'] == pytest.approx(21.0)


def test_choose_bands():
  kwargs = dict(n=24, min_sep=6, max_participations=4, max_iter=40)
  assert banded_optimize.choose_bands(**kwargs) == 6
  assert banded_optimize.choose_bands(**kwargs, candidates=[1, 2, 3, 9]) == 3
  assert banded_optimize.choose_bands(**kwargs, rtol=10.0) == 1
  assert banded_optimize.choose_bands(**kwargs, max_bands=4) == 4


def _toeplitz_over_general_rmse_ratio(n, bands):
  """RMSE(column-normalized banded Toeplitz) / RMSE(general banded) (Scaling BandMF §3; both column-normalized).

  The Toeplitz coefficients are optimized locally: the loss of the column-normalized LtToep(θ),
  with gradient Σ_j ∂/∂Θ[r, j] of the general column-normalized gradient (all columns share θ).
  """

  def fun(coefs):
    value, grad = banded_matrix.loss_sq_and_grad(np.tile(coefs[:, None], (1, n)))
    return value, grad.sum(axis=1)

  res = scipy.optimize.minimize(
    fun,
    banded_optimize.sqrt_toeplitz_coefs(bands),
    jac=True,
    method='L-BFGS-B',
    options=dict(maxiter=500, ftol=1e-13, gtol=1e-10),
  )
  toeplitz = banded_matrix.loss_sq(
    banded_matrix.normalize_columns(np.tile(res.x[:, None], (1, n)), n)
  )
  _, info = banded_optimize.optimize_bandmf(n, bands, max_iter=1000, rtol=1e-10)
  return float(np.sqrt(toeplitz / info['loss_sq']))


def test_toeplitz_vs_general_banded_ratio_n256():
  assert _toeplitz_over_general_rmse_ratio(256, 16) == pytest.approx(1.012, abs=1.5e-3)


@pytest.mark.slow
def test_toeplitz_vs_general_banded_ratio_n1024():
  assert _toeplitz_over_general_rmse_ratio(1024, 16) == pytest.approx(1.007, abs=1.5e-3)


@pytest.mark.slow
def test_stackoverflow_scale_n2052_bands342():
  """BandMF/Scaling BandMF StackOverflow setting: tr(AᵀA X⁻¹) ≈ 2.53e4 for n = 2052, b̂ = 342."""
  tracemalloc.start()
  start = time.perf_counter()
  theta, info = banded_optimize.optimize_bandmf(
    2052, 342, min_sep=342, max_participations=6, max_iter=100
  )
  seconds = time.perf_counter() - start
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  print(
    f"n=2052 bands=342: loss_sq={info['loss_sq']:.1f} iterations={info['iterations']} "
    f'{seconds:.1f}s peak_traced={peak / 2**20:.0f}MiB '
    f'maxrss={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}MiB'
  )
  assert info['loss_sq'] == pytest.approx(2.53e4, rel=0.01)
  assert banded_matrix.loss_sq(theta) == pytest.approx(info['loss_sq'], rel=1e-8)
  assert info['sens_sq'] == 6
