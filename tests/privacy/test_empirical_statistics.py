"""The canary statistics: the decorrelating W, the null N(0, 1), the mean ‖W 1_π‖/σ."""

import numpy as np
import pytest
import scipy.stats

from fedmf.mf import strategies as st
from fedmf.privacy import canary_design
from fedmf.privacy import empirical_statistics as es
from tests.mf.random_strategies import random_bandmf
from tests.privacy.canary_simulation import pattern_matrix, simulate_record

STRATEGIES = [
  {"mechanism": "dpsgd"},
  {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]},
  {"mechanism": "tree", "variant": "online-honaker"},
  {"mechanism": "tree", "variant": "vanilla"},
]


@pytest.mark.parametrize("spec", [*STRATEGIES, random_bandmf(24, 4)])
def test_whitening_decorrelates_the_per_round_noise(spec):
  strategy = st.load_strategy(spec)
  n = 24
  w = es.release_whitening(strategy, n)
  p = strategy.per_round_noise_matrix(n)
  assert np.allclose(w @ p @ p.T @ w.T, np.eye(n), atol=1e-9)
  if strategy.matrix_shape(n)[0] == n:
    assert np.array_equal(w, strategy.matrix(n))  # W = C for a square C


@pytest.mark.parametrize("variant", ["online-honaker", "vanilla"])
def test_tree_releases_show_at_most_the_analytic_norm(variant):
  # P C = I: the per-round releases are a post-processing of the node releases.
  strategy = st.load_strategy({"mechanism": "tree", "variant": variant})
  n = 32
  w = es.release_whitening(strategy, n)
  c = strategy.matrix(n)
  rng = np.random.default_rng(0)
  patterns = rng.random((n, 200)) < 0.1
  shown = es.pattern_norms(w, patterns)
  analytic = es.pattern_norms(c, patterns)
  assert np.all(shown <= analytic * (1 + 1e-12))
  assert np.mean(shown < analytic * 0.999) > 0.5


@pytest.mark.parametrize("spec", STRATEGIES)
def test_held_out_statistics_are_standard_normal_and_inserted_ones_have_mean_mu(spec):
  strategy = st.load_strategy(spec)
  n, m, sigma = 40, 4000, 1.7
  design = canary_design.draw_design(m // 2, m // 2, seed=3)
  patterns = pattern_matrix([0, 10, 20, 30], n, m)
  record = simulate_record(
    strategy.per_round_noise_matrix(n), sigma, patterns, design, np.random.default_rng(4)
  )
  w = es.release_whitening(strategy, n)
  stat, mu = es.all_releases_statistics(record.projections, patterns, w, sigma)
  held, ins = stat[~design.inserted], stat[design.inserted]
  assert scipy.stats.kstest(held, "norm").pvalue > 1e-3
  expected = np.linalg.norm(w @ patterns[:, 0]) / sigma
  assert np.allclose(mu, expected)
  assert scipy.stats.kstest(ins - expected, "norm").pvalue > 1e-3
  if strategy.matrix_shape(n)[0] == n:
    assert expected == pytest.approx(np.linalg.norm(strategy.matrix(n) @ patterns[:, 0]) / sigma)


def test_canaries_without_rounds_have_no_statistic():
  n, m = 10, 6
  patterns = np.zeros((n, m), bool)
  patterns[2, :3] = True
  stat, mu = es.all_releases_statistics(np.ones((n, m)), patterns, np.eye(n), 1.0)
  assert np.all(np.isfinite(stat[:3])) and np.all(np.isnan(stat[3:])) and np.all(np.isnan(mu[3:]))


def test_unique_patterns_groups_identical_columns():
  patterns = np.array([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0]], bool)
  unique, inverse = es.unique_patterns(patterns)
  assert np.array_equal(unique[:, inverse], patterns)
  assert unique.shape[1] == 3 and inverse[0] == inverse[2]


def test_cosines_need_a_change():
  assert np.allclose(es.final_model_cosines(np.array([3.0, -4.0]), 5.0), [0.6, -0.8])
  with pytest.raises(ValueError, match="did not change"):
    es.final_model_cosines(np.zeros(2), 0.0)
