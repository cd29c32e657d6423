"""Tests for fedmf.mf.toeplitz: structured losses against dense computations."""

import numpy as np
import pytest

from fedmf.mf import toeplitz_math
from fedmf.mf import sensitivity
from fedmf.mf import toeplitz
from fedmf.mf import workloads
from tests.mf.brute_force import brute_force_patterns


def _random_coefs(rng, bands):
  return np.concatenate([[1.0], rng.uniform(-0.5, 0.8, bands - 1)])


def test_lt_toeplitz_entries():
  c = np.array([3.0, 2.0, 1.0])
  expected = np.array([[3, 0, 0, 0], [2, 3, 0, 0], [1, 2, 3, 0], [0, 1, 2, 3]])
  np.testing.assert_array_equal(toeplitz_math.lt_toeplitz(c, 4), expected)
  np.testing.assert_array_equal(toeplitz_math.lt_toeplitz(c, 2), expected[:2, :2])


def test_inverse_and_decoder_coefs_match_dense():
  rng = np.random.default_rng(0)
  n = 23
  c = _random_coefs(rng, 6)
  c_inv_dense = np.linalg.inv(toeplitz_math.lt_toeplitz(c, n))
  np.testing.assert_allclose(
    toeplitz_math.inverse_coefs(c, n), c_inv_dense[:, 0], rtol=1e-10, atol=1e-12
  )
  decoder = workloads.prefix_sum(n) @ c_inv_dense
  b = toeplitz_math.prefix_decoder_coefs(c, n)
  np.testing.assert_allclose(toeplitz_math.lt_toeplitz(b, n), decoder, atol=1e-10)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_errors_match_dense(seed):
  rng = np.random.default_rng(seed)
  n = 31
  c = _random_coefs(rng, 1 + seed * 4)
  decoder = workloads.prefix_sum(n) @ np.linalg.inv(toeplitz_math.lt_toeplitz(c, n))
  row_sq = np.sum(decoder**2, axis=1)
  np.testing.assert_allclose(toeplitz_math.decoder_row_sq_norms(c, n), row_sq, rtol=1e-10)
  assert toeplitz_math.max_error(c, n) == pytest.approx(np.sqrt(row_sq.max()), rel=1e-10)
  assert toeplitz_math.rms_error(c, n) == pytest.approx(
    np.linalg.norm(decoder) / np.sqrt(n), rel=1e-10
  )


def test_sqrt_coefs_square_to_prefix_sum():
  n = 12
  c = toeplitz_math.sqrt_coefs(n)
  m = toeplitz_math.lt_toeplitz(c, n)
  np.testing.assert_allclose(m @ m, workloads.prefix_sum(n), atol=1e-12)


def test_column_normalized_matrix():
  n = 7
  c = np.array([1.0, 0.6, 0.3])
  m = toeplitz_math.column_normalized_matrix(c, n)
  np.testing.assert_allclose(np.linalg.norm(m, axis=0), np.ones(n))
  dense = toeplitz_math.lt_toeplitz(c, n)
  np.testing.assert_allclose(m[:, 2], dense[:, 2] / np.linalg.norm(c))
  np.testing.assert_allclose(m[:, n - 1], np.eye(n)[:, n - 1])
  np.testing.assert_allclose(m[:, n - 2], dense[:, n - 2] / np.hypot(1, 0.6))


@pytest.mark.parametrize('min_sep,k', [(3, 2), (4, 3), (5, 5), (10, 2)])
def test_banded_sensitivity_matches_brute_force(min_sep, k):
  # bands <= min_sep: columns are disjoint, sens² = max_π Σ_{j∈π} ‖C[:, j]‖².
  rng = np.random.default_rng(min_sep)
  n = 11
  c = _random_coefs(rng, 3)
  col_sq = np.sum(toeplitz_math.lt_toeplitz(c, n) ** 2, axis=0)
  brute = max(col_sq[list(p)].sum() for p in brute_force_patterns(n, min_sep, k))
  got = toeplitz_math.toeplitz_min_sep_sensitivity_sq(c, n, min_sep, k)
  assert got == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize('min_sep,k', [(1, 11), (2, 3), (3, 4), (4, 2)])
def test_monotone_sensitivity_matches_brute_force(min_sep, k):
  # Non-negative, non-increasing coefficients: X >= 0, so 0/1 patterns are
  # the truth (BLT Thm 3.1).
  n = 11
  c = np.sort(np.random.default_rng(k).uniform(0.0, 1.0, n))[::-1]
  m = toeplitz_math.lt_toeplitz(c, n)
  brute = max(np.sum(m[:, list(p)].sum(axis=1) ** 2) for p in brute_force_patterns(n, min_sep, k))
  got = toeplitz_math.toeplitz_min_sep_sensitivity_sq(c, n, min_sep, k)
  assert got == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize('objective', ['max', 'rms'])
