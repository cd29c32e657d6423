"""UserUpdate, weights, sufficient statistics and their sensitivity, against direct computations."""

import numpy as np
import pytest

from fedmf.public_features import encoder
from fedmf.public_features import statistics
from fedmf.public_features import users
from fedmf.public_features.data import SyntheticSpec
from fedmf.public_features.data import synthetic_ratings


def _random_ratings(rng, num_users=7, num_items=5, count=30):
  pairs = rng.choice(num_users * num_items, size=count, replace=False)
  return pairs // num_items, pairs % num_items, rng.normal(size=count)


def test_user_update_is_the_ridge_least_squares_solution():
  rng = np.random.default_rng(0)
  u_idx, i_idx, y = _random_ratings(rng)
  v = rng.normal(size=(5, 3))
  reg = 0.7
  got = users.user_update(v, u_idx, i_idx, y, 8, reg)
  for k in range(8):
    rows = u_idx == k
    # Ridge as an augmented least-squares problem: [V; √λ I] u ≈ [y; 0].
    design = np.vstack([v[i_idx[rows]], np.sqrt(reg) * np.eye(3)])
    target = np.concatenate([y[rows], np.zeros(3)])
    expected = np.linalg.lstsq(design, target, rcond=None)[0]
    np.testing.assert_allclose(got[k], expected, atol=1e-12)
  np.testing.assert_array_equal(got[7], 0.0)  # user 7 has no ratings


def test_user_biases_are_the_ridge_solution_with_an_intercept():
  """fit_users: y − e_j ≈ u·v_j + c, ridge λ_u on u and λ_c on c, one user at a time."""
  rng = np.random.default_rng(7)
  u_idx, i_idx, y = _random_ratings(rng)
  v, e = rng.normal(size=(5, 3)), rng.normal(size=5)
  u, c = users.fit_users(v, e, u_idx, i_idx, y, 8, 0.7, 0.2)
  for k in range(8):
    rows = u_idx == k
    design = np.vstack(
      [np.hstack([v[i_idx[rows]], np.ones((rows.sum(), 1))]), np.diag(np.sqrt([0.7] * 3 + [0.2]))]
    )
    target = np.concatenate([y[rows] - e[i_idx[rows]], np.zeros(4)])
    expected = np.linalg.lstsq(design, target, rcond=None)[0]
    np.testing.assert_allclose(np.append(u[k], c[k]), expected, atol=1e-12)
  u0, c0 = users.fit_users(v, None, u_idx, i_idx, y, 8, 0.7, 0.2)  # no biases: c = 0
  np.testing.assert_allclose(u0, users.user_update(v, u_idx, i_idx, y, 8, 0.7))
  assert not c0.any()


def test_weights_have_unit_squared_sum_per_user_and_favor_rare_items():
  rng = np.random.default_rng(1)
  u_idx, i_idx, _ = _random_ratings(rng, count=25)
  counts = rng.uniform(1, 100, size=5)
  w = statistics.example_weights(u_idx, i_idx, counts, 7, wbar=1.5)
  for k in np.unique(u_idx):
    assert np.sum(w[u_idx == k] ** 2) == pytest.approx(1.5**2)
    ws, cs = w[u_idx == k], counts[i_idx[u_idx == k]]
    # Within a user, w ∝ n̂^(-1/4): the ratio of two weights is the ratio of counts^(-1/4).
    np.testing.assert_allclose(ws / ws[0], (cs / cs[0]) ** -0.25)


