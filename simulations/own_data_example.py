#!/usr/bin/env python3
"""Your own federated data and model in fedmf's simulation (docs/simulation.md).

A `fedmf.tasks.Task` is four things: the population (client ids), each client's training data as a
`tf.data.Dataset` (built when the client is in a cohort), a TFF `model_fn`, and an evaluation. This
example wraps a `tff.simulation.datasets.ClientData` (any of TFF's, or your own) and a small Keras
classifier, then runs the same loop as `fedmf simulate`: a client timer, BLT noise calibrated for a
target epsilon, the participation log, and the audit at the end.

  python simulations/own_data_example.py --out out/own-data [--set rounds=40 ...]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def make_client_data(num_clients: int, examples: int, dim: int, classes: int, seed: int):
  """Non-IID toy classification clients as a tff.simulation ClientData (stand-in for yours)."""
  import tensorflow_federated as tff

  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim, classes))
  data = {}
  for i in range(num_clients):
    x = (rng.normal(size=(examples, dim)) + rng.normal(size=(1, dim))).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.normal(size=(examples, classes)), axis=1).astype(np.int32)
    data[f"user-{i:04d}"] = {"x": x, "y": y}
  return tff.simulation.datasets.TestClientData(data), w


class ClientDataTask:
  """A fedmf Task over a ClientData and a Keras model (duck-types `fedmf.tasks.Task`)."""

  name = "own-data"
  accuracy_note = "accuracy on a pooled held-out set"

  def __init__(self, client_data, dim: int, classes: int, test_x, test_y, batch_size: int = 16):
    self.client_data = client_data
    self.ids = sorted(client_data.client_ids)
    self.dim, self.classes, self.batch_size = dim, classes, batch_size
    self.test_x, self.test_y = test_x, test_y

  @property
  def num_clients(self) -> int:
    return len(self.ids)

  def client_id(self, index: int) -> str:
    return self.ids[int(index)]

  def client_dataset(self, index: int):
    dataset = self.client_data.create_tf_dataset_for_client(self.client_id(index))
    return dataset.map(lambda e: (e["x"], e["y"])).batch(self.batch_size)

  def keras_model(self):
    import tensorflow as tf

    return tf.keras.Sequential(
      [tf.keras.layers.InputLayer(input_shape=(self.dim,)), tf.keras.layers.Dense(self.classes)]
    )

  def model_fn(self):
    import tensorflow as tf
    import tensorflow_federated as tff

    def model_fn():
      return tff.learning.models.from_keras_model(
        self.keras_model(),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        input_spec=(tf.TensorSpec([None, self.dim], tf.float32), tf.TensorSpec([None], tf.int32)),
      )

    return model_fn

  def initial_weights(self, seed: int):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    return [np.asarray(w, np.float32) for w in self.keras_model().get_weights()]

  def evaluate(self, weights):
    kernel, bias = weights
    logits = self.test_x @ kernel + bias
    return {"accuracy": float(np.mean(np.argmax(logits, 1) == self.test_y)), "loss": float("nan")}

  def describe(self):
    return {"task": self.name, "clients": self.num_clients}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  args = parser.parse_args(argv)

  from fedmf.config_parse import give_way
  from fedmf.program.config import load_config
  from fedmf.program.simulate import run_simulation

  dim, classes = 10, 4
  client_data, w = make_client_data(300, 32, dim, classes, seed=0)
  rng = np.random.default_rng(1)
  test_x = rng.normal(size=(2000, dim)).astype(np.float32)
  test_y = np.argmax(test_x @ w, axis=1)
  task = ClientDataTask(client_data, dim, classes, test_x, test_y)
  # The example's settings, each replaced by the user's --set of the same key.
  defaults = [
    "rounds=40",
    "clients_per_round=10",
    "num_clients=300",
    "target_epsilon=8",
    "reference_clients_per_round=100",
    "client_learning_rate=0.1",
    "participation.min_sep=10",
    "eval_every=10",
  ]
  config = load_config(None, give_way(defaults, args.overrides))
  summary = run_simulation(config, args.out, task=task, force=True)
  print(
    f"accuracy {summary['initial_test_accuracy']:.3f} -> {summary['final_test_accuracy']:.3f}; "
    f"audited epsilon {summary['audit']['epsilon']:.3g}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
