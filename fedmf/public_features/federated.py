"""Federated SSP (the paper's Algorithm 8, App. F) as TFF computations.

Distributor: the item embeddings V (and the DP item counts n̂) are broadcast to the clients.
Client k: computes its embedding u_k by the closed-form UserUpdate on its own ratings, clips it,
computes its weights w_i from n̂ (App. E.1; the normalization only needs the client's own items) and
its contribution Σ_{i∈Ω_k} w_i ū_k ū_kᵀ, w_i ȳ_i ū_k scattered to its items.
Aggregator: sums the contributions (`tff.federated_sum` stands for secure aggregation) and adds the
Gaussian noise once; only the noisy statistics reach the server, which then optimizes the public
encoder on them exactly as in the centralized AM-SSP (`algorithms.train` with `releaser()`).
The noise is drawn on the host from the run's noise generator, in the same order as the centralized
path, so both release the same statistics for the same seed (up to float summation order).
The item counts are released the same way (each client sends its capped indicator vector).
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.public_features import statistics
from fedmf.public_features.algorithms import Releaser
from fedmf.public_features.data import Ratings
from fedmf.tff import context as tff_context

_CLIENT_TYPE = tff.StructType(
  [
    ("items", tff.TensorType(np.int32, [None])),
    ("labels", tff.TensorType(np.float64, [None])),
    ("count_items", tff.TensorType(np.int32, [None])),
  ]
)


@functools.lru_cache(maxsize=8)
def statistics_computation(
  num_items: int, dim: int, reg_user: float, clip_user: float, clip_label: float
):
  """(V@SERVER, n̂@SERVER, client data@CLIENTS, noise@SERVER) -> (Â, b̂)@SERVER."""
  v_type = tff.TensorType(np.float64, [num_items, dim])
  counts_type = tff.TensorType(np.float64, [num_items])
  noise_type = tff.StructType(
    [
      ("a", tff.TensorType(np.float64, [num_items, dim, dim])),
      ("b", tff.TensorType(np.float64, [num_items, dim])),
    ]
  )

  @tff.tensorflow.computation(_CLIENT_TYPE, v_type, counts_type)
  def client_contribution(data, item_vectors, counts):
    v = tf.gather(item_vectors, data["items"])
    y = data["labels"]
    # UserUpdate (App. E.1): u = (Σ v vᵀ + λ_u I)^{-1} Σ y v, on the client's own ratings.
    gram = tf.matmul(v, v, transpose_a=True) + reg_user * tf.eye(dim, dtype=tf.float64)
    u = tf.linalg.solve(gram, tf.matmul(v, y[:, None], transpose_a=True))[:, 0]
    one = tf.constant(1.0, tf.float64)
    u_bar = u * tf.minimum(one, clip_user / tf.maximum(tf.norm(u), tf.constant(1e-300, tf.float64)))
    y_bar = tf.clip_by_value(y, -clip_label, clip_label)
    raw = tf.gather(counts, data["items"]) ** -0.25  # w_i ∝ n̂^{-1/4}, Σ_{Ω_k} w² = 1
    w = raw / tf.sqrt(tf.reduce_sum(raw * raw))
    outer = tf.tensordot(u_bar, u_bar, axes=0)
    a = tf.math.unsorted_segment_sum(w[:, None, None] * outer[None], data["items"], num_items)
    b = tf.math.unsorted_segment_sum((w * y_bar)[:, None] * u_bar[None], data["items"], num_items)
    return a, b

  @tff.tensorflow.computation(noise_type, noise_type)
  def add_noise(summed, noise):
    return summed[0] + noise["a"], summed[1] + noise["b"]

  @tff.federated_computation(
    tff.FederatedType(v_type, tff.SERVER),
    tff.FederatedType(counts_type, tff.SERVER),
    tff.FederatedType(_CLIENT_TYPE, tff.CLIENTS),
    tff.FederatedType(noise_type, tff.SERVER),
  )
  def release(item_vectors, counts, data, noise):
    contributions = tff.federated_map(
      client_contribution,
      (data, tff.federated_broadcast(item_vectors), tff.federated_broadcast(counts)),
    )
    return tff.federated_map(add_noise, (tff.federated_sum(contributions), noise))

  return release


@functools.lru_cache(maxsize=8)
def counts_computation(num_items: int):
  """(client data@CLIENTS, noise@SERVER) -> n̂@SERVER: summed capped indicators plus noise."""
  counts_type = tff.TensorType(np.float64, [num_items])

  @tff.tensorflow.computation(_CLIENT_TYPE)
  def indicator(data):
    ones = tf.ones_like(data["count_items"], dtype=tf.float64)
    return tf.math.unsorted_segment_sum(ones, data["count_items"], num_items)

  @tff.tensorflow.computation(counts_type, counts_type)
  def add_noise(summed, noise):
    return tf.maximum(summed + noise, tf.constant(1.0, tf.float64))

  @tff.federated_computation(
    tff.FederatedType(_CLIENT_TYPE, tff.CLIENTS), tff.FederatedType(counts_type, tff.SERVER)
  )
  def release(data, noise):
    return tff.federated_map(
      add_noise, (tff.federated_sum(tff.federated_map(indicator, data)), noise)
    )

  return release


def client_datasets(train: Ratings, labels: np.ndarray, max_items_per_user: int, seed: int):
  """Each user's (items, labels, items counted) — what client k holds (users without ratings drop)."""
  kept = np.zeros(len(train), dtype=bool)
  kept[statistics.count_contributions(train.users, train.items, max_items_per_user, seed)] = True
  order = np.argsort(train.users, kind="stable")
  bounds = np.flatnonzero(np.diff(train.users[order])) + 1
  out = []
  for rows in np.split(order, bounds):
    if rows.size:
      out.append(
        {
          "items": train.items[rows].astype(np.int32),
          "labels": labels[rows].astype(np.float64),
          "count_items": train.items[rows[kept[rows]]].astype(np.int32),
        }
      )
  return out


