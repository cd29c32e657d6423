"""The trivial baselines a practitioner compares a recommender with, on the same split.

- `global_mean`: every rating predicted by the training ratings' mean (non-private).
- `item_mean`: each item's training mean, the global mean for items without training ratings
  (non-private; issue 34 measured 1.024 test RMSE on MovieLens-100K, which nothing private beat).
- The user-level DP bias model is an algorithm (`algorithms.train(..., 'dp-bias', ...)`): DP per-item
  means through the same weighted statistics, counts and accounting as DP-ALS, with the users'
  own biases (local, free), at the run's ε.
"""

from __future__ import annotations

import numpy as np

from fedmf.public_features import evaluation
from fedmf.public_features import model as model_lib
from fedmf.public_features.data import Dataset


def _constant_model(dataset: Dataset, offset: float, item_biases: np.ndarray) -> model_lib.Model:
  n = dataset.num_users
  return model_lib.Model(item_biases[:, None], np.zeros((n, 0)), np.zeros(n), offset, 1.0)


def global_mean(dataset: Dataset) -> dict:
  """Validation and test metrics of predicting the training mean (non-private)."""
  mean = float(np.mean(dataset.train.values)) if len(dataset.train) else dataset.rating_offset
  model = _constant_model(dataset, mean, np.zeros(dataset.features.num_items))
  return _metrics(dataset, model)


def item_mean(dataset: Dataset) -> dict:
  """Validation and test metrics of predicting each item's training mean (non-private)."""
  tr = dataset.train
  m = dataset.features.num_items
  mean = float(np.mean(tr.values)) if len(tr) else dataset.rating_offset
  sums = np.bincount(tr.items, weights=tr.values, minlength=m)
  counts = np.bincount(tr.items, minlength=m)
  means = np.where(counts > 0, sums / np.maximum(counts, 1), mean)
  return _metrics(dataset, _constant_model(dataset, mean, means - mean))


def _metrics(dataset: Dataset, model: model_lib.Model) -> dict:
  out = {}
  for part in ("validation", "test"):
    # The held-out users of the recall protocol get no embedding and no bias of their own here.
    out.update(evaluation.evaluate(dataset, model, part, reg_user=1e30))
  return out
