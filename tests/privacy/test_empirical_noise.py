"""The noise check: exact intervals (χ²; Wishart) cover the truth about 95% of the time."""

import numpy as np
import pytest

from fedmf.mf import strategies as st
from fedmf.privacy import empirical_noise, empirical_statistics


def test_intervals_cover_the_claim_when_the_noise_is_right():
  strategy = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}
  )
  n, k, sigma = 20, 60, 1.3
  w = empirical_statistics.release_whitening(strategy, n)
  p = strategy.per_round_noise_matrix(n)
  pattern = np.zeros(n, bool)
  pattern[[0, 7, 14]] = True
  claimed = np.linalg.norm(w @ pattern) / sigma
  scale = leak = 0
  for seed in range(200):
    held = sigma * p @ np.random.default_rng(seed).standard_normal((n, k))
    check = empirical_noise.noise_check(held, w, sigma, pattern, claimed, 1e-6)
    scale += check.scale_consistent
    leak += check.leak_consistent
  assert 180 <= scale <= 200 and 180 <= leak <= 200


def test_wrong_scale_is_seen():
  n, k = 10, 200
  held = 0.5 * np.random.default_rng(0).standard_normal((n, k))
  pattern = np.ones(n, bool)
  check = empirical_noise.noise_check(held, np.eye(n), 1.0, pattern, np.sqrt(n), 1e-6)
  assert check.variance_ratio == pytest.approx(0.25, rel=0.1) and not check.scale_consistent
  assert check.measured_mu == pytest.approx(2 * np.sqrt(n), rel=0.15)
  assert check.leak_consistent is False
  assert any("leaks MORE" in w for w in check.warnings())


def test_too_few_held_out_canaries_give_the_scale_only():
  held = np.random.default_rng(0).standard_normal((30, 25))
  check = empirical_noise.noise_check(held, np.eye(30), 1.0, np.ones(30, bool), 1.0, 1e-6)
  assert check.measured_mu is None and check.leak_consistent is None
  assert "more held-out canaries" in check.note
  assert check.to_dict()["measured_noise_mu"] is None


def test_clients_coherent_share_explains_an_excess_but_never_a_deficit():
  """The real clients' projections on a direction persist across rounds (their updates point
  alike), so after whitening they add up: an excess within their coherent share is consistent."""
  strategy = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}
  )
  n, k, sigma, v = 30, 400, 1.0, 0.01
  w = empirical_statistics.release_whitening(strategy, n)
  p = strategy.per_round_noise_matrix(n)
  pattern = np.zeros(n, bool)
  pattern[[0, 10, 20]] = True
  rng = np.random.default_rng(0)
  noise = sigma * p @ rng.standard_normal((n, k))
  clients = np.sqrt(v) * np.ones((n, 1)) * rng.standard_normal((1, k))  # the same every round
  claimed = np.linalg.norm(w @ pattern) / sigma
  alone = empirical_noise.noise_check(noise + clients, w, sigma, pattern, claimed, 1e-6)
  assert alone.variance_ratio_interval[0] > 1 and not alone.scale_consistent
  check = empirical_noise.noise_check(noise + clients, w, sigma, pattern, claimed, 1e-6, v)
  # The brute-force coherent share: every round's clients term is the same √v·a.
  coherent = np.sum((np.abs(w) @ np.full(n, np.sqrt(v))) ** 2) / n
  assert check.clients_fraction_max == pytest.approx(coherent)
  assert check.clients_fraction == pytest.approx(v * np.sum(w * w) / n)
  assert check.variance_ratio <= 1 + coherent and check.scale_consistent
  small = empirical_noise.noise_check(0.8 * noise + clients, w, sigma, pattern, claimed, 1e-6, v)
  assert not small.scale_consistent and small.variance_ratio < 1


def test_rank_deficient_noise_leaks_without_bound_where_it_is_missing():
  # Rounds 5-9 repeat the noise of rounds 0-4 (a seed reused): rank 5 of 10, a wrong correlation.
  n, k = 10, 200
  half = np.random.default_rng(0).standard_normal((n // 2, k))
  held = np.vstack([half, half])
  alone = np.zeros(n, bool)
  alone[0] = True  # r0 − r5 = 1 exactly: outside the noise's range, seen without noise
  check = empirical_noise.noise_check(held, np.eye(n), 1.0, alone, 1.0, 1e-6)
  assert check.measured_mu == np.inf and check.measured_mu_interval == (np.inf, np.inf)
  assert "rank 5 of 10" in check.note and any("leaks MORE" in w for w in check.warnings())
  both = np.zeros(n, bool)
  both[[0, 5]] = True  # within the range: r0 + r5 = 2 + 2x, μ' = 1
  check = empirical_noise.noise_check(held, np.eye(n), 1.0, both, np.sqrt(2), 1e-6)
  lo, hi = check.measured_mu_interval
  assert lo <= 1.0 <= hi and check.measured_mu == pytest.approx(1.0, rel=0.1)