def use_own_context() -> None:
  """Installs fedmf's owned local TFF context as the default (programs; closed at exit)."""
  tff_context.ensure_context()


def releaser() -> Releaser:
  """A `Releaser` whose counts and statistics come from TFF clients through the aggregator; it runs
  in the current TFF context (`fedmf.tff.context.local_execution_context()`, or `use_own_context()`
  once in a program)."""
  state: dict = {}

  def clients(train, labels, max_items_per_user, seed):
    """The clients' data, built once per run (the labels are fixed during a run)."""
    key = (id(train), labels is None, max_items_per_user, seed)
    if state.get("key") != key:
      values = np.zeros(len(train)) if labels is None else labels
      state["key"], state["data"] = key, client_datasets(train, values, max_items_per_user, seed)
    return state["data"]

  def counts(train, num_items, max_items_per_user, noise_multiplier, seed, noise_rng):
    state["max_items_per_user"], state["seed"] = max_items_per_user, seed
    data = clients(train, None, max_items_per_user, seed)
    # The same draw as statistics.noisy_item_counts: std σ_c √cap, one N(0, 1) per item.
    noise = noise_multiplier * np.sqrt(max_items_per_user) * noise_rng.standard_normal(num_items)
    return np.asarray(counts_computation(num_items)(data, noise))

  def stats(item_vectors, train, num_users, counts, hyper, noise_multiplier, noise, labels):
    del num_users  # each client knows only itself
    data = clients(train, labels, state.get("max_items_per_user", 1), state.get("seed", 0))
    s_a, s_b = statistics.sensitivities(1.0, hyper.clip_user, hyper.clip_label)
    m, d = item_vectors.shape
    compute = statistics_computation(m, d, hyper.reg_user, hyper.clip_user, hyper.clip_label)
    a, b = compute(
      np.asarray(item_vectors, np.float64),
      np.asarray(counts, np.float64),
      data,
      {"a": noise_multiplier * s_a * noise.a, "b": noise_multiplier * s_b * noise.b},
    )
    return statistics.Statistics(np.asarray(a), np.asarray(b))

  return Releaser(counts, stats)
