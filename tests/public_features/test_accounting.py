"""User-level accounting of a whole run: calibration, the noise actually added, never under-counted."""

import math

import dp_accounting
import numpy as np
import pytest

from fedmf.privacy import accounting as base_accounting
from fedmf.privacy import gaussian_curve
from fedmf.public_features import accounting
from fedmf.public_features import statistics


@pytest.mark.parametrize("epsilon,outer_steps", [(1.0, 1), (5.0, 3)])
def test_ssp_run_reaches_exactly_the_target_and_pld_agrees(epsilon, outer_steps):
  budget = accounting.calibrate_ssp(epsilon, 1e-5, outer_steps, count_fraction=0.2)
  # μ of the composition, recomputed from the noise multipliers (Gaussian composition, zCDP).
  mu = math.sqrt(
    budget.count_noise_multiplier**-2 + 2 * outer_steps * budget.stats_noise_multiplier**-2
  )
  exact = gaussian_curve.gaussian_epsilon(mu, 1e-5)
  assert exact == pytest.approx(epsilon, rel=1e-9)
  assert exact <= epsilon * (1 + 1e-9)
  # The counts got 20% of ρ = μ²/2.
  assert budget.count_noise_multiplier**-2 == pytest.approx(0.2 * mu**2)
  # dp_accounting's PLD on the composed event (pessimistic) is at least the exact value.
  eps = accounting.ssp_epsilon(budget, pld=True)
  assert eps["pld"] >= exact * (1 - 1e-3)
  assert eps["pld"] == pytest.approx(epsilon, rel=0.02)
  assert eps["rdp"] >= exact  # RDP conversion is an upper bound


def test_a_heavier_last_step_is_still_exactly_the_target():
  """ω = 4: the last step's releases get 4 times the share of an earlier one's; composed (a
  dp_accounting event built here, and the exact Gaussian composition) the run is (ε, δ)."""
  budget = accounting.calibrate_ssp(3.0, 1e-5, 3, count_fraction=0.1, last_step_weight=4.0)
  first, second, last = budget.stats_noise_multipliers
  assert first == second and last == pytest.approx(first / 2)  # ρ ∝ σ⁻²: 4x the share
  mu = math.sqrt(budget.count_noise_multiplier**-2 + 2 * (first**-2 + second**-2 + last**-2))
  assert gaussian_curve.gaussian_epsilon(mu, 1e-5) == pytest.approx(3.0, rel=1e-9)
  event = dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(budget.count_noise_multiplier)]
    + [dp_accounting.GaussianDpEvent(s) for s in (first, first, second, second, last, last)]
  )
  pld = base_accounting.pld_epsilon(event, 1e-5)
  assert pld == pytest.approx(3.0, rel=0.02) and pld >= 3.0 * (1 - 1e-3)
  with pytest.raises(ValueError, match="different noise"):
    budget.stats_noise_multiplier


def test_dropping_the_count_release_would_under_count():
  """The count estimate is part of the run's event: without it ε is smaller than reported."""
  budget = accounting.calibrate_ssp(2.0, 1e-5, 2, count_fraction=0.3)
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.GaussianDpEvent(budget.stats_noise_multiplier), 4
    )
  )
  without_counts = accountant.get_epsilon(1e-5)
  full = dp_accounting.rdp.RdpAccountant()
  full.compose(accounting.ssp_event(budget))
  assert without_counts < full.get_epsilon(1e-5)
  assert full.get_epsilon(1e-5) >= 2.0  # RDP is an upper bound on the exact ε = 2


@pytest.mark.parametrize("beta", [None, 0.7])
def test_released_noise_is_the_calibrated_multiple_of_the_sensitivity(beta):
  rng = np.random.default_rng(0)
  m, d, clip_u, clip_y, sigma = 3000, 2, 1.5, 2.5, 3.0
  # With biases the user side is [Clip(u), β]: its norm is at most sqrt(Γ_u² + β²).
  bound_sq = clip_u**2 + (beta or 0.0) ** 2
  zero = statistics.Statistics(np.zeros((m, d, d)), np.zeros((m, d)))
  noise = statistics.sample_noise(m, d, rng)
  noisy = statistics.add_noise(zero, noise, sigma, 1.0, clip_u, clip_y, beta)
  assert np.std(noisy.a[:, 0, 1]) == pytest.approx(sigma * bound_sq, rel=0.05)
  assert np.std(noisy.a[:, 1, 1]) == pytest.approx(sigma * bound_sq, rel=0.05)
  assert np.std(noisy.b) == pytest.approx(sigma * np.sqrt(bound_sq) * clip_y, rel=0.05)
  # The user side it bounds: a long u and the constant β.
  u_bar = statistics.user_side(rng.normal(0, 50, (100, d)), clip_u, beta)
  assert np.linalg.norm(u_bar, axis=1).max() <= np.sqrt(bound_sq) * (1 + 1e-12)


def test_epsilon_inf_adds_no_noise_and_claims_no_guarantee():
  budget = accounting.calibrate_ssp(math.inf, 1e-5, 3)
  assert budget.count_noise_multiplier == 0.0 and budget.stats_noise_multipliers == (0.0,) * 3
  assert accounting.ssp_epsilon(budget) == {"analytic": math.inf}
  stats = statistics.Statistics(np.ones((4, 2, 2)), np.ones((4, 2)))
  noise = statistics.sample_noise(4, 2, np.random.default_rng(0))
  same = statistics.add_noise(stats, noise, 0.0, 1.0, 1.0, 1.0, 1.0)
  np.testing.assert_array_equal(same.a, stats.a)
  np.testing.assert_array_equal(same.b, stats.b)
  dpsgd = accounting.calibrate_dpsgd(math.inf, 1e-5, 10, 0.1, count_noise_multiplier=0.0)
  assert dpsgd.noise_multiplier == 0.0 and accounting.dpsgd_epsilon(dpsgd) == math.inf


