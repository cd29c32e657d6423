"""Test metrics of App. E.1 ("Evaluation"): RMSE on held-out ratings, Recall@k on held-out targets."""

from __future__ import annotations

import numpy as np

from fedmf.public_features.data import Ratings


def rmse(
  user_vectors: np.ndarray, item_vectors: np.ndarray, ratings: Ratings, offset: float
) -> float:
  """sqrt(mean (u_k·v_j + offset − y)²) over the ratings."""
  pred = np.einsum("nd,nd->n", user_vectors[ratings.users], item_vectors[ratings.items]) + offset
  return float(np.sqrt(np.mean((pred - ratings.values) ** 2)))


def recall_at_k(
  user_vectors: np.ndarray,
  item_vectors: np.ndarray,
  history: Ratings,
  target: Ratings,
  threshold: float,
  k: int = 20,
) -> float:
  """Mean over users with a target of |target ∩ top-k| / min(k, |target|); the top k is taken over
  all items except the user's history (App. E.1), targets are ratings above `threshold`."""
  positive = target.subset(target.values > threshold)
  users = np.unique(positive.users)
  if users.size == 0:
    return float("nan")
  scores = user_vectors[users] @ item_vectors.T
  row = {u: r for r, u in enumerate(users.tolist())}
  in_history = np.isin(history.users, users)
  hist_rows = np.fromiter((row[u] for u in history.users[in_history].tolist()), np.int64)
  scores[hist_rows, history.items[in_history]] = -np.inf
  k = min(k, scores.shape[1])
  top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  hit = np.zeros_like(scores, dtype=bool)
  np.put_along_axis(hit, top, True, axis=1)
  pos_rows = np.fromiter((row[u] for u in positive.users.tolist()), np.int64)
  hits = np.bincount(pos_rows, weights=hit[pos_rows, positive.items], minlength=users.size)
  sizes = np.bincount(pos_rows, minlength=users.size)
  return float(np.mean(hits / np.minimum(k, sizes)))
