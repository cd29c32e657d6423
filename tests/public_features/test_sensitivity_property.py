"""User-level sensitivity of everything AM-SSP and DP-ALS release, on arbitrary small rating sets.

For every user of a drawn rating set, the user's whole data is removed, or replaced by other drawn
data; the item counts, A and b computed by the release code itself (`algorithms.central_counts`,
`algorithms.central_statistics`, the noise set to zero) must move by at most the sensitivities the
accountant calibrates to: √max_items_per_user for the counts, w̄Γ_u² for A and w̄Γ_uΓ_y for b
(Public features Thm. 2, proof in App. B.2), twice those for a replacement (remove, then add).

The rating sets include repeated (user, item) rows, users with one rating, users at and above the
per-user cap, items nobody rated and items whose public features are empty (a zero item vector),
with and without biases (the user side [Clip(u), β]: the sensitivities use sqrt(Γ_u² + β²)), and
the bias model alone (d = 0: the user side is [β]).
A repeated row used to enter A and b once per copy while the weights assumed distinct items
(issue 34: r copies moved A by √r·w̄Γ_u²); this test found that.
"""

import numpy as np
from hypothesis import given, settings, strategies as hs
from hypothesis.extra import numpy as hnp

from fedmf.public_features import algorithms
from fedmf.public_features import statistics
from fedmf.public_features.data import Ratings

SLACK = 1 + 1e-9  # float64 summation order


@hs.composite
def releases(draw):
  """A rating set, one user's alternative data, and the public quantities of one release."""
  num_users = draw(hs.integers(1, 5))
  num_items = draw(hs.integers(1, 6))
  biases = draw(hs.booleans())
  dim = draw(hs.integers(0 if biases else 1, 3))  # d = 0: the DP bias model
  label = hs.floats(-20.0, 20.0, allow_nan=False)

  def rows_of(users):
    return hs.lists(
      hs.tuples(hs.sampled_from(users), hs.integers(0, num_items - 1), label),
      min_size=0,
      max_size=18,
    )

  rows = draw(rows_of(list(range(num_users))))
  user = draw(hs.integers(0, num_users - 1))
  replacement = draw(rows_of([user]))
  # The released item side (v_j, and e_j with biases); a zero row: an item without features.
  coordinate = hs.one_of(hs.just(0.0), hs.floats(-3.0, 3.0, allow_nan=False))
  item_side = draw(hnp.arrays(np.float64, (num_items, dim + biases), elements=coordinate))
  counts = draw(hnp.arrays(np.float64, num_items, elements=hs.floats(1.0, 50.0)))
  hyper = algorithms.Hyperparameters(
    dim=dim,
    reg_user=draw(hs.floats(0.01, 3.0)),
    reg_user_bias=draw(hs.floats(0.01, 3.0)),
    clip_user=draw(hs.floats(0.1, 3.0)),
    clip_label=draw(hs.floats(0.1, 5.0)),
    max_items_per_user=draw(hs.integers(1, 4)),
    biases=biases,
    bias_scale=draw(hs.floats(0.1, 3.0)),
  )
  return num_users, num_items, rows, user, replacement, item_side, counts, hyper


def _ratings(rows) -> Ratings:
  users = np.array([r[0] for r in rows], dtype=np.int64)
  items = np.array([r[1] for r in rows], dtype=np.int64)
  return Ratings(users, items, np.array([r[2] for r in rows], dtype=np.float64))


def _released(rows, num_users, num_items, item_vectors, counts, hyper, seed=5):
  """(count vector, A, b) without noise, through the release code."""
  train = _ratings(rows)
  width = item_vectors.shape[1]
  zero = statistics.Statistics(np.zeros((num_items, width, width)), np.zeros((num_items, width)))
  no_noise = np.random.default_rng(0)
  exact_counts = algorithms.central_counts(
    train, num_items, hyper.max_items_per_user, 0.0, seed, no_noise
  )
  stats = algorithms.central_statistics(
    item_vectors, train, num_users, counts, hyper, 0.0, zero, train.values
  )
  return exact_counts, stats.a, stats.b


@settings(max_examples=120, deadline=None)
@given(releases())
def test_one_users_whole_data_moves_counts_a_and_b_by_at_most_the_accounted_sensitivity(case):
  num_users, num_items, rows, user, replacement, item_vectors, counts, hyper = case
  before = _released(rows, num_users, num_items, item_vectors, counts, hyper)
  others = [r for r in rows if r[0] != user]
  clip = hyper.user_clip(hyper.dim)  # what the release calibrates to (d = 0: Γ̃ = β)
  s_a, s_b = statistics.sensitivities(1.0, clip, hyper.clip_label, hyper.user_bias_scale)
  s_counts = np.sqrt(hyper.max_items_per_user)
  for neighbour, factor in ((others, 1.0), (others + replacement, 2.0)):
    after = _released(neighbour, num_users, num_items, item_vectors, counts, hyper)
    # (central_counts floors n̂ at 1: 1-Lipschitz, it never moves the counts further apart.)
    moved = [float(np.linalg.norm(x - y)) for x, y in zip(after, before)]
    bounds = [factor * s_counts, factor * s_a, factor * s_b]
    for name, m, bound in zip(("counts", "A", "b"), moved, bounds):
      assert m <= bound * SLACK, (name, m, bound, rows, user)
