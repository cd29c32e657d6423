"""Alternating minimization (Algorithm 1) with the three ItemUpdates: AM-SSP (SSP2, Algorithm 3),
AM-DPSGD (Algorithm 6) and DP-ALS (item ids only); the same closed-form UserUpdate for all (App. E.1).

Privacy (user level, whole run; `accounting`): the item encoder / item embeddings are released after
each outer step; the user embeddings are recomputed by each user from them and never released.
SSP and DP-ALS first release DP item counts for the weights of App. E.1; AM-DPSGD clips each
sampled user's whole gradient instead (no counts needed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedmf.public_features import accounting
from fedmf.public_features import encoder
from fedmf.public_features import evaluation
from fedmf.public_features import item_updates
from fedmf.public_features import statistics
from fedmf.public_features import users as users_lib
from fedmf.public_features.data import Dataset
from fedmf.public_features.data import Ratings

ALGORITHMS = ("am-ssp", "am-dpsgd", "dp-als")


@dataclass(frozen=True)
class Hyperparameters:
  dim: int = 8
  outer_steps: int = 3  # S of Algorithm 1
  item_steps: int = 50  # T: L-BFGS iterations (SSP) or DP-SGD steps per outer step
  reg_user: float = 1.0  # λ_u of the UserUpdate
  reg_item: float = 10.0  # λ_v on the item embeddings
  # λ_v grows with the noise: + reg_noise · σ · w̄ Γ_u² (a public quantity, as DP-ALS's noise-aware
  # regularization, Chien et al. 2021), so noisier statistics are shrunk more.
  reg_noise: float = 3.0
  reg_params: float = 10.0  # λ_θ on the encoder parameters (shares the signal across items)
  clip_user: float = 1.0  # Γ_u
  clip_label: float = 2.0  # Γ_y (on labels minus the rating offset)
  count_fraction: float = 0.1  # share of ρ spent on the item counts
  max_items_per_user: int = 50  # contributions of one user to the counts
  dpsgd_sampling: float = 0.02  # q: users sampled per DP-SGD step
  dpsgd_clip: float = 5.0  # Γ_g: per-user gradient clip
  dpsgd_learning_rate: float = 0.5
  dpsgd_weight_decay: float = 1e-3  # λ_θ of DP-SGD (per step, on the mean gradient)
  init_scale: float = 0.3


@dataclass(frozen=True)
class Releaser:
  """Where the private aggregates are computed: in memory (default) or by TFF clients (Alg. 8).

  counts(train, num_items, max_items_per_user, noise_multiplier, seed, noise_rng) -> n̂;
  statistics(item_vectors, train, num_users, counts, hyper, noise_multiplier, noise) -> (Â, b̂).
  """

  counts: Callable
  statistics: Callable


def central_statistics(
  item_vectors,
  train: Ratings,
  num_users,
  counts,
  hyper: Hyperparameters,
  noise_multiplier,
  noise,
  labels,
) -> statistics.Statistics:
  """What the aggregator releases (Algorithm 8 lines 4-8, here on one machine). Repeated (user,
  item) rows count once, with their mean label (`Ratings.merged`): the weights and the
  sensitivity of Thm. 2 assume distinct items per user."""
  train = Ratings(train.users, train.items, np.asarray(labels, dtype=np.float64)).merged()
  labels = train.values
  u = users_lib.user_update(
    item_vectors, train.users, train.items, labels, num_users, hyper.reg_user
  )
  u_bar = users_lib.clip_rows(u, hyper.clip_user)
  y_bar = np.clip(labels, -hyper.clip_label, hyper.clip_label)
  weights = statistics.example_weights(train.users, train.items, counts, num_users)
  exact = statistics.sufficient_statistics(
    u_bar, train.users, y_bar, train.items, weights, len(counts)
  )
  return statistics.add_noise(
    exact, noise, noise_multiplier, 1.0, hyper.clip_user, hyper.clip_label
  )


def central_counts(
  train: Ratings, num_items, max_items_per_user, noise_multiplier, seed, noise_rng
):
  return statistics.noisy_item_counts(
    train.users, train.items, num_items, max_items_per_user, noise_multiplier, seed, noise_rng
  )


CENTRAL = Releaser(central_counts, central_statistics)


@dataclass(frozen=True)
class TrainResult:
  algorithm: str
  item_vectors: np.ndarray
  user_vectors: np.ndarray
  train_seconds: float
  privacy: dict
  metrics: list = field(default_factory=list)  # one dict per outer step
  released: list = field(default_factory=list)  # SSP/DP-ALS: the noisy statistics per step


def _user_update_or_diverged(*args):
  try:
    return users_lib.user_update(*args)
  except np.linalg.LinAlgError:
    raise FloatingPointError(
      "training diverged (singular UserUpdate); lower the learning rate or raise the regularization"
    ) from None


def evaluate(dataset: Dataset, item_vectors: np.ndarray, user_vectors: np.ndarray) -> dict:
  """test_rmse (rating protocols) and/or test_recall_at_20 (held-out users, and synthetic data)."""
  off = dataset.rating_offset
  out = {}
  if dataset.protocol == "rmse":
    out["test_rmse"] = evaluation.rmse(user_vectors, item_vectors, dataset.test, off)
    if dataset.name == "synthetic":
      out["test_recall_at_20"] = evaluation.recall_at_k(
        user_vectors, item_vectors, dataset.train, dataset.test, off
      )
  else:
    hist = dataset.history
    heldout = users_lib.user_update(
      item_vectors, hist.users, hist.items, hist.values - off, dataset.num_users, 1.0
    )
    out["test_recall_at_20"] = evaluation.recall_at_k(
      heldout, item_vectors, hist, dataset.test, off
    )
  return out


def train(
  dataset: Dataset,
  algorithm: str,
  epsilon: float,
  delta: float,
  seed: int,
  hyper: Hyperparameters = Hyperparameters(),
  releaser: Releaser = CENTRAL,
  progress: Callable[[dict], None] | None = None,
  keep_released: bool = False,
) -> TrainResult:
  """Runs Algorithm 1 with the chosen ItemUpdate at user-level (ε, δ)-DP; float64 throughout."""
  if algorithm not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
  rng = np.random.default_rng([seed, 1])  # model initialization (public)
  noise_rng = np.random.default_rng([seed, 2])  # all privacy noise and DP-SGD sampling
  tr = dataset.train
  labels = tr.values - dataset.rating_offset
  m, n = dataset.features.num_items, dataset.num_users
  start, elapsed = time.perf_counter(), 0.0
  params = encoder.init_encoder(dataset.features, hyper.dim, rng, hyper.init_scale)
  item_vectors = (
    rng.normal(0.0, hyper.init_scale, (m, hyper.dim))
    if algorithm == "dp-als"
    else encoder.forward(dataset.features, params)
  )
  metrics, released = [], []
  if algorithm == "am-dpsgd":
    budget = accounting.calibrate_dpsgd(
      epsilon, delta, hyper.outer_steps * hyper.item_steps, hyper.dpsgd_sampling
    )
    privacy = {
      "mechanism": "user-level DP-SGD",
      "noise_multiplier": budget.noise_multiplier,
      "steps": budget.steps,
      "sampling_probability": budget.sampling_probability,
    }
  else:
    budget = accounting.calibrate_ssp(epsilon, delta, hyper.outer_steps, hyper.count_fraction)
    privacy = {
      "mechanism": "SSP2 (noise once per outer step)",
      "mu": budget.mu,
      "count_noise_multiplier": budget.count_noise_multiplier,
      "stats_noise_multiplier": budget.stats_noise_multiplier,
    }
  start = time.perf_counter()  # calibration (accounting, not training) excluded from the time
  if algorithm != "am-dpsgd":
    counts = releaser.counts(
      tr, m, hyper.max_items_per_user, budget.count_noise_multiplier, seed, noise_rng
    )
  for step in range(1, hyper.outer_steps + 1):
    if algorithm == "am-dpsgd":
      u = _user_update_or_diverged(item_vectors, tr.users, tr.items, labels, n, hyper.reg_user)
      params = item_updates.dpsgd_item_update(
        dataset.features,
        params,
        users_lib.clip_rows(u, hyper.clip_user),
        tr.users,
        tr.items,
        np.clip(labels, -hyper.clip_label, hyper.clip_label),
        n,
        steps=hyper.item_steps,
        sampling_probability=hyper.dpsgd_sampling,
        clip_norm=hyper.dpsgd_clip,
        noise_multiplier=budget.noise_multiplier,
        learning_rate=hyper.dpsgd_learning_rate,
        reg_params=hyper.dpsgd_weight_decay,
        rng=noise_rng,
      )
      item_vectors = encoder.forward(dataset.features, params)
    else:
      noise = statistics.sample_noise(m, hyper.dim, noise_rng)
      stats = releaser.statistics(
        item_vectors, tr, n, counts, hyper, budget.stats_noise_multiplier, noise, labels
      )
      if keep_released:
        released.append(stats)
      stats = statistics.Statistics(statistics.psd_projection(stats.a), stats.b)
      reg = hyper.reg_item + hyper.reg_noise * budget.stats_noise_multiplier * hyper.clip_user**2
      if algorithm == "am-ssp":
        params = item_updates.ssp_item_update(
          dataset.features, params, stats, reg, hyper.reg_params, hyper.item_steps
        )
        item_vectors = encoder.forward(dataset.features, params)
      else:
        item_vectors = item_updates.als_item_update(stats, reg)
    elapsed += time.perf_counter() - start  # training time only, evaluation excluded
    if not np.all(np.isfinite(item_vectors)) or np.abs(item_vectors).max() > 1e100:
      raise FloatingPointError(
        f"{algorithm} diverged at outer step {step} (non-finite item embeddings); lower the "
        "learning rate or raise the regularization"
      )
    user_vectors = _user_update_or_diverged(
      item_vectors, tr.users, tr.items, labels, n, hyper.reg_user
    )
    row = {"step": step, "seconds": elapsed, **evaluate(dataset, item_vectors, user_vectors)}
    metrics.append(row)
    if progress:
      progress(row)
    start = time.perf_counter()
  return TrainResult(algorithm, item_vectors, user_vectors, elapsed, privacy, metrics, released)
