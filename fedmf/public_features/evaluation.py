"""Metrics of App. E.1 ("Evaluation"): RMSE on held-out ratings, Recall@k on held-out targets, and
`evaluate`, which applies a dataset's protocol to its validation or test part."""

from __future__ import annotations

import numpy as np

from fedmf.public_features import model as model_lib
from fedmf.public_features.data import Dataset
from fedmf.public_features.data import Ratings


def rmse(model: model_lib.Model, ratings: Ratings) -> float:
  """sqrt(mean (r̂ − y)²) over the ratings (NaN for none)."""
  if len(ratings) == 0:
    return float("nan")
  return float(
    np.sqrt(np.mean((model.predict(ratings.users, ratings.items) - ratings.values) ** 2))
  )


def recall_at_k(
  scores: np.ndarray,
  users: np.ndarray,
  history: Ratings,
  target: Ratings,
  threshold: float,
  k: int = 20,
) -> float:
  """Mean over users with a target of |target ∩ top-k| / min(k, |target|); the top k is taken over
  all items except the user's history (App. E.1), targets are ratings above `threshold`. `scores`
  has one row per entry of `users`."""
  positive = target.subset(target.values > threshold)
  wanted = np.unique(positive.users)
  if wanted.size == 0:
    return float("nan")
  row_of = {u: r for r, u in enumerate(np.asarray(users).tolist())}
  scores = np.array(scores[[row_of[u] for u in wanted.tolist()]], dtype=np.float64)
  row = {u: r for r, u in enumerate(wanted.tolist())}
  in_history = np.isin(history.users, wanted)
  hist_rows = np.fromiter((row[u] for u in history.users[in_history].tolist()), np.int64)
  scores[hist_rows, history.items[in_history]] = -np.inf
  k = min(k, scores.shape[1])
  top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  hit = np.zeros_like(scores, dtype=bool)
  np.put_along_axis(hit, top, True, axis=1)
  pos_rows = np.fromiter((row[u] for u in positive.users.tolist()), np.int64)
  hits = np.bincount(pos_rows, weights=hit[pos_rows, positive.items], minlength=wanted.size)
  sizes = np.bincount(pos_rows, minlength=wanted.size)
  return float(np.mean(hits / np.minimum(k, sizes)))


def evaluate(
  dataset: Dataset,
  model: model_lib.Model,
  part: str,
  reg_user: float = 1.0,
  reg_user_bias: float = 1.0,
) -> dict:
  """`{part}_rmse` (rating protocols) and/or `{part}_recall_at_20` (held-out users; also on the
  synthetic data) on `part` = 'validation' or 'test'. Held-out users compute their embedding from
  their history with the released item side (UserUpdate, λ_u = `reg_user`, λ_c = `reg_user_bias`)."""
  heldout = getattr(dataset, part)
  off = dataset.rating_offset
  out = {}
  if dataset.protocol == "rmse":
    out[f"{part}_rmse"] = rmse(model, heldout.target)
    if dataset.name == "synthetic":
      everyone = np.arange(dataset.num_users)
      out[f"{part}_recall_at_20"] = recall_at_k(
        model.scores(model.user_vectors), everyone, dataset.train, heldout.target, off
      )
    return out
  history = heldout.history
  theirs = model_lib.fit(
    model.item_side,
    history,
    dataset.num_users,
    off,
    model.bias_scale,
    reg_user,
    reg_user_bias,
  )
  users = np.unique(np.concatenate([history.users, heldout.target.users]))
  out[f"{part}_recall_at_20"] = recall_at_k(
    model.scores(theirs.user_vectors[users]), users, history, heldout.target, off
  )
  return out
