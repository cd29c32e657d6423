"""The estimators: Andrew et al.'s Gaussian fit and the f-DP one-run lower bound.

The lower bound's reference values were computed with jax_privacy's `auditing.py` (commit 8967688,
`_epsilon_one_run_fdp`), an independent implementation of Mahloujifar, Melis & Chaudhuri 2024,
with its `dp_accounting.get_sigma_gaussian(ε, δ)` as 1/μ of the exact Gaussian curve.
"""

import numpy as np
import pytest

from fedmf.privacy import empirical_estimators as ee
from fedmf.privacy import gaussian_curve

# (canaries, guesses, correct, significance, δ) -> ε of jax_privacy's f-DP one-run audit.
JAX_PRIVACY_REFERENCE = [
  ((1000, 125, 120, 0.05 / 4, 1e-6), 3.5835326898631714),
  ((1000, 500, 480, 0.0125, 1e-5), 4.16072282350463),
  ((200, 50, 45, 0.05, 1e-6), 2.7575500102073707),
  ((2000, 250, 240, 0.05, 1e-6), 4.514764653980611),
  ((1000, 62, 62, 0.0125, 1e-6), 4.104026102207534),
  ((500, 250, 250, 0.05, 1e-6), 9.657580156283501),
]


@pytest.mark.parametrize("args,expected", JAX_PRIVACY_REFERENCE)
def test_fdp_bound_matches_jax_privacy(args, expected):
  m, k, v, significance, delta = args
  mu = ee.fdp_mu_lower(m, k, v, significance)
  assert gaussian_curve.gaussian_epsilon(mu, delta) == pytest.approx(expected, rel=1e-6)


def test_fdp_margin_decreases_in_mu():
  margins = [ee.fdp_audit_margin(mu, 1000, 250, 200, 0.0125) for mu in np.linspace(0, 3, 31)]
  assert np.all(np.diff(margins) <= 1e-15)


def test_no_correct_guess_proves_nothing():
  assert ee.fdp_mu_lower(100, 10, 0, 0.05) == 0.0
  scores = np.arange(10.0)
  bound = ee.one_run_lower_bound(scores, np.zeros(10, bool), 1e-6)
  assert bound.epsilon == 0.0 and bound.mu == 0.0


def _scores(mu, m, seed):
  rng = np.random.default_rng(seed)
  inserted = rng.random(m) < 0.5
  return rng.normal(size=m) + mu * inserted, inserted


def test_lower_bound_holds_on_gaussian_scores():
  # A μ-GDP mechanism whose statistics are exactly N(0,1) vs N(μ,1): μ_lower ≤ μ with ≥ 95%.
  for mu in (0.5, 1.5, 3.0):
    over = sum(ee.one_run_lower_bound(*_scores(mu, 1000, s), 1e-6).mu > mu for s in range(30))
    assert over <= 2, mu


def test_lower_bound_uses_only_coin_canaries():
  scores, inserted = _scores(4.0, 400, 0)
  coins = np.zeros(400, bool)
  coins[:100] = True
  bound = ee.one_run_lower_bound(scores, inserted, 1e-6, coins=coins)
  assert bound.canaries == 100
  assert ee.one_run_lower_bound(scores, inserted, 1e-6).mu > bound.mu


def test_gaussian_fit_recovers_mu_with_calibrated_error():
  hits = 0
  for seed in range(100):
    rng = np.random.default_rng(seed)
    fit = ee.gaussian_fit(rng.normal(1.5, 1, 500), rng.normal(0, 1, 500), 1e-6)
    hits += abs(fit.mu - 1.5) <= 1.96 * fit.mu_stderr
  assert 88 <= hits <= 100
  assert fit.epsilon == pytest.approx(gaussian_curve.gaussian_epsilon(fit.mu, 1e-6))
  lo, hi = fit.epsilon_interval
  assert lo < fit.epsilon < hi


def test_gaussian_fit_is_scale_free_and_refuses_too_few():
  rng = np.random.default_rng(0)
  x, y = rng.normal(2, 1, 300), rng.normal(0, 1, 300)
  assert ee.gaussian_fit(10 * x + 3, 10 * y + 3, 1e-6).mu == pytest.approx(
    ee.gaussian_fit(x, y, 1e-6).mu
  )
  with pytest.raises(ValueError, match="at least 2"):
    ee.gaussian_fit(x, y[:1], 1e-6)
