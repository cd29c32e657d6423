"""Tests for fedmf.mf.sensitivity: reference values and brute-force properties.

Reference values come from jax_privacy's test suite and the papers and are
recomputed here with fedmf's own code; brute force lives in brute_force.py.
"""

import math

import numpy as np
import pytest

from fedmf.mf import sensitivity as sens
from tests.mf.brute_force import brute_force_patterns
from tests.mf.brute_force import brute_force_sensitivity
from tests.mf.brute_force import feasible_vectors

_C4 = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 3, -6]], dtype=np.float64)
_C4_BANDED = np.array([[1, 0, 0, 0], [2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, -6]], dtype=np.float64)


def _lt_toeplitz(c, n):
  c = np.concatenate([np.asarray(c, dtype=np.float64), np.zeros(n)])[:n]
  idx = np.arange(n)[:, None] - np.arange(n)[None, :]
  return np.where(idx >= 0, c[np.clip(idx, 0, n - 1)], 0.0)


def _blt_coefs(buf_decay, output_scale, n):
  # BLT §2: c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1}.
  theta = np.asarray(buf_decay)
  omega = np.asarray(output_scale)
  i = np.arange(1, n)
  return np.concatenate([[1.0], (omega[None, :] * theta[None, :] ** (i[:, None] - 1)).sum(axis=1)])


def _naive_vec_sens(v, b, k):
  """The BandMF App. VecSens recurrence, written literally."""
  n = len(v)
  k = n if k is None else k
  f = np.zeros((n + b + 1, k + 1))
  for m in range(1, k + 1):
    for i in range(n - 1, -1, -1):
      f[i, m] = max(v[i] + f[i + b, m - 1], f[i + 1, m])
  return f[0, k]


# ----------------------------------------------------------------------------
# Reference values (jax_privacy test suite).


