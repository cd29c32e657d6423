"""A federated learning task: train data per client, test data, a model, an evaluation.

One concept: what `fedmf simulate` and `fedmf train` train on. A `Task` gives
  * the training population, indexed 0..num_clients-1 (the participation models draw indices),
    with each client's id (the unit of privacy, written to the participation log) and its data,
    built lazily when the client is in a cohort, so memory does not grow with the population;
  * a held-out test set;
  * the model (`model_fn` for TFF, and the Keras builder for evaluation on the host).

`ArrayTask` serves tasks whose clients are (x, y) token arrays (the built-in synthetic data and
StackOverflow). A user's own data and model plug in by subclassing `Task` (see
docs/simulation.md, "Your own data and model").
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from fedmf.tasks import models
from fedmf.tff import client_data


class Task(abc.ABC):
  """The interface the training loop uses."""

  name: str = ""
  #: Printed next to every accuracy (which tokens it excludes, etc.).
  accuracy_note: str = ""

  @property
  @abc.abstractmethod
  def num_clients(self) -> int:
    """The training population."""

  @abc.abstractmethod
  def client_id(self, index: int) -> str:
    """The id of client `index` (the unit of privacy in the participation log)."""

  @abc.abstractmethod
  def client_dataset(self, index: int) -> tf.data.Dataset:
    """Client `index`'s training data, preprocessed and batched (one local epoch)."""

  @abc.abstractmethod
  def model_fn(self) -> Callable[[], Any]:
    """A no-argument callable returning a `tff.learning.models.VariableModel`."""

  def functional_model(self) -> Optional[Any]:
    """Optionally, the same model as a `tff.learning.models.FunctionalModel` (None: use
    `model_fn`). Preferred when given: its graphs hold no variables, and TFF's worker trains it
    with less fixed cost per client."""
    return None

  @abc.abstractmethod
  def initial_weights(self, seed: int) -> list[np.ndarray]:
    """The model's initial trainable weights (the order of `model_fn`'s trainable weights)."""

  @abc.abstractmethod
  def evaluate(self, weights: list[np.ndarray]) -> dict[str, float]:
    """{'accuracy': ..., 'loss': ...} of `weights` on the held-out test set."""

  def describe(self) -> dict[str, Any]:
    return {"task": self.name, "clients": self.num_clients}


class ArrayTask(Task):
  """A next-word task whose clients are (x, y) int token arrays [sentences, sequence_length]."""

  accuracy_note = models.ACCURACY_NOTE

  def __init__(
    self,
    *,
    preset: str,
    vocab_size: int,
    sequence_length: int,
    batch_size: int,
    max_sentences: int,
    test_sentences: int,
    seed: int,
  ):
    self.preset = preset
    self.vocab_size = int(vocab_size)
    self.sequence_length = int(sequence_length)
    self.batch_size = int(batch_size)
    self.max_sentences = int(max_sentences)
    self.test_sentences = int(test_sentences)
    self.seed = int(seed)
    self._evaluator = None

  @abc.abstractmethod
  def client_arrays(self, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of client `index`, at most `max_sentences` rows."""

  @abc.abstractmethod
  def test_arrays(self) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the held-out test set."""

  def client_dataset(self, index: int) -> tf.data.Dataset:
    x, y = self.client_arrays(index)
    batches = tf.data.Dataset.from_tensor_slices((x.astype(np.int32), y.astype(np.int32)))
    return client_data.worker_dataset(batches.batch(self.batch_size))

  def model_fn(self):
    return models.tff_model_fn(self.preset, self.vocab_size, self.sequence_length)

  def functional_model(self):
    """The same model as a TFF FunctionalModel (the federated part's preferred form)."""
    return models.tff_functional_model(self.preset, self.vocab_size, self.sequence_length)

  def initial_weights(self, seed: int) -> list[np.ndarray]:
    return models.initial_weights(self.preset, self.vocab_size, self.sequence_length, seed)

  def evaluate(self, weights):
    if self._evaluator is None:
      x, y = self.test_arrays()
      self._evaluator = models.Evaluator(self.preset, self.vocab_size, self.sequence_length, x, y)
    return self._evaluator(weights)

  def describe(self):
    return {
      **super().describe(),
      **models.describe(self.preset, self.vocab_size),
      "sequence_length": self.sequence_length,
      "batch_size": self.batch_size,
      "max_sentences_per_client": self.max_sentences,
    }