def test_band_toeplitz_gradient_matches_finite_differences(objective):
  rng = np.random.default_rng(3)
  n, bands = 40, 9
  c = _random_coefs(rng, bands)
  weights = toeplitz_math.error_weights(n, objective)
  shifts = sensitivity.worst_pattern_offsets(n, 9, 4)
  loss, sens_sq, err_sq, grad = toeplitz_math.band_toeplitz_loss_and_grad(c, n, shifts, weights)
  assert sens_sq == pytest.approx(toeplitz_math.toeplitz_min_sep_sensitivity_sq(c, n, 9, 4))
  err = toeplitz_math.max_error(c, n) if objective == 'max' else toeplitz_math.rms_error(c, n)
  assert err_sq == pytest.approx(err**2, rel=1e-10)
  assert loss == pytest.approx(sens_sq * err_sq)
  h = 1e-6
  fd = np.array(
    [
      (
        toeplitz_math.band_toeplitz_loss_and_grad(c + h * e, n, shifts, weights)[0]
        - toeplitz_math.band_toeplitz_loss_and_grad(c - h * e, n, shifts, weights)[0]
      )
      / (2 * h)
      for e in np.eye(bands)
    ]
  )
  np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


@pytest.mark.parametrize('objective', ['max', 'rms'])
def test_optimize_band_toeplitz_small(objective):
  n, bands, min_sep, k = 48, 6, 8, 3
  coefs, info = toeplitz.optimize_band_toeplitz(n, bands, min_sep, k, objective)
  assert coefs.shape == (bands,) and coefs[0] == 1.0
  err_fn = toeplitz_math.max_error if objective == 'max' else toeplitz_math.rms_error
  sens = np.sqrt(toeplitz_math.toeplitz_min_sep_sensitivity_sq(coefs, n, min_sep, k))
  assert info['loss'] == pytest.approx(sens * err_fn(coefs, n), rel=1e-10)
  assert info['sens_exact']
  init = toeplitz_math.sqrt_coefs(bands)
  init_loss = np.sqrt(toeplitz_math.toeplitz_min_sep_sensitivity_sq(init, n, min_sep, k)) * err_fn(
    init, n
  )
  assert info['loss'] < init_loss
  # Local optimality: random perturbations do not improve.
  rng = np.random.default_rng(0)
  for _ in range(20):
    trial = coefs.copy()
    trial[1:] += rng.normal(0, 1e-3, bands - 1)
    trial_loss = np.sqrt(
      toeplitz_math.toeplitz_min_sep_sensitivity_sq(trial, n, min_sep, k)
    ) * err_fn(trial, n)
    assert trial_loss >= info['loss'] * (1 - 1e-9)


def test_optimize_band_toeplitz_stackoverflow_scale_is_fast():
  n, bands, min_sep, k = 2052, 342, 342, 6
  calls = []
  coefs, info = toeplitz.optimize_band_toeplitz(n, bands, min_sep, k, 'rms', progress=calls.append)
  assert info['seconds'] < 5.0
  assert calls and calls[-1]['done']
  init = toeplitz_math.sqrt_coefs(bands)
  init_loss = np.sqrt(
    toeplitz_math.toeplitz_min_sep_sensitivity_sq(init, n, min_sep, k)
  ) * toeplitz_math.rms_error(init, n)
  assert info['loss'] < init_loss
  assert info['loss'] == pytest.approx(
    np.sqrt(toeplitz_math.toeplitz_min_sep_sensitivity_sq(coefs, n, min_sep, k))
    * toeplitz_math.rms_error(coefs, n),
    rel=1e-10,
  )


def test_fft_inverse_series_and_loss_match_the_recursion(monkeypatch):
  """Above FFT_WORK the loss uses Newton's reciprocal series and FFT correlations (Scaling BandMF
  §3's regime); they agree with the IIR recursion to rounding."""
  n, bands = 4096, 64
  rng = np.random.default_rng(3)
  coefs = toeplitz_math.sqrt_coefs(bands) * (1.0 + 0.05 * rng.random(bands))
  chat = toeplitz_math.inverse_series_fft(coefs, n)
  # Independent check: C ĉ = e_0 with the dense C.
  e0 = np.zeros(n)
  e0[0] = 1.0
  np.testing.assert_allclose(toeplitz_math.lt_toeplitz(coefs, n) @ chat, e0, atol=1e-12)
  weights = toeplitz_math.error_weights(n, "rms")
  shifts = [0, 100, 200, 300]
  slow = toeplitz_math.band_toeplitz_loss_and_grad(coefs, n, shifts, weights)
  monkeypatch.setattr(toeplitz_math, "FFT_WORK", 0)
  fast = toeplitz_math.band_toeplitz_loss_and_grad(coefs, n, shifts, weights)
  for a, b in zip(slow[:3], fast[:3]):
    assert b == pytest.approx(a, rel=1e-12)
  np.testing.assert_allclose(fast[3], slow[3], rtol=1e-9, atol=1e-12 * np.max(np.abs(slow[3])))
