"""Next-word prediction models, their masked accuracy, and evaluation on the host.

One concept: the papers' model (BandMF App. I, BLT §5; TFF's StackOverflow baseline):
embedding → LSTM → projection → logits over the vocabulary plus pad, bos, eos and one OOV bucket.

* `lstm-paper`: embedding 96, LSTM 670, projection 96: 4,050,748 parameters at 10,000 words.
* `lstm-small`: embedding 32, LSTM 128, projection 32, for CPU runs.

The LSTM is `FastLSTM` (same weights and gates as Keras' LSTM, same loss and gradients on
post-padded data, 25% cheaper under TFF). Token ids follow TFF's layout
(`word_prediction_preprocessing.get_special_tokens`): pad 0, words 1..V, OOV V+1, bos V+2, eos V+3.
**Accuracy excludes pad, OOV, bos and eos**, as the papers report it (TFF's
`accuracy_without_out_of_vocab_or_end_of_sentence`; bos never occurs as a label). The loss is the
mean token cross-entropy over positions whose input is not pad.
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from fedmf.tasks.fast_lstm import FastLSTM
from fedmf.tasks.model_sizes import PRESETS, count_params, num_classes
from fedmf.tasks.token_loss import (
  SparseCrossEntropy,
  SparseCrossEntropyMetric,
  sparse_cross_entropy,
)

ACCURACY_NOTE = "accuracy excludes pad, OOV, bos and eos tokens, as the papers report it"


def excluded_tokens(vocab_size: int) -> list[int]:
  """Label ids left out of accuracy: pad, OOV, bos, eos."""
  return [0, vocab_size + 1, vocab_size + 2, vocab_size + 3]


def build_keras_model(preset: str, vocab_size: int, sequence_length: int) -> tf.keras.Model:
  """The uncompiled Keras model of a preset (int32 token ids [batch, sequence_length] in)."""
  if preset not in PRESETS:
    raise ValueError(f"model must be one of {', '.join(PRESETS)}, got {preset!r}")
  spec = PRESETS[preset]
  classes = num_classes(vocab_size)
  inputs = tf.keras.layers.Input(shape=(sequence_length,), dtype=tf.int32)
  x = tf.keras.layers.Embedding(classes, spec.embedding_size, mask_zero=True)(inputs)
  x = FastLSTM(spec.lstm_size)(x)
  x = tf.keras.layers.Dense(spec.embedding_size)(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(classes)(x))


def loss_fn() -> tf.keras.losses.Loss:
  """Mean token cross-entropy on logits (Keras applies the embedding's pad mask); TF's fused
  kernel replaced by `token_loss` (same math, 40% cheaper output layer on CPU)."""
  return SparseCrossEntropy()


def input_spec(sequence_length: int):
  return (
    tf.TensorSpec([None, sequence_length], tf.int32),
    tf.TensorSpec([None, sequence_length], tf.int32),
  )


def tff_model_fn(preset: str, vocab_size: int, sequence_length: int):
  """A `model_fn` for tff.learning; training reports only the loss (accuracy is evaluated apart)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  def model_fn():
    return tff.learning.models.from_keras_model(
      build_keras_model(preset, vocab_size, sequence_length),
      loss=loss_fn(),
      input_spec=input_spec(sequence_length),
      metrics=[],
    )

  return model_fn


def tff_functional_model(preset: str, vocab_size: int, sequence_length: int):
  """The model as a `tff.learning.models.FunctionalModel` (no variables in its graphs)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  def metrics():
    # The training loss and example count that `from_keras_model` reports by itself; a
    # FunctionalModel reports only the metrics it is given.
    return collections.OrderedDict(
      loss=SparseCrossEntropyMetric(name="loss"),
      num_examples=tff.learning.metrics.NumExamplesCounter(),
    )

  return tff.learning.models.functional_model_from_keras(
    lambda: build_keras_model(preset, vocab_size, sequence_length),
    loss_fn(),
    input_spec(sequence_length),
    metrics_constructor=metrics,
  )


class Evaluator:
  """Loss and accuracy of given weights on held-out (x, y) arrays, on the host."""

  def __init__(
    self,
    preset: str,
    vocab_size: int,
    sequence_length: int,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = 256,
  ):
    self.model = build_keras_model(preset, vocab_size, sequence_length)
    self._data = (
      tf.data.Dataset.from_tensor_slices((x.astype(np.int32), y.astype(np.int32)))
      .batch(batch_size)
      .cache()
    )
    excluded = tf.constant(excluded_tokens(vocab_size), tf.int32)

    @tf.function
    def batch_stats(bx, by):
      logits = self.model(bx, training=False)
      keep = tf.logical_not(tf.reduce_any(tf.equal(by[..., None], excluded), axis=-1))
      hits = tf.logical_and(keep, tf.equal(tf.argmax(logits, -1, output_type=tf.int32), by))
      inputs_real = tf.cast(bx != 0, tf.float32)
      token_loss = sparse_cross_entropy(by, logits)
      return (
        tf.reduce_sum(tf.cast(hits, tf.float32)),
        tf.reduce_sum(tf.cast(keep, tf.float32)),
        tf.reduce_sum(token_loss * inputs_real),
        tf.reduce_sum(inputs_real),
      )

    self._batch_stats = batch_stats

  def __call__(self, weights: Sequence[np.ndarray]) -> dict[str, float]:
    self.model.set_weights(list(weights))
    hits = counted = loss_sum = positions = 0.0
    for bx, by in self._data:
      h, c, l, p = (float(v) for v in self._batch_stats(bx, by))
      hits, counted, loss_sum, positions = hits + h, counted + c, loss_sum + l, positions + p
    return {"accuracy": hits / max(counted, 1.0), "loss": loss_sum / max(positions, 1.0)}


def trainable_shapes(model: tf.keras.Model) -> list[tuple[int, ...]]:
  return [tuple(int(d) for d in w.shape) for w in model.trainable_weights]


def initial_weights(
  preset: str, vocab_size: int, sequence_length: int, seed: int
) -> list[np.ndarray]:
  """The model's initial trainable weights, deterministic from `seed`."""
  tf.keras.utils.set_random_seed(int(seed) % 2**32)
  model = build_keras_model(preset, vocab_size, sequence_length)
  return [np.asarray(w, np.float32) for w in model.get_weights()]


def weights_are_trainable(model: tf.keras.Model) -> bool:
  """Every weight is trainable (so get_weights order = trainable order)."""
  return len(model.weights) == len(model.trainable_weights)


def describe(preset: str, vocab_size: int) -> dict[str, Any]:
  spec = PRESETS[preset]
  return {
    "model": preset,
    "embedding": spec.embedding_size,
    "lstm": spec.lstm_size,
    "vocab_size": vocab_size,
    "classes": num_classes(vocab_size),
    "parameters": count_params(preset, vocab_size),
  }