def test_statistics_match_brute_force_sums():
  rng = np.random.default_rng(2)
  u_idx, i_idx, y = _random_ratings(rng)
  u = rng.normal(size=(7, 4))  # one embedding per user
  w = rng.uniform(size=30)
  stats = statistics.sufficient_statistics(u, u_idx, y, i_idx, w, 5)
  for j in range(5):
    a, b = np.zeros((4, 4)), np.zeros(4)
    for i in range(30):
      if i_idx[i] == j:
        a += w[i] * np.outer(u[u_idx[i]], u[u_idx[i]])
        b += w[i] * y[i] * u[u_idx[i]]
    np.testing.assert_allclose(stats.a[j], a, atol=1e-12)
    np.testing.assert_allclose(stats.b[j], b, atol=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_one_users_whole_data_moves_the_statistics_by_at_most_the_accounted_sensitivity(seed):
  """Replace one user's whole data (items, labels, embedding); the counts n̂ are an earlier release."""
  rng = np.random.default_rng(seed)
  num_users, num_items, d = 6, 8, 3
  clip_u, clip_y = rng.uniform(0.2, 2.0), rng.uniform(0.2, 3.0)
  counts = rng.uniform(1, 20, size=num_items)

  def stats_of(u_idx, i_idx, y, u):
    w = statistics.example_weights(u_idx, i_idx, counts, num_users)
    u_bar = users.clip_rows(u, clip_u)
    y_bar = np.clip(y, -clip_y, clip_y)
    return statistics.sufficient_statistics(u_bar, u_idx, y_bar, i_idx, w, num_items)

  u_idx, i_idx, y = _random_ratings(rng, num_users, num_items, 20)
  u = rng.normal(0, 3, size=(num_users, d))
  before = stats_of(u_idx, i_idx, y, u)
  k = int(rng.integers(num_users))
  keep = u_idx != k
  new_items = rng.choice(num_items, size=rng.integers(1, num_items + 1), replace=False)
  u_idx2 = np.concatenate([u_idx[keep], np.full(new_items.size, k)])
  i_idx2 = np.concatenate([i_idx[keep], new_items])
  y2 = np.concatenate([y[keep], rng.normal(0, 5, new_items.size)])
  u2 = u.copy()
  u2[k] = rng.normal(0, 3, d)
  after = stats_of(u_idx2, i_idx2, y2, u2)
  s_a, s_b = statistics.sensitivities(1.0, clip_u, clip_y)
  # Replacement = removal + addition: twice the add/remove sensitivity of Thm. 2 (App. B.2).
  assert np.linalg.norm(after.a - before.a) <= 2 * s_a * (1 + 1e-12)
  assert np.linalg.norm(after.b - before.b) <= 2 * s_b * (1 + 1e-12)
  # Removal alone is within the add/remove bound the accountant uses.
  removed = stats_of(u_idx[keep], i_idx[keep], y[keep], u)
  assert np.linalg.norm(removed.a - before.a) <= s_a * (1 + 1e-12)
  assert np.linalg.norm(removed.b - before.b) <= s_b * (1 + 1e-12)


def test_count_contributions_cap_each_user():
  rng = np.random.default_rng(3)
  u_idx = rng.integers(0, 5, size=200)
  i_idx = rng.integers(0, 50, size=200)
  kept = statistics.count_contributions(u_idx, i_idx, 7, seed=0)
  per_user = np.bincount(u_idx[kept], minlength=5)
  np.testing.assert_array_equal(per_user, np.minimum(np.bincount(u_idx, minlength=5), 7))


def test_symmetric_noise_has_unit_variance_upper_triangle():
  noise = statistics.sample_noise(4000, 3, np.random.default_rng(4))
  np.testing.assert_array_equal(noise.a, np.transpose(noise.a, (0, 2, 1)))
  upper = noise.a[:, np.triu_indices(3)[0], np.triu_indices(3)[1]]
  assert np.std(upper) == pytest.approx(1.0, abs=0.03)
  assert abs(np.corrcoef(upper[:, 1], upper[:, 2])[0, 1]) < 0.05


def test_encoder_backward_matches_finite_differences():
  rng = np.random.default_rng(5)
  _, features = synthetic_ratings(SyntheticSpec(num_users=5, num_items=12, num_people=30), rng)
  params = encoder.init_encoder(features, 3, rng, out_dim=4)  # an item-bias output too
  params = params.like(params.flat() + rng.normal(0, 0.1, params.size))  # no zero column left
  g = rng.normal(size=(12, 4))
  analytic = encoder.backward(features, params, g).flat()
  flat = params.flat()
  for index in rng.choice(flat.size, size=25, replace=False):
    e = np.zeros_like(flat)
    e[index] = 1e-6
    plus = np.sum(g * encoder.forward(features, params.like(flat + e)))
    minus = np.sum(g * encoder.forward(features, params.like(flat - e)))
    assert analytic[index] == pytest.approx((plus - minus) / 2e-6, abs=1e-6)


def test_per_user_gradients_sum_to_the_full_backward_pass():
  rng = np.random.default_rng(6)
  _, features = synthetic_ratings(SyntheticSpec(num_users=5, num_items=12, num_people=30), rng)
  params = encoder.init_encoder(features, 3, rng, out_dim=4)
  items = rng.integers(0, 12, size=40)
  owner = rng.integers(0, 6, size=40)
  g = rng.normal(size=(40, 4))
  per_user = encoder.per_user_gradients(features, params, owner, 6, items, g).toarray()
  for r in range(6):
    grad_items = np.zeros((12, 4))
    np.add.at(grad_items, items[owner == r], g[owner == r])
    np.testing.assert_allclose(
      per_user[r], encoder.backward(features, params, grad_items).flat(), atol=1e-12
    )


@pytest.mark.parametrize("seed", range(10))
def test_removing_a_user_moves_the_capped_counts_by_at_most_root_cap(seed):
  rng = np.random.default_rng(seed)
  u_idx = rng.integers(0, 6, size=60)
  i_idx = rng.integers(0, 10, size=60)
  cap = int(rng.integers(1, 6))

  def counts(users, items):
    kept = statistics.count_contributions(users, items, cap, seed=3)
    return np.bincount(items[kept], minlength=10)

  before = counts(u_idx, i_idx)
  k = int(rng.integers(6))
  after = counts(u_idx[u_idx != k], i_idx[u_idx != k])
  assert np.linalg.norm(before - after) <= np.sqrt(cap) * (1 + 1e-12)


def test_dp_cmf_item_update_solves_the_collective_normal_equations():
  """DP-CMF (Curmei et al. 2023): W fits X ≈ V Wᵀ (ridge λ), then each v_j minimizes
  ½ vᵀ(Â_j + λI)v − b̂_jᵀv + α/2 Σ_f (X_jf − w_f·v)²: both gradients vanish."""
  from fedmf.public_features import item_updates

  rng = np.random.default_rng(8)
  m, p, d, alpha, lam = 6, 4, 3, 2.5, 0.7
  a = rng.normal(size=(m, d, d))
  a = np.einsum("mij,mkj->mik", a, a)  # PSD
  stats = statistics.Statistics(a, rng.normal(size=(m, d)))
  x, v = rng.uniform(size=(m, p)), rng.normal(size=(m, d))
  out = item_updates.cmf_item_update(stats, x, v, alpha, lam)
  w = np.linalg.solve(v.T @ v + lam * np.eye(d), v.T @ x).T
  for f in range(p):  # W: Σ_j (w_f·v_j − X_jf) v_j + λ w_f = 0
    np.testing.assert_allclose((v @ w[f] - x[:, f]) @ v + lam * w[f], 0.0, atol=1e-10)
  for j in range(m):  # v_j: (Â_j + λI) v − b̂_j + α Σ_f (w_f·v − X_jf) w_f = 0
    grad = (a[j] + lam * np.eye(d)) @ out[j] - stats.b[j] + alpha * w.T @ (w @ out[j] - x[j])
    np.testing.assert_allclose(grad, 0.0, atol=1e-10)
  # α = 0 is DP-ALS.
  np.testing.assert_allclose(
    item_updates.cmf_item_update(stats, x, v, 0.0, lam), item_updates.als_item_update(stats, lam)
  )


def _one_dpsgd_step(optimizer, learning_rate, params, features, rng_seed=3):
  """One noiseless AM-DPSGD step over every user of a tiny problem (Algorithm 6)."""
  from fedmf.public_features import item_updates

  rng = np.random.default_rng(rng_seed)
  users_, items, labels = _random_ratings(rng, num_users=7, num_items=12, count=40)
  u = rng.normal(size=(7, 4))
  return item_updates.dpsgd_item_update(
    features, params, u, users_, items, labels, 7,
    steps=1, sampling_probability=1.0, clip_norm=1e6, noise_multiplier=0.0,
    learning_rate=learning_rate, reg_params=0.0, rng=np.random.default_rng(0), optimizer=optimizer,
  )  # fmt: skip


def test_adam_first_step_moves_every_coordinate_by_the_learning_rate_against_the_gradient():
  """Adam (Kingma and Ba 2015, Alg. 1) with bias correction: the first step is -η·sign(g), g the
  gradient plain SGD steps along (SGD at rate 1 moves by exactly -g)."""
  rng = np.random.default_rng(8)
  _, features = synthetic_ratings(SyntheticSpec(num_users=5, num_items=12, num_people=30), rng)
  params = encoder.init_encoder(features, 3, rng, out_dim=4)
  start = params.flat()
  gradient = start - _one_dpsgd_step("sgd", 1.0, params, features).flat()
  moved = _one_dpsgd_step("adam", 0.01, params, features).flat() - start
  assert np.count_nonzero(np.abs(gradient) > 1e-3) > 10
  # m̂ = g and v̂ = g² after one step, so the step is -η·g/(|g| + ε_Adam), ε_Adam = 1e-8.
  np.testing.assert_allclose(moved, -0.01 * gradient / (np.abs(gradient) + 1e-8), rtol=1e-7)
