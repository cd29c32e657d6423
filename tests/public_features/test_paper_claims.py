"""Public features §4.2 at a small scale: feature-based AM-SSP beats the id-only DP-ALS at equal ε.

(The AM-SSP vs AM-DPSGD ordering is measured in docs/benchmarks.md §5, not tested: on this data it
holds at ε = 5 and 20 but not at ε = 1, and DP-SGD runs take tens of seconds.)
"""

import numpy as np

from fedmf.public_features import algorithms
from fedmf.public_features import driver
from fedmf.public_features.config import PublicFeaturesConfig


def test_am_ssp_has_lower_test_rmse_than_dp_als_at_equal_epsilon():
  margins = []
  for seed in range(3):
    cfg = PublicFeaturesConfig(seed=seed, num_users=3000, num_items=50, num_people=1000).validate()
    dataset = driver.build_dataset(cfg)
    hyper = driver.hyperparameters(cfg)
    rmse = {
      algorithm: algorithms.train(dataset, algorithm, 2.0, 1e-5, seed, hyper).metrics[-1][
        "test_rmse"
      ]
      for algorithm in ("am-ssp", "dp-als")
    }
    margins.append(rmse["dp-als"] - rmse["am-ssp"])
  # Measured margins 0.039, 0.026, 0.051 (each seed draws its own data, split and noise).
  assert all(m > 0 for m in margins), margins
  assert np.mean(margins) > 0.01
