"""A built-in synthetic federated classification dataset (no download).

One concept: heterogeneous clients for quick, honest end-to-end runs. Every client draws features
x ~ N(μ_c, I) around its own centre μ_c and labels y = argmax(W x + noise) from a model W shared by
all clients, so FedAvg has a real signal to learn while clients are non-IID. Data are numpy arrays
generated from a seed; `client_datasets` turns a cohort into `tf.data` datasets for TFF.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SyntheticFederatedData:
  """Per-client features and labels plus a pooled held-out test set."""

  features: np.ndarray  # (num_clients, examples_per_client, dim) float32
  labels: np.ndarray  # (num_clients, examples_per_client) int32
  test_features: np.ndarray
  test_labels: np.ndarray

  @property
  def num_clients(self) -> int:
    return self.features.shape[0]

  @property
  def dim(self) -> int:
    return self.features.shape[2]

  @property
  def num_classes(self) -> int:
    return int(max(self.labels.max(), self.test_labels.max())) + 1

  def client_id(self, index: int) -> str:
    return f"client-{index:06d}"


def make_synthetic_data(
  num_clients: int = 200,
  examples_per_client: int = 32,
  dim: int = 20,
  num_classes: int = 5,
  heterogeneity: float = 1.0,
  label_noise: float = 0.5,
  test_examples: int = 2000,
  seed: int = 0,
) -> SyntheticFederatedData:
  if min(num_clients, examples_per_client, dim, test_examples) < 1 or num_classes < 2:
    raise ValueError("synthetic data needs positive sizes and at least 2 classes")
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim, num_classes)) / np.sqrt(dim)
  centres = heterogeneity * rng.normal(size=(num_clients, 1, dim))
  x = centres + rng.normal(size=(num_clients, examples_per_client, dim))
  y = np.argmax(x @ w * 3.0 + label_noise * rng.normal(size=x.shape[:2] + (num_classes,)), axis=-1)
  test_centres = heterogeneity * rng.normal(size=(test_examples, dim))
  tx = test_centres + rng.normal(size=(test_examples, dim))
  ty = np.argmax(
    tx @ w * 3.0 + label_noise * rng.normal(size=(test_examples, num_classes)), axis=-1
  )
  return SyntheticFederatedData(
    x.astype(np.float32), y.astype(np.int32), tx.astype(np.float32), ty.astype(np.int32)
  )


def client_datasets(data: SyntheticFederatedData, cohort: np.ndarray, batch_size: int = 8) -> list:
  """`tf.data` datasets (one local epoch, batched) for the clients in `cohort`."""
  import tensorflow as tf

  return [
    tf.data.Dataset.from_tensor_slices((data.features[i], data.labels[i])).batch(batch_size)
    for i in cohort
  ]
