"""Sufficient statistics A_j, b_j (Prop. 1, eq. (5)), their weights and their Gaussian noise.

Weights (App. E.1, "Privacy Budget Allocation", from Krichene et al. 2023 eqs. (11)-(12)):
w_i = w̄ n̂_{j_i}^{-1/4} / sqrt(Σ_{i'∈Ω_k} n̂_{j_i'}^{-1/2}), so Σ_{i∈Ω_k} w_i² = w̄² for every user k,
where n̂ are DP item counts. With these weights one user changes A = [A_1|…|A_m] by at most w̄ Γ_u² and
b by at most w̄ Γ_u Γ_y in Frobenius norm (proof of Thm. 2, App. B.2): `sensitivities`. With biases
the user side is [Clip(u, Γ_u), β] (`user_side`) and Γ_u becomes Γ̃ = sqrt(Γ_u² + β²).
The noise is added once (SSP2, Algorithm 3 lines 4-5): A_j + σ Γ_u² N^{d×d} (symmetric, upper triangle
i.i.d.; releasing the upper triangle is post-processed into the symmetric matrix) and b_j + σ Γ_u Γ_y N^d.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse


@dataclass(frozen=True)
class Statistics:
  a: np.ndarray  # (m, d, d)
  b: np.ndarray  # (m, d)


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """A fixed pseudo-random 64-bit mix (SplitMix64's finalizer), elementwise, wrapping."""
  with np.errstate(over="ignore"):
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def count_contributions(
  users: np.ndarray, items: np.ndarray, max_items_per_user: int, seed: int
) -> np.ndarray:
  """Indices of the ratings that enter the item counts: at most `max_items_per_user` distinct items
  per user, a pseudo-random subset keyed by (seed, user, item) only, so one user's choice does not
  depend on anyone else's data and one user changes the count vector by ≤ √max_items_per_user."""
  users = np.asarray(users, dtype=np.int64)
  items = np.asarray(items, dtype=np.int64)
  key = _splitmix64(
    _splitmix64(np.full(users.size, seed, dtype=np.uint64) ^ users.astype(np.uint64))
    ^ items.astype(np.uint64)
  )
  order = np.lexsort((key, items, users))  # by user, then item (to drop repeats), then key
  distinct = np.ones(order.size, dtype=bool)
  distinct[1:] = (users[order][1:] != users[order][:-1]) | (items[order][1:] != items[order][:-1])
  order = order[distinct]
  order = order[np.lexsort((key[order], users[order]))]  # by user, random within a user
  sorted_users = users[order]
  rank = np.arange(order.size) - np.searchsorted(sorted_users, sorted_users, side="left")
  return np.sort(order[rank < max_items_per_user])


def noisy_item_counts(
  users: np.ndarray,
  items: np.ndarray,
  num_items: int,
  max_items_per_user: int,
  noise_multiplier: float,
  seed: int,
  noise_rng,
) -> np.ndarray:
  """DP item counts n̂_j ≥ 1: Gaussian mechanism with L2 sensitivity √max_items_per_user."""
  kept = count_contributions(users, items, max_items_per_user, seed)
  counts = np.bincount(items[kept], minlength=num_items).astype(np.float64)
  std = noise_multiplier * np.sqrt(max_items_per_user)
  return np.maximum(counts + std * noise_rng.standard_normal(num_items), 1.0)


def example_weights(
  users: np.ndarray, items: np.ndarray, counts: np.ndarray, num_users: int, wbar: float = 1.0
) -> np.ndarray:
  """w_i ∝ n̂_{j_i}^{-1/4}, normalized per user so Σ_{i∈Ω_k} w_i² = w̄² (App. E.1)."""
  raw = np.asarray(counts, dtype=np.float64)[items] ** -0.25
  per_user = np.bincount(users, weights=raw * raw, minlength=num_users)
  return wbar * raw / np.sqrt(per_user[users])


def sufficient_statistics(
  user_vectors: np.ndarray,
  users: np.ndarray,
  labels: np.ndarray,
  items: np.ndarray,
  weights: np.ndarray,
  num_items: int,
) -> Statistics:
  """A_j = Σ_{i∈Ω_j} w_i ū_{k_i} ū_{k_i}ᵀ and b_j = Σ_{i∈Ω_j} w_i ȳ_i ū_{k_i} (Algorithm 3 lines 4-5,
  float64), given per-user clipped embeddings ū (num_users, d) and clipped labels ȳ_i. The outer
  products are formed once per user and combined by a sparse (items x users) weight matrix."""
  u = np.asarray(user_vectors, dtype=np.float64)
  n, d = u.shape
  w = np.asarray(weights, dtype=np.float64)
  by_item = sparse.csr_matrix((w, (items, users)), shape=(num_items, n))
  a = np.asarray(by_item @ np.einsum("ki,kj->kij", u, u).reshape(n, d * d)).reshape(-1, d, d)
  weighted_labels = sparse.csr_matrix(
    (w * np.asarray(labels, dtype=np.float64), (items, users)), shape=(num_items, n)
  )
  return Statistics(a, np.asarray(weighted_labels @ u))


def user_side(user_vectors: np.ndarray, clip_user: float, bias_scale: float | None) -> np.ndarray:
  """ū_k = Clip(u_k, Γ_u) (Algorithm 3 line 2), with biases augmented by the constant β:
  [Clip(u_k, Γ_u), β], so the item side's last coordinate fits the item bias (a regression with an
  intercept); ‖ū_k‖ ≤ Γ̃ = sqrt(Γ_u² + β²)."""
  clipped = np.asarray(user_vectors, dtype=np.float64)
  norms = np.linalg.norm(clipped, axis=-1, keepdims=True)
  clipped = clipped * np.minimum(1.0, clip_user / np.maximum(norms, 1e-300))
  if bias_scale is None:
    return clipped
  return np.hstack([clipped, np.full((clipped.shape[0], 1), float(bias_scale))])


def user_bound(clip_user: float, bias_scale: float | None = None) -> float:
  """Γ̃, the bound on ‖ū_k‖ (`user_side`): Γ_u, or sqrt(Γ_u² + β²) with biases."""
  return float(np.hypot(clip_user, bias_scale or 0.0))


def sensitivities(
  wbar: float, clip_user: float, clip_label: float, bias_scale: float | None = None
) -> tuple[float, float]:
  """User-level L2 sensitivities of A and b (App. B.2): w̄ Γ̃² and w̄ Γ̃ Γ_y, Γ̃ = `user_bound`:
  ‖A − A′‖_F² = Σ_{i∈Ω_k} w_i² ‖ū_k ū_kᵀ‖_F² ≤ w̄² Γ̃⁴ for distinct items (`Ratings.merged`)."""
  bound = user_bound(clip_user, bias_scale)
  return wbar * bound**2, wbar * bound * clip_label


def sample_noise(num_items: int, dim: int, rng) -> Statistics:
  """Standard noise: symmetric N^{d×d} (upper triangle i.i.d. N(0,1)) per item and N^d per item."""
  upper = np.triu(rng.standard_normal((num_items, dim, dim)))
  sym = upper + np.transpose(np.triu(upper, 1), (0, 2, 1))
  return Statistics(sym, rng.standard_normal((num_items, dim)))


def add_noise(
  stats: Statistics,
  noise: Statistics,
  noise_multiplier: float,
  wbar: float,
  clip_user: float,
  clip_label: float,
  bias_scale: float | None = None,
) -> Statistics:
  """Â = A + σ s_A N, b̂ = b + σ s_b N with σ the noise multiplier and s the sensitivities."""
  if noise_multiplier == 0:  # the non-private reference (epsilon inf): exactly no noise
    return stats
  s_a, s_b = sensitivities(wbar, clip_user, clip_label, bias_scale)
  return Statistics(
    stats.a + noise_multiplier * s_a * noise.a, stats.b + noise_multiplier * s_b * noise.b
  )


def psd_projection(a: np.ndarray) -> np.ndarray:
  """Each noisy Â_j projected onto the PSD cone (post-processing) so the item loss stays convex."""
  eigenvalues, vectors = np.linalg.eigh(a)
  return np.einsum("mij,mj,mkj->mik", vectors, np.maximum(eigenvalues, 0.0), vectors)
