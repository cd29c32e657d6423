"""The UserUpdate: one ridge regression per user, in closed form (App. E.1, "Model Architecture").

u*_k = (Σ_{i∈Ω_k} v_{j_i} v_{j_i}ᵀ + λ_u I)^{-1} Σ_{i∈Ω_k} y_i v_{j_i}. Each user solves it on their own
data from the released item embeddings, so the user embeddings are never released (the billboard
model of DP-ALS, Chien et al. 2021) and cost no privacy. With biases, the user also solves for
their own bias c_k (an intercept, ridge λ_c), on the target y − offset − item bias: free as well.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse


def user_update(
  item_vectors: np.ndarray,
  users: np.ndarray,
  items: np.ndarray,
  labels: np.ndarray,
  num_users: int,
  reg,
) -> np.ndarray:
  """(num_users, d) float64 user embeddings; a user without ratings gets 0. `reg`: λ, or one λ per
  coordinate. The outer products are formed once per item and combined by a sparse (users x items)
  matrix."""
  v = np.asarray(item_vectors, dtype=np.float64)
  m, d = v.shape
  counts = sparse.csr_matrix((np.ones(users.size), (users, items)), shape=(num_users, m))
  gram = np.asarray(counts @ np.einsum("ji,jk->jik", v, v).reshape(m, d * d))
  gram = gram.reshape(num_users, d, d) + np.diag(np.broadcast_to(np.asarray(reg, float), (d,)))
  by_label = sparse.csr_matrix(
    (np.asarray(labels, dtype=np.float64), (users, items)), shape=(num_users, m)
  )
  rhs = np.asarray(by_label @ v)
  return np.linalg.solve(gram, rhs[..., None])[..., 0]


def fit_users(
  item_vectors: np.ndarray,
  item_biases: np.ndarray | None,
  users: np.ndarray,
  items: np.ndarray,
  labels: np.ndarray,
  num_users: int,
  reg_user: float,
  reg_bias: float,
) -> tuple[np.ndarray, np.ndarray]:
  """(u, c): every user's embedding (num_users, d) and bias (num_users,) from their own ratings
  (`labels`: ratings minus the offset). Without item biases (None) the model has no biases and
  c = 0; with them, the user regresses y − e_j on [v_j, 1]."""
  if item_biases is None:
    u = user_update(item_vectors, users, items, labels, num_users, reg_user)
    return u, np.zeros(num_users)
  m, d = item_vectors.shape
  design = np.hstack([item_vectors, np.ones((m, 1))])
  reg = np.append(np.full(d, reg_user), reg_bias)
  solved = user_update(design, users, items, labels - item_biases[items], num_users, reg)
  return solved[:, :d], solved[:, d]


def clip_rows(x: np.ndarray, bound: float) -> np.ndarray:
  """Each row scaled to Euclidean norm ≤ bound (Clip(·, Γ) of Algorithms 2-3, line 2)."""
  norms = np.linalg.norm(x, axis=-1, keepdims=True)
  return x * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
