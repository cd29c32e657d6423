"""ItemUpdates of the three algorithms, given frozen (clipped) user embeddings.

- SSP (Algorithm 3 lines 6-8): the server minimizes the quadratic loss written with the released
  statistics only, F(θ) = Σ_j ½ v_j(θ)ᵀ Â_j v_j(θ) − b̂_jᵀ v_j(θ) + λ_v/2 Σ_j ‖v_j(θ)‖² + λ_θ/2 ‖θ‖²,
  whose gradient is Σ_j ∂v_j/∂θ [Â_j v_j − b̂_j + λ_v v_j] + λ_θ θ (Prop. 1, eq. (4)); full batch,
  L-BFGS instead of plain gradient steps (both post-process the same statistics).
- DP-ALS (item ids only, Chien et al. 2021): v_j = (Â_j + λ_v I)^{-1} b̂_j per item.
- DP-SGD (Algorithm 6, at user level): T steps on Poisson-sampled users, each user's gradient of
  ½ Σ_{i∈Ω_k} w_i (ū_k·v_{j_i} − ȳ_i)² clipped to Γ_g, Gaussian noise σ Γ_g on the sum.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from fedmf.public_features import encoder
from fedmf.public_features.data import ItemFeatures
from fedmf.public_features.statistics import Statistics


def ssp_item_update(
  features: ItemFeatures,
  params: encoder.EncoderParams,
  stats: Statistics,
  reg_item: float,
  reg_params: float,
  steps: int,
) -> encoder.EncoderParams:
  """The public encoder optimized on (PSD-projected) noisy statistics; no private data is read."""

  def loss_and_grad(flat: np.ndarray):
    p = params.like(flat)
    v = encoder.forward(features, p)
    av = np.einsum("mij,mj->mi", stats.a, v)
    loss = 0.5 * np.sum(v * av) - np.sum(stats.b * v) + 0.5 * reg_item * np.sum(v * v)
    loss += 0.5 * reg_params * flat @ flat
    grad = encoder.backward(features, p, av - stats.b + reg_item * v).flat() + reg_params * flat
    return loss, grad

  result = optimize.minimize(
    loss_and_grad, params.flat(), jac=True, method="L-BFGS-B", options={"maxiter": steps}
  )
  return params.like(result.x)


def als_item_update(stats: Statistics, reg_item: float) -> np.ndarray:
  """DP-ALS item embeddings (m, d): the ridge solution of each item's noisy normal equations."""
  d = stats.b.shape[1]
  return np.linalg.solve(stats.a + reg_item * np.eye(d), stats.b[..., None])[..., 0]


def cmf_item_update(
  stats: Statistics, features: np.ndarray, item_side: np.ndarray, weight: float, reg_item: float
) -> np.ndarray:
  """DP-CMF item embeddings (m, d) (Curmei et al. 2023): collective matrix factorization of the
  ratings beside the public feature matrix X (m × p). The feature embeddings W (p × d) are fitted
  to the current item side (public: released embeddings and public features),
  W = Xᵀ V (VᵀV + λ I)^{-1}; each item then solves its noisy normal equations with the features'
  rows added as α-weighted pseudo-users: v_j = (Â_j + α WᵀW + λ I)^{-1} (b̂_j + α X_j W).
  α = 0 is DP-ALS."""
  d = stats.b.shape[1]
  v = np.asarray(item_side, dtype=np.float64)
  w = np.linalg.solve(v.T @ v + reg_item * np.eye(d), (features.T @ v).T).T  # (p, d)
  gram = stats.a + weight * (w.T @ w) + reg_item * np.eye(d)
  rhs = stats.b + weight * (features @ w)
  return np.linalg.solve(gram, rhs[..., None])[..., 0]


def dpsgd_item_update(
  features: ItemFeatures,
  params: encoder.EncoderParams,
  user_vectors: np.ndarray,
  users: np.ndarray,
  items: np.ndarray,
  labels: np.ndarray,
  num_users: int,
  *,
  weights: np.ndarray | None = None,
  steps: int,
  sampling_probability: float,
  clip_norm: float,
  noise_multiplier: float,
  learning_rate: float,
  reg_params: float,
  rng,
  optimizer: str = "sgd",
) -> encoder.EncoderParams:
  """User-level DP-SGD on the public encoder (Algorithm 6; the forward pass once per step). Each
  sampled user's gradient of ½ Σ_{i∈Ω_k} w_i (ū_k·v_{j_i} − ȳ_i)² (`weights` w_i: the App. E.1
  budget allocation, or 1) is clipped to Γ_g. `optimizer` "adam" steps with Adam (Kingma and Ba
  2015, Alg. 1) on the noised mean gradient instead of plain SGD: post-processing of the same
  releases, so the privacy is unchanged; its moments restart with each call (one outer step)."""
  flat = params.flat()
  adam = _Adam(flat.size) if optimizer == "adam" else None
  expected_batch = sampling_probability * num_users
  by_user = np.argsort(users, kind="stable")
  starts = np.searchsorted(users[by_user], np.arange(num_users + 1))
  for _ in range(steps):
    p = params.like(flat)
    chosen = np.flatnonzero(rng.random(num_users) < sampling_probability)
    total = np.zeros_like(flat)
    if chosen.size:
      rows = np.concatenate([by_user[starts[k] : starts[k + 1]] for k in chosen])
      v = encoder.forward(features, p)
      u = user_vectors[users[rows]]
      residual = np.einsum("nd,nd->n", u, v[items[rows]]) - labels[rows]
      if weights is not None:
        residual = residual * weights[rows]
      # Per-user gradients (one row per sampled user), clipped to Γ_g (user-level sensitivity).
      owner = np.searchsorted(chosen, users[rows])
      per_user = encoder.per_user_gradients(
        features, p, owner, chosen.size, items[rows], residual[:, None] * u
      )
      norms = np.sqrt(np.asarray(per_user.multiply(per_user).sum(axis=1)).ravel())
      scale = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
      total = per_user.T @ scale
    total += noise_multiplier * clip_norm * rng.standard_normal(flat.size)
    gradient = total / expected_batch + reg_params * flat
    flat = flat - learning_rate * (gradient if adam is None else adam.direction(gradient))
  return params.like(flat)


class _Adam:
  """Adam's step direction (Kingma and Ba 2015, Algorithm 1, with bias correction); the learning
  rate is applied by the caller. Written here (a few lines of numpy on one flat vector) because the
  encoder is numpy, not a TF or optax model."""

  BETA1, BETA2, EPSILON = 0.9, 0.999, 1e-8

  def __init__(self, size: int):
    self.first = np.zeros(size)
    self.second = np.zeros(size)
    self.steps = 0

  def direction(self, gradient: np.ndarray) -> np.ndarray:
    self.steps += 1
    self.first = self.BETA1 * self.first + (1 - self.BETA1) * gradient
    self.second = self.BETA2 * self.second + (1 - self.BETA2) * gradient**2
    first = self.first / (1 - self.BETA1**self.steps)
    second = self.second / (1 - self.BETA2**self.steps)
    return first / (np.sqrt(second) + self.EPSILON)
