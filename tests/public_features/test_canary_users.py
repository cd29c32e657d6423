"""Canary users measure the privacy of the released statistics (issue 34 item 1, with issue 33's
estimators: docs/empirical-privacy.md).

A canary is a user who rates one item of their own that nobody else rates (so the item's A_j and
b_j hold only that user's contribution), inserted on a fair coin; the others are held out (their
item exists, unrated). The statistics go through the release code itself
(`algorithms.central_statistics`, with the noise multipliers the run is calibrated to, one
release per outer step). The auditor knows each canary's data and the released item side, so it
computes the canary's contribution (ΔA, Δb) and scores each canary with the likelihood-ratio
statistic of a Gaussian mechanism in the release's own coordinates (the upper triangle of A, b),
whitened by the noise std of each release: N(0, 1) for a held-out canary, N(μ_c, 1) for an inserted
one, μ_c = ‖whitened contribution‖. μ_c ≤ the analytic μ of the statistics releases (equality for
a contribution at the sensitivity along one axis). Checked: the Gaussian fit's μ̂ agrees with the
canaries' μ_c, it stays below the run's analytic μ, the one-run lower bound stays below the
run's ε, and the same measurement flags a release with a quarter of the noise.
"""

import numpy as np
import pytest

from fedmf.privacy import empirical_estimators as estimators
from fedmf.privacy import gaussian_curve
from fedmf.public_features import algorithms
from fedmf.public_features import statistics
from fedmf.public_features.data import Ratings

EPSILON, DELTA = 2.0, 1e-5


def _measure(biases: bool, noise_factor: float = 1.0, canaries: int = 2000, seed: int = 0):
  rng = np.random.default_rng(seed)
  dim, base_items, base_users = 3, 8, 20
  hyper = algorithms.Hyperparameters(
    dim=dim, outer_steps=2, clip_user=0.05, clip_label=0.5, biases=biases, reg_user=1.0
  )
  budget = algorithms.budget_of("am-ssp", EPSILON, DELTA, hyper)
  num_items = base_items + canaries
  width = dim + biases
  item_side = rng.normal(size=(num_items, width))
  # Base users rate base items only; canary c (user base_users + c) rates item base_items + c.
  users = rng.integers(0, base_users, 60)
  items = rng.integers(0, base_items, 60)
  merged = Ratings(users, items, rng.normal(size=60) * 2).merged()
  canary_users = base_users + np.arange(canaries)
  canary_items = base_items + np.arange(canaries)
  canary_labels = rng.choice([-6.0, 6.0], canaries)
  inserted = rng.random(canaries) < 0.5  # fair coins
  train = Ratings(
    np.concatenate([merged.users, canary_users[inserted]]),
    np.concatenate([merged.items, canary_items[inserted]]),
    np.concatenate([merged.values, canary_labels[inserted]]),
  )
  num_users = base_users + canaries
  counts = rng.uniform(1, 30, num_items)  # the released n̂ (a single-item user has w = 1 anyway)
  zero = statistics.Statistics(np.zeros((num_items, width, width)), np.zeros((num_items, width)))
  # The auditor's side: every canary's contribution, from its own data and the public item side.
  all_canaries = Ratings(canary_users, canary_items, canary_labels)
  exact = algorithms.central_statistics(
    item_side, all_canaries, num_users, counts, hyper, 0.0, zero, all_canaries.values
  )
  upper = np.triu_indices(width)
  delta_a = exact.a[canary_items][:, upper[0], upper[1]]  # (canaries, width (width + 1) / 2)
  delta_b = exact.b[canary_items]
  s_a, s_b = statistics.sensitivities(
    1.0, hyper.user_clip(dim), hyper.clip_label, hyper.user_bias_scale
  )
  scores = np.zeros(canaries)
  mu_c2 = np.zeros(canaries)
  for sigma in budget.stats_noise_multipliers:
    noise = statistics.sample_noise(num_items, width, rng)
    released = algorithms.central_statistics(
      item_side, train, num_users, counts, hyper, sigma * noise_factor, noise, train.values
    )
    # Whitened by the noise the release claims (σ s_A on A's upper triangle, σ s_b on b).
    t = np.hstack([delta_a / (sigma * s_a), delta_b / (sigma * s_b)])
    x = np.hstack(
      [
        released.a[canary_items][:, upper[0], upper[1]] / (sigma * s_a),
        released.b[canary_items] / (sigma * s_b),
      ]
    )
    scores += np.einsum("ci,ci->c", t, x)
    mu_c2 += np.einsum("ci,ci->c", t, t)
  mu_c = np.sqrt(mu_c2)
  scores /= mu_c
  stats_mu = np.sqrt(sum(2 / s**2 for s in budget.stats_noise_multipliers))
  return budget, stats_mu, mu_c, inserted, scores


@pytest.mark.parametrize("biases", [False, True])
def test_canary_users_measure_at_most_the_accounted_privacy(biases):
  budget, stats_mu, mu_c, inserted, scores = _measure(biases)
  assert np.all(mu_c <= stats_mu * (1 + 1e-9))  # no canary exceeds the sensitivity
  fit = estimators.gaussian_fit(scores[inserted], scores[~inserted], DELTA)
  expected = float(mu_c[inserted].mean())
  assert abs(fit.mu - expected) < 4 * fit.mu_stderr, (fit.mu, expected, fit.mu_stderr)
  assert abs(fit.held_out_sd - 1.0) < 0.1  # the noise added is the noise claimed
  assert fit.mu < budget.mu + 4 * fit.mu_stderr
  lower = estimators.one_run_lower_bound(scores, inserted, DELTA)
  assert lower.epsilon <= EPSILON
  # The canaries are near the worst case (ū and ȳ at their clips): the measurement exercises it.
  assert np.all(mu_c >= 0.85 * stats_mu)


def test_a_release_with_a_quarter_of_the_noise_is_flagged():
  budget, _, mu_c, inserted, scores = _measure(False, noise_factor=0.25)
  fit = estimators.gaussian_fit(scores[inserted], scores[~inserted], DELTA)
  assert fit.mu - 4 * fit.mu_stderr > budget.mu
  lower = estimators.one_run_lower_bound(scores, inserted, DELTA)
  assert lower.epsilon > gaussian_curve.gaussian_epsilon(budget.mu, DELTA)