def test_count_noise_is_calibrated_to_the_per_user_cap():
  users = np.repeat(np.arange(400), 3)
  items = np.tile(np.arange(3), 400)
  cap, sigma = 2, 4.0
  draws = np.stack(
    [
      statistics.noisy_item_counts(users, items, 3, cap, sigma, 0, np.random.default_rng(s))
      for s in range(300)
    ]
  )
  clean = np.bincount(items[statistics.count_contributions(users, items, cap, 0)], minlength=3)
  assert clean.sum() == 800
  assert np.std(draws, axis=0) == pytest.approx(np.full(3, sigma * math.sqrt(cap)), rel=0.15)


def test_dpsgd_with_the_count_weights_accounts_the_counts_too():
  """AM-DPSGD with the App. E.1 weights releases the counts first: the composition is (ε, δ)."""
  sigma_c = accounting.count_noise_multiplier(2.0, 1e-5, 0.1)
  budget = accounting.calibrate_dpsgd(2.0, 1e-5, 30, 0.05, count_noise_multiplier=sigma_c)
  without = accounting.calibrate_dpsgd(2.0, 1e-5, 30, 0.05)
  assert budget.noise_multiplier > without.noise_multiplier  # the counts cost something
  rdp = dp_accounting.rdp.RdpAccountant()  # an event built here, not by the code under test
  rdp.compose(dp_accounting.GaussianDpEvent(sigma_c))
  rdp.compose(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
        0.05, dp_accounting.GaussianDpEvent(budget.noise_multiplier)
      ),
      30,
    )
  )
  assert rdp.get_epsilon(1e-5) <= 2.0 * (1 + 1e-3)
  assert rdp.get_epsilon(1e-5) == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("epsilon", [1.0])
def test_dpsgd_calibration_is_not_under_counted(epsilon):
  budget = accounting.calibrate_dpsgd(epsilon, 1e-5, steps=20, sampling_probability=0.05)
  assert accounting.dpsgd_epsilon(budget) <= epsilon * (1 + 1e-3)
  # dp_accounting's PLD (tighter) finds at most the RDP value: calibrated on the safe side.
  assert accounting.dpsgd_epsilon(budget, pld=True) <= epsilon * (1 + 1e-3)
  # An independent RDP accountant on an event built here agrees with the calibration.
  rdp = dp_accounting.rdp.RdpAccountant()
  rdp.compose(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
        0.05, dp_accounting.GaussianDpEvent(budget.noise_multiplier)
      ),
      20,
    )
  )
  assert rdp.get_epsilon(1e-5) == pytest.approx(epsilon, rel=1e-3)


def test_bad_budgets_are_user_errors():
  with pytest.raises(ValueError, match="epsilon"):
    accounting.calibrate_ssp(0.0, 1e-5, 2)
  with pytest.raises(ValueError, match="count_fraction"):
    accounting.calibrate_ssp(1.0, 1e-5, 2, count_fraction=1.0)


def _small_synthetic_split():
  from fedmf.public_features import data

  rng = np.random.default_rng(0)
  spec = data.SyntheticSpec(num_users=200, num_items=20, num_people=30, dim=3)
  ratings, features = data.synthetic_ratings(spec, rng)
  return data.random_split("synthetic", ratings, features, 200, 0.1, 0.1, rng, 0.0)


@pytest.mark.parametrize("algorithm", ["am-ssp", "dp-als", "dp-cmf", "dp-bias", "am-dpsgd"])
def test_a_runs_recorded_noise_is_within_its_budget(algorithm):
  """Recompute ε from the noise multipliers a training run actually used (counts included)."""
  from fedmf.public_features import algorithms

  hyper = algorithms.Hyperparameters(dim=3, outer_steps=2, dpsgd_steps=5, dpsgd_sampling=0.1)
  result = algorithms.train(_small_synthetic_split(), algorithm, 3.0, 1e-5, 0, hyper)
  p = result.privacy
  if algorithm == "am-dpsgd":
    assert p["steps"] == 10 and p["sampling_probability"] == 0.1
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.GaussianDpEvent(p["count_noise_multiplier"]))  # the weights' counts
    rdp.compose(
      dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
          0.1, dp_accounting.GaussianDpEvent(p["noise_multiplier"])
        ),
        p["steps"],
      )
    )
    assert rdp.get_epsilon(1e-5) <= 3.0 * (1 + 1e-3)
  else:
    sigmas = p["stats_noise_multipliers"]
    assert len(sigmas) == 2
    mu = math.sqrt(p["count_noise_multiplier"] ** -2 + sum(2 * s**-2 for s in sigmas))
    assert gaussian_curve.gaussian_epsilon(mu, 1e-5) <= 3.0 * (1 + 1e-9)


def test_the_dpsgd_optimizer_is_post_processing_the_same_noise_and_budget():
  from fedmf.public_features import algorithms

  dataset = _small_synthetic_split()
  privacy = {}
  for optimizer in ("sgd", "adam"):
    hyper = algorithms.Hyperparameters(
      dim=3, outer_steps=2, dpsgd_steps=5, dpsgd_sampling=0.1, dpsgd_optimizer=optimizer
    )
    privacy[optimizer] = algorithms.train(dataset, "am-dpsgd", 3.0, 1e-5, 0, hyper).privacy
  assert privacy["sgd"] == privacy["adam"]
  assert privacy["adam"]["noise_multiplier"] > 0
