"""Federated SSP (Algorithm 8) through TFF releases the centralized statistics for the same seed."""

import numpy as np
import pytest

from fedmf.public_features import algorithms
from fedmf.public_features import data

federated = pytest.importorskip("fedmf.public_features.federated")


def test_federated_and_centralized_release_the_same_statistics_and_reach_the_same_rmse():
  rng = np.random.default_rng(0)
  spec = data.SyntheticSpec(num_users=120, num_items=15, num_people=40, dim=3)
  ratings, features = data.synthetic_ratings(spec, rng)
  dataset = data.random_split("synthetic", ratings, features, spec.num_users, 0.2, rng, 0.0)
  hyper = algorithms.Hyperparameters(dim=3, outer_steps=2, item_steps=20, max_items_per_user=4)
  central = algorithms.train(dataset, "am-ssp", 5.0, 1e-5, 7, hyper, keep_released=True)
  from fedmf.tff.context import local_execution_context  # pylint: disable=g-import-not-at-top

  with local_execution_context():  # an owned context, uninstalled after (TFF's default untouched)
    fed = algorithms.train(
      dataset, "am-ssp", 5.0, 1e-5, 7, hyper, releaser=federated.releaser(), keep_released=True
    )
  assert len(central.released) == len(fed.released) == 2
  for c, f in zip(central.released, fed.released):
    np.testing.assert_allclose(f.a, c.a, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(f.b, c.b, rtol=1e-9, atol=1e-9)
    assert np.abs(c.a).max() > 1.0  # the noise is there (not two empty releases)
  c_rmse, f_rmse = central.metrics[-1]["test_rmse"], fed.metrics[-1]["test_rmse"]
  assert f_rmse == pytest.approx(c_rmse, rel=0.01)
  # A different seed releases different statistics (the noise depends on the seed).
  other = algorithms.train(dataset, "am-ssp", 5.0, 1e-5, 8, hyper, keep_released=True)
  assert np.abs(other.released[0].a - central.released[0].a).max() > 1e-3
