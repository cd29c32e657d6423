"""Alternating minimization (Algorithm 1) with the ItemUpdates: AM-SSP (SSP2, Algorithm 3),
AM-DPSGD (Algorithm 6), DP-ALS (item ids only), DP-CMF (Curmei et al. 2023: DP-ALS with the public
features as pseudo-users) and the DP bias model (DP-ALS with biases only: the DP per-item means
baseline); the same closed-form UserUpdate for all (App. E.1), with user biases.

Privacy (user level, whole run; `accounting`): the item encoder / item embeddings are released after
each outer step; the user embeddings and biases are recomputed by each user from them and never
released. SSP, DP-ALS and the bias model first release DP item counts for the weights of App. E.1;
AM-DPSGD uses the same weights (released the same way), and clips each sampled user's whole
gradient. With `weights: uniform` (w_i = w̄/sqrt(|Ω_k|), Thm. 2's bound with no count release) no
counts are released. ε = inf runs the same code without noise (the
non-private reference).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from fedmf.public_features import accounting
from fedmf.public_features import encoder
from fedmf.public_features import evaluation
from fedmf.public_features import item_updates
from fedmf.public_features import model as model_lib
from fedmf.public_features import statistics
from fedmf.public_features import users as users_lib
from fedmf.public_features.data import Dataset
from fedmf.public_features.data import Ratings

ALGORITHMS = ("am-ssp", "am-dpsgd", "dp-als", "dp-cmf", "dp-bias")
STATISTICS_ALGORITHMS = ("am-ssp", "dp-als", "dp-cmf", "dp-bias")  # those that release A and b


@dataclass(frozen=True)
class Hyperparameters:
  dim: int = 8
  outer_steps: int = 3  # S of Algorithm 1
  item_steps: int = 50  # T of SSP: L-BFGS iterations per outer step
  dpsgd_steps: int = 20  # T of AM-DPSGD: DP-SGD steps per outer step
  reg_user: float = 1.0  # λ_u of the UserUpdate
  reg_user_bias: float = 1.0  # λ_c on each user's own bias
  reg_item: float = 10.0  # λ_v on the item embeddings (and item biases)
  # λ_v grows with the noise: + reg_noise · σ · w̄ Γ̃² (a public quantity, as DP-ALS's noise-aware
  # regularization, Chien et al. 2021), so noisier statistics are shrunk more.
  reg_noise: float = 3.0
  reg_params: float = 10.0  # λ_θ on the encoder parameters (shares the signal across items)
  clip_user: float = 1.0  # Γ_u
  clip_label: float = 2.0  # Γ_y (on labels minus the offset and the user's bias)
  weights: str = "counts"  # App. E.1 weights w ∝ n̂^(-1/4) from DP counts, or 'uniform' (no counts)
  count_fraction: float = 0.1  # share of ρ spent on the item counts (weights: counts)
  last_step_weight: float = 1.0  # ω: the last outer step's share of ρ over an earlier step's
  max_items_per_user: int = 50  # contributions of one user to the counts
  dpsgd_sampling: float = 0.05  # q: users sampled per DP-SGD step
  dpsgd_clip: float = 1.0  # Γ_g: per-user gradient clip
  dpsgd_learning_rate: float = 0.5
  dpsgd_weight_decay: float = 1e-3  # λ_θ of DP-SGD (per step, on the mean gradient)
  dpsgd_optimizer: str = "sgd"  # or "adam" on the noised gradient (post-processing)
  init_scale: float = 0.3
  item_id: bool = False  # the item's id as one more feature of the encoder (AM-SSP, AM-DPSGD)
  biases: bool = True  # user biases, item biases, a global offset (model.py)
  bias_scale: float = 1.0  # β: the constant beside Clip(u, Γ_u) on the user side
  cmf_weight: float = 1.0  # α of DP-CMF: the weight of the public features' pseudo-users

  @property
  def user_bias_scale(self) -> float | None:
    """β, or None for a model without biases."""
    return self.bias_scale if self.biases else None

  def user_clip(self, dim: int) -> float:
    """Γ_u of a model with `dim` embedding coordinates: 0 for the bias model (d = 0), whose user
    side is [β] alone, so its sensitivities use Γ̃ = β (not sqrt(Γ_u² + β²): no over-noising)."""
    return self.clip_user if dim > 0 else 0.0


@dataclass(frozen=True)
class Releaser:
  """Where the private aggregates are computed: in memory (default) or by TFF clients (Alg. 8).

  counts(train, num_items, max_items_per_user, noise_multiplier, seed, noise_rng) -> n̂;
  statistics(item_side, train, num_users, counts, hyper, noise_multiplier, noise, labels) -> (Â, b̂).
  """

  counts: Callable
  statistics: Callable


def item_targets(
  item_side: np.ndarray,
  train: Ratings,
  num_users: int,
  hyper: Hyperparameters,
  labels: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
  """(ū, ȳ): each user's side of the item regression, [Clip(u_k, Γ_u), β] (num_users, d + 1), and
  each rating's clipped target Clip(y − o − c_k, Γ_y), from the users' own UserUpdate."""
  beta = hyper.user_bias_scale
  dim = item_side.shape[1] - (beta is not None)
  item_biases = None if beta is None else beta * item_side[:, dim]
  u, c = users_lib.fit_users(
    item_side[:, :dim],
    item_biases,
    train.users,
    train.items,
    labels,
    num_users,
    hyper.reg_user,
    hyper.reg_user_bias,
  )
  u_bar = statistics.user_side(u, hyper.clip_user, beta)
  y_bar = np.clip(labels - c[train.users], -hyper.clip_label, hyper.clip_label)
  return u_bar, y_bar


def central_statistics(
  item_side,
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
  clip = hyper.user_clip(item_side.shape[1] - (hyper.user_bias_scale is not None))
  u_bar, y_bar = item_targets(item_side, train, num_users, hyper, train.values)
  weights = statistics.example_weights(train.users, train.items, counts, num_users)
  exact = statistics.sufficient_statistics(
    u_bar, train.users, y_bar, train.items, weights, len(counts)
  )
  return statistics.add_noise(
    exact, noise, noise_multiplier, 1.0, clip, hyper.clip_label, hyper.user_bias_scale
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
  model: model_lib.Model
  train_seconds: float
  privacy: dict
  metrics: list = field(default_factory=list)  # one dict per outer step
  released: list = field(default_factory=list)  # SSP/DP-ALS: the noisy statistics per step


def _diverged(algorithm: str, step: int) -> FloatingPointError:
  return FloatingPointError(
    f"{algorithm} diverged at outer step {step} (non-finite item embeddings); lower the "
    "learning rate or raise the regularization"
  )


def _privacy(algorithm: str, budget, hyper: Hyperparameters, dim: int) -> dict:
  if math.isinf(budget.epsilon):
    return {"mechanism": "none: the non-private reference (epsilon inf, no noise)"}
  if algorithm == "am-dpsgd":
    out = {
      "mechanism": "user-level DP-SGD",
      "noise_multiplier": budget.noise_multiplier,
      "steps": budget.steps,
      "sampling_probability": budget.sampling_probability,
    }
    if budget.count_noise_multiplier is not None:
      out["count_noise_multiplier"] = budget.count_noise_multiplier
    return out
  return {
    "mechanism": "SSP2 (noise once per outer step)",
    "mu": budget.mu,
    "count_noise_multiplier": budget.count_noise_multiplier if budget.counts else None,
    "stats_noise_multipliers": list(budget.stats_noise_multipliers),
    "sensitivity_a": statistics.sensitivities(
      1.0, hyper.user_clip(dim), hyper.clip_label, hyper.user_bias_scale
    )[0],
  }


def budget_of(algorithm: str, epsilon: float, delta: float, hyper: Hyperparameters):
  """The run's noise multipliers (`accounting`): SSP's split, or DP-SGD's after the counts."""
  fraction = hyper.count_fraction if hyper.weights == "counts" else 0.0
  if algorithm != "am-dpsgd":
    return accounting.calibrate_ssp(
      epsilon, delta, hyper.outer_steps, fraction, hyper.last_step_weight
    )
  counts = None
  if hyper.weights == "counts":
    counts = accounting.count_noise_multiplier(epsilon, delta, hyper.count_fraction)
  return accounting.calibrate_dpsgd(
    epsilon, delta, hyper.outer_steps * hyper.dpsgd_steps, hyper.dpsgd_sampling, counts
  )


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
  budget=None,
) -> TrainResult:
  """Runs Algorithm 1 with the chosen ItemUpdate at user-level (ε, δ)-DP (ε = inf: no noise);
  float64 throughout. `budget`: the noise multipliers if already calibrated (`budget_of`)."""
  if algorithm not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
  if algorithm == "dp-bias" and not hyper.biases:
    raise ValueError("dp-bias is the bias model: it needs biases")
  rng = np.random.default_rng([seed, 1])  # model initialization (public)
  noise_rng = np.random.default_rng([seed, 2])  # all privacy noise and DP-SGD sampling
  tr = dataset.train.merged()
  off = dataset.rating_offset
  labels = tr.values - off
  beta = hyper.user_bias_scale
  m, n = dataset.features.num_items, dataset.num_users
  dim = 0 if algorithm == "dp-bias" else hyper.dim
  width = dim + (beta is not None)  # the item side: v_j and, with biases, e_j
  params = None
  features = dataset.features.with_item_ids() if hyper.item_id else dataset.features
  if algorithm in ("am-ssp", "am-dpsgd"):
    params = encoder.init_encoder(features, dim, rng, hyper.init_scale, width)
    item_side = encoder.forward(features, params)
  else:
    item_side = rng.normal(0.0, hyper.init_scale, (m, width))
    item_side[:, dim:] = 0.0  # item biases start at 0
  budget = budget or budget_of(algorithm, epsilon, delta, hyper)
  privacy = _privacy(algorithm, budget, hyper, dim)
  start = time.perf_counter()  # calibration (accounting, not training) excluded from the time
  counts = np.ones(m)  # uniform weights: a public constant, no release
  if hyper.weights == "counts":
    # The DP-SGD counts are released in memory: only the statistics algorithms are federated.
    count_release = releaser.counts if algorithm != "am-dpsgd" else central_counts
    counts = count_release(
      tr, m, hyper.max_items_per_user, budget.count_noise_multiplier or 0.0, seed, noise_rng
    )
  metrics, released, elapsed = [], [], 0.0
  for step in range(1, hyper.outer_steps + 1):
    if algorithm == "am-dpsgd":
      u_bar, y_bar = item_targets(item_side, tr, n, hyper, labels)
      weights = statistics.example_weights(tr.users, tr.items, counts, n)
      params = item_updates.dpsgd_item_update(
        features,
        params,
        u_bar,
        tr.users,
        tr.items,
        y_bar,
        n,
        weights=weights,
        steps=hyper.dpsgd_steps,
        sampling_probability=hyper.dpsgd_sampling,
        clip_norm=hyper.dpsgd_clip,
        noise_multiplier=budget.noise_multiplier,
        learning_rate=hyper.dpsgd_learning_rate,
        reg_params=hyper.dpsgd_weight_decay,
        rng=noise_rng,
        optimizer=hyper.dpsgd_optimizer,
      )
      item_side = encoder.forward(features, params)
    else:
      sigma = budget.stats_noise_multipliers[step - 1]
      noise = statistics.sample_noise(m, width, noise_rng)
      stats = releaser.statistics(item_side, tr, n, counts, hyper, sigma, noise, labels)
      if keep_released:
        released.append(stats)
      stats = statistics.Statistics(statistics.psd_projection(stats.a), stats.b)
      bound = statistics.user_bound(hyper.user_clip(dim), beta)
      reg = hyper.reg_item + hyper.reg_noise * sigma * bound**2
      if algorithm == "am-ssp":
        params = item_updates.ssp_item_update(
          features, params, stats, reg, hyper.reg_params, hyper.item_steps
        )
        item_side = encoder.forward(features, params)
      elif algorithm == "dp-cmf":
        matrix = sparse.hstack(dataset.features.bags).tocsr()  # the metadata, never the id
        item_side = item_updates.cmf_item_update(stats, matrix, item_side, hyper.cmf_weight, reg)
      else:
        item_side = item_updates.als_item_update(stats, reg)
    elapsed += time.perf_counter() - start  # training time only, evaluation excluded
    if not np.all(np.isfinite(item_side)) or np.abs(item_side).max(initial=0.0) > 1e100:
      raise _diverged(algorithm, step)
    try:
      model = model_lib.fit(item_side, tr, n, off, beta, hyper.reg_user, hyper.reg_user_bias)
    except np.linalg.LinAlgError:
      raise _diverged(algorithm, step) from None
    row = {"step": step, "seconds": elapsed}
    for part in ("validation", "test"):
      row.update(evaluation.evaluate(dataset, model, part, hyper.reg_user, hyper.reg_user_bias))
    metrics.append(row)
    if progress:
      progress(row)
    start = time.perf_counter()
  return TrainResult(algorithm, model, elapsed, privacy, metrics, released)