@pytest.mark.parametrize(
  'v, b, k, expected',
  [
    ([1, 0.5, 0.5, 0.5, 0.1], 1, None, 2.6),
    ([1, 1, 0, 1, 0, 1], 1, None, 4.0),
    ([1, 1, 1, 1], 2, 2, 2.0),
    ([0, 1, 0], 2, 2, 1.0),
    ([-1, -2, -0.5], 1, None, 0.0),
    ([-1, -2, -0.5, -3], 2, 2, 0.0),
  ],
)
def test_vec_sens_reference_values(v, b, k, expected):
  assert sens.vec_sens(v, b, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize('b, expected', [(1, 5), (2, 3), (3, 2), (4, 2), (5, 1), (6, 1)])
def test_effective_max_participations(b, expected):
  assert sens.effective_max_participations(5, b) == expected
  assert sens.effective_max_participations(5, b, 100) == expected
  assert sens.effective_max_participations(5, b, 1) == 1


def test_effective_max_participations_rejects_bad_input():
  for args in [(5, 0), (5, 1.5), (-1, 1), (5, 1, 0)]:
    with pytest.raises(ValueError):
      sens.effective_max_participations(*args)


def test_single_participation_reference_values():
  s = sens.single_participation_sensitivity(_C4)
  assert s == sens.Sensitivity(6.0, 'exact', 'max-column-norm')
  s3 = sens.single_participation_sensitivity(_C4[:3, :3])
  assert s3.value == pytest.approx(math.sqrt(5), rel=1e-14)


def test_banded_diagonal_reference_values():
  c = np.diag([0.0, 3.0, 0.0, 1.0, 2.0])
  s = sens.banded_sensitivity_exact(c, 2)
  assert s.value == pytest.approx(math.sqrt(13), rel=1e-14)
  assert (s.method, s.algorithm) == ('exact', 'banded-orthogonal')
  assert sens.banded_sensitivity_exact(c, 2, 1).value == pytest.approx(3.0)
  from_norms = sens.banded_sensitivity_exact_from_norms([0, 9, 0, 1, 4], 1, 2)
  assert from_norms.value == pytest.approx(math.sqrt(13), rel=1e-14)


@pytest.mark.parametrize('b', [2, 3])
def test_banded_two_band_reference_values(b):
  assert sens.matrix_bandwidth(_C4_BANDED) == 2
  s = sens.banded_sensitivity_exact(_C4_BANDED, b)
  assert s.value == pytest.approx(math.sqrt(41), rel=1e-14)
  assert s.value == pytest.approx(brute_force_sensitivity(_C4_BANDED, b), rel=1e-12)


def test_banded_two_band_single_participation():
  assert sens.banded_sensitivity_exact(_C4_BANDED, 2, 1).value == (pytest.approx(6.0))


def test_banded_refuses_when_min_sep_below_bands():
  with pytest.raises(sens.AssumptionError, match='min_sep'):
    sens.banded_sensitivity_exact(_C4_BANDED, 1)
  with pytest.raises(sens.AssumptionError):
    sens.banded_sensitivity_exact_from_norms(np.ones(4), 3, 2)
  # The fallback is a valid upper bound on the (sign-aware) truth.
  bound = sens.gram_upper_bound(_C4_BANDED, 1)
  assert bound.method == 'upper-bound'
  assert bound.value >= brute_force_sensitivity(_C4_BANDED, 1) - 1e-12


@pytest.mark.parametrize('epochs', [1, 2, 4, 8, 16])
def test_fixed_epoch_identity(epochs):
  s = sens.fixed_epoch_sensitivity(np.eye(16), 16 // epochs, epochs)
  assert s.value == pytest.approx(math.sqrt(epochs), rel=1e-14)
  assert (s.method, s.algorithm) == ('exact', 'fixed-epoch-brute')
  assert sens.fixed_epoch_sensitivity(np.eye(16), 16 // epochs).value == (
    pytest.approx(math.sqrt(epochs))
  )


@pytest.mark.parametrize(
  'b, k, expected_sq',
  [
    (1, 12, 67.76863612),
    (3, 4, 9.701490024),
    (4, 2, 3.778520088),
    (5, 3, 5.539304402),
  ],
)
def test_blt_toeplitz_reference_values(b, k, expected_sq):
  n = 12
  coefs = _blt_coefs([0.9, 0.5], [0.2, 0.3], n)
  s = sens.toeplitz_sensitivity_exact(coefs, n, b, k)
  assert s.value**2 == pytest.approx(expected_sq, rel=1e-9)
  assert (s.method, s.algorithm) == ('exact', 'toeplitz-thm3.1')
  c = _lt_toeplitz(coefs, n)
  assert brute_force_sensitivity(c, b, k, signs=False) ** 2 == pytest.approx(expected_sq, rel=1e-9)
  assert sens.toeplitz_lower_bound(c, b, k).value == pytest.approx(s.value)
  assert sens.gram_upper_bound(c, b, k).value >= s.value * (1 - 1e-12)


def test_blt_with_negative_output_scale_is_refused():
  # docs/mechanisms.md: Σω ≤ 1 alone is not enough; here c_1 < c_2.
  coefs = _blt_coefs([0.9, 0.5], [0.5, -0.2], 8)
  assert coefs[1] < coefs[2]
  with pytest.raises(sens.AssumptionError, match='non-increasing'):
    sens.toeplitz_sensitivity_exact(coefs, 8, 2, 3)


def test_toeplitz_refuses_negative_coefficients():
  with pytest.raises(sens.AssumptionError, match='non-negative'):
    sens.toeplitz_sensitivity_exact([1.0, -0.1], 5, 1)


def test_sign_example():
  c = np.array([[1.0, 0.0], [-1.0, 1.0]])
  assert brute_force_sensitivity(c, 1, 2, signs=False) ** 2 == pytest.approx(2)
  assert brute_force_sensitivity(c, 1, 2) ** 2 == pytest.approx(5)
  upper = sens.gram_upper_bound(c, 1, 2)
  assert upper.value >= math.sqrt(5) - 1e-12
  fixed = sens.fixed_epoch_sensitivity(c, 1, 2)
  assert fixed.method == 'upper-bound'
  assert fixed.value >= math.sqrt(5) - 1e-12


def test_sensitivity_rejects_unknown_method():
  with pytest.raises(ValueError):
    sens.Sensitivity(1.0, 'approximate', 'x')


# ----------------------------------------------------------------------------
# VecSens against literal recurrence and brute force.


@pytest.mark.parametrize('seed', range(30))
def test_vec_sens_matches_brute_force(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 11))
  b = int(rng.integers(1, n + 2))
  k = None if rng.random() < 0.3 else int(rng.integers(1, n + 1))
  v = rng.normal(size=n)
  brute = max([0.0] + [v[list(p)].sum() for p in brute_force_patterns(n, b, k)])
  assert sens.vec_sens(v, b, k) == pytest.approx(brute, abs=1e-12)


@pytest.mark.parametrize(
  'n, b, k', [(60, 2, None), (61, 3, None), (50, 1, 7), (70, 4, 5), (40, 2, 19), (33, 40, None)]
)
def test_vec_sens_paths_match_literal_recurrence(n, b, k):
  # Exercises the sort (b = 1), sequential (vacuous k) and layered paths.
  v = np.random.default_rng(n * b).normal(size=n)
  assert sens.vec_sens(v, b, k) == pytest.approx(_naive_vec_sens(v, b, k), abs=1e-12)


@pytest.mark.parametrize('seed', range(10))
def test_gram_upper_bound_equals_two_stage_definition(seed):
  rng = np.random.default_rng(100 + seed)
  n = int(rng.integers(2, 9))
  b = int(rng.integers(1, n + 1))
  k = int(rng.integers(1, n + 1))
  c = rng.normal(size=(n, n))
  abs_x = np.abs(c.T @ c)
  patterns = [list(p) for p in brute_force_patterns(n, b, k)]
  rows = np.array([max(abs_x[i, p].sum() for p in patterns) for i in range(n)])
  expected = math.sqrt(max(rows[p].sum() for p in patterns))
  assert sens.gram_upper_bound(c, b, k).value == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------
# Random property tests: exact == brute force where theorems apply, bounds
# bracket it everywhere.


def _random_case(rng, n_max=9):
  n = int(rng.integers(2, n_max + 1))
  b = int(rng.integers(1, n + 1))
  k = None if rng.random() < 0.25 else int(rng.integers(1, n + 1))
  return n, b, k


def _random_monotone_coefs(rng, n):
  c = np.sort(rng.uniform(0.0, 1.0, n))[::-1]
  if rng.random() < 0.3:
    c[int(rng.integers(1, n)) :] = 0.0  # Banded Toeplitz.
  return c


def _random_banded(rng, n, bands, normalize):
  c = np.tril(rng.normal(size=(n, n)))
  c[np.arange(n)[:, None] - np.arange(n)[None, :] >= bands] = 0.0
  c[bands - 1 :, :][np.arange(n - bands + 1), np.arange(n - bands + 1)] = 1.5
  if normalize:
    c /= np.linalg.norm(c, axis=0)
  return c


@pytest.mark.parametrize('seed', range(40))
def test_toeplitz_exact_matches_brute_force(seed):
  rng = np.random.default_rng(seed)
  n, b, k = _random_case(rng)
  coefs = _random_monotone_coefs(rng, n)
  c = _lt_toeplitz(coefs, n)
  exact = sens.toeplitz_sensitivity_exact(coefs, n, b, k)
  brute = brute_force_sensitivity(c, b, k)
  assert exact.value == pytest.approx(brute, rel=1e-10)
  assert sens.toeplitz_lower_bound(c, b, k).value == pytest.approx(brute, rel=1e-10)
  assert sens.gram_upper_bound(c, b, k).value >= brute * (1 - 1e-12)


@pytest.mark.parametrize('seed', range(40))
def test_banded_exact_matches_brute_force(seed):
  rng = np.random.default_rng(1000 + seed)
  n, b, k = _random_case(rng)
  bands = int(rng.integers(1, b + 1))
  c = _random_banded(rng, n, bands, normalize=bool(seed % 2))
  exact = sens.banded_sensitivity_exact(c, b, k)
  brute = brute_force_sensitivity(c, b, k)
  assert exact.value == pytest.approx(brute, rel=1e-10)
  if seed % 2:
    k_eff = sens.effective_max_participations(n, b, k)
    assert exact.value == pytest.approx(math.sqrt(k_eff), rel=1e-12)
  assert sens.gram_upper_bound(c, b, k).value >= brute * (1 - 1e-12)
  assert sens.toeplitz_lower_bound(c, b, k).value <= brute * (1 + 1e-12)


@pytest.mark.parametrize('seed', range(25))
def test_banded_exact_refuses_when_bands_exceed_min_sep(seed):
  rng = np.random.default_rng(2000 + seed)
  n = int(rng.integers(3, 10))
  bands = int(rng.integers(2, n + 1))
  b = int(rng.integers(1, bands))
  c = _random_banded(rng, n, bands, normalize=bool(seed % 2))
  assert sens.matrix_bandwidth(c) == bands
  with pytest.raises(sens.AssumptionError):
    sens.banded_sensitivity_exact(c, b)
  k = int(rng.integers(1, n + 1))
  brute = brute_force_sensitivity(c, b, k)
  upper = sens.gram_upper_bound(c, b, k)
  lower = sens.toeplitz_lower_bound(c, b, k)
  assert upper.value >= brute * (1 - 1e-12)
  assert lower.value <= brute * (1 + 1e-12)


@pytest.mark.parametrize('seed', range(30))
def test_toeplitz_exact_refuses_non_monotone(seed):
  rng = np.random.default_rng(3000 + seed)
  n = int(rng.integers(3, 10))
  coefs = _random_monotone_coefs(rng, n)
  coefs[0] = 1.0
  j = int(rng.integers(1, n))
  coefs[j] = coefs[j - 1] + rng.uniform(0.01, 1.0)  # Increase somewhere.
  if rng.random() < 0.5:
    coefs[int(rng.integers(0, n))] = -rng.uniform(0.01, 1.0)
  with pytest.raises(sens.AssumptionError):
    sens.toeplitz_sensitivity_exact(coefs, n, 1, None)


def _general_matrix(rng, n, kind):
  if kind == 'gaussian':
    return rng.normal(size=(n, n))
  if kind == 'lower-signed':
    return np.tril(rng.normal(size=(n, n)))
  if kind == 'signed-toeplitz':
    return _lt_toeplitz(np.concatenate([[1.0], rng.uniform(-0.6, 0.8, n - 1)]), n)
  if kind == 'normalized-toeplitz':
    c = _lt_toeplitz(_random_monotone_coefs(rng, n), n)
    return c / np.linalg.norm(c, axis=0)
  if kind == 'tall':
    return rng.normal(size=(n + 3, n))
  raise ValueError(kind)


@pytest.mark.parametrize(
  'kind', ['gaussian', 'lower-signed', 'signed-toeplitz', 'normalized-toeplitz', 'tall']
)
@pytest.mark.parametrize('seed', range(12))
def test_bounds_bracket_brute_force(kind, seed):
  rng = np.random.default_rng(4000 + seed)
  n, b, k = _random_case(rng)
  c = _general_matrix(rng, n, kind)
  brute = brute_force_sensitivity(c, b, k)
  upper = sens.gram_upper_bound(c, b, k)
  lower = sens.toeplitz_lower_bound(c, b, k)
  assert upper.method == 'upper-bound'
  assert lower.method == 'lower-bound'
  assert upper.value >= brute * (1 - 1e-12)
  assert lower.value <= brute * (1 + 1e-12)
  assert lower.value <= upper.value * (1 + 1e-12)
  if k == 1 or b >= n:
    assert sens.single_participation_sensitivity(c).value == pytest.approx(brute, rel=1e-12)


@pytest.mark.parametrize('seed', range(25))
def test_fixed_epoch_against_brute_force(seed):
  rng = np.random.default_rng(5000 + seed)
  n = int(rng.integers(2, 10))
  b = int(rng.integers(1, n + 1))
  k = None if seed % 3 == 0 else int(rng.integers(1, n + 1))
  nonneg = seed % 2 == 0
  c = rng.uniform(size=(n, n)) if nonneg else rng.normal(size=(n, n))
  k_eff = sens.effective_max_participations(n, b, k)
  # Sign-aware brute force over vectors supported on one offset's pattern.
  u = feasible_vectors(n, 1, None)
  best = 0.0
  for offset in range(b):
    support = np.zeros(n, dtype=bool)
    support[np.arange(offset, n, b)[:k_eff]] = True
    mask = np.all((u != 0) <= support, axis=1)
    best = max(best, float(np.max(np.sum((u[mask] @ c.T) ** 2, axis=1))))
  s = sens.fixed_epoch_sensitivity(c, b, k)
  if nonneg:
    assert s.method == 'exact'
    assert s.value == pytest.approx(math.sqrt(best), rel=1e-10)
  else:
    assert s.value >= math.sqrt(best) * (1 - 1e-12)
    if np.any(c.T @ c < 0):
      assert s.method == 'upper-bound'
