"""The UserUpdate: one ridge regression per user, in closed form (App. E.1, "Model Architecture").

u*_k = (Σ_{i∈Ω_k} v_{j_i} v_{j_i}ᵀ + λ_u I)^{-1} Σ_{i∈Ω_k} y_i v_{j_i}. Each user solves it on their own
data from the released item embeddings, so the user embeddings are never released (the billboard
model of DP-ALS, Chien et al. 2021) and cost no privacy.
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
  reg: float,
) -> np.ndarray:
  """(num_users, d) float64 user embeddings; a user without ratings gets 0. The outer products are
  formed once per item and combined by a sparse (users x items) matrix."""
  v = np.asarray(item_vectors, dtype=np.float64)
  m, d = v.shape
  counts = sparse.csr_matrix((np.ones(users.size), (users, items)), shape=(num_users, m))
  gram = np.asarray(counts @ np.einsum("ji,jk->jik", v, v).reshape(m, d * d))
  gram = gram.reshape(num_users, d, d) + reg * np.eye(d)
  by_label = sparse.csr_matrix(
    (np.asarray(labels, dtype=np.float64), (users, items)), shape=(num_users, m)
  )
  rhs = np.asarray(by_label @ v)
  return np.linalg.solve(gram, rhs[..., None])[..., 0]


def clip_rows(x: np.ndarray, bound: float) -> np.ndarray:
  """Each row scaled to Euclidean norm ≤ bound (Clip(·, Γ) of Algorithms 2-3, line 2)."""
  norms = np.linalg.norm(x, axis=-1, keepdims=True)
  return x * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
