"""Token cross-entropy over the vocabulary, with a cheaper kernel than TF's fused one.

One concept: the loss of next-word prediction, -log softmax(logits)[label] per token, and its
gradient softmax(logits) - onehot(label) (the standard softmax cross-entropy gradient; e.g.
Goodfellow et al., Deep Learning, §6.2.2.3), written as separate TF ops under a custom gradient.

Why not `tf.nn.sparse_softmax_cross_entropy_with_logits`: on CPU its kernel
(`SparseSoftmaxXentWithLogitsOp`) is slow. On `lstm-paper`'s output layer ([320, 96] x
[96, 10004], 1 thread), the forward matmul with it took 42 ms, against 14 ms with `tf.nn.softmax`,
and TFF's client loop runs it twice per batch (the loss, and the loss metric on the same logits).
Here the forward pass is a row max, one exp, a row sum and a log, and the backward pass reuses
the exps: the layer's forward + backward took 32 instead of 54 ms
(benchmarks/token_loss_benchmark.py, docs/benchmarks.md §4).

The math is the same; float rounding differs by a few ulps (tests/tasks/test_token_loss.py bounds
it against TF's kernel, for the loss, its gradient and a client's training).
"""

from __future__ import annotations

import tensorflow as tf


@tf.custom_gradient
def _cross_entropy_rows(logits, labels):
  """Per-row -log softmax(logits)[label] of [N, C] logits and [N] int labels."""
  # Shifting by the row max keeps exp finite (the usual log-sum-exp stabilization).
  shifted = logits - tf.reduce_max(logits, axis=-1, keepdims=True)
  exps = tf.exp(shifted)
  sums = tf.reduce_sum(exps, axis=-1, keepdims=True)
  loss = tf.math.log(sums[:, 0]) - tf.gather(shifted, labels, axis=1, batch_dims=1)
  rows = tf.stack([tf.range(tf.shape(labels)[0], dtype=labels.dtype), labels], axis=1)

  def grad(upstream):
    # d loss / d logits = softmax - onehot(label), scaled by the upstream gradient per row.
    softmax_scaled = exps * (upstream[:, None] / sums)
    return tf.tensor_scatter_nd_sub(softmax_scaled, rows, upstream), None

  return loss, grad


def sparse_cross_entropy(labels, logits):
  """-log softmax(logits)[labels] elementwise: labels [...] int, logits [..., C] float.

  Equals `tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)` up
  to float rounding. Labels outside [0, C) are refused by the gather (InvalidArgumentError)."""
  logits = tf.convert_to_tensor(logits)
  labels = tf.cast(tf.convert_to_tensor(labels), tf.int32)
  classes = tf.shape(logits)[-1]
  loss = _cross_entropy_rows(tf.reshape(logits, [-1, classes]), tf.reshape(labels, [-1]))
  return tf.reshape(loss, tf.shape(labels))


class SparseCrossEntropy(tf.keras.losses.Loss):
  """`tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)` on `sparse_cross_entropy`.

  `Loss.__call__` does the rest as before: the embedding's pad mask, and the mean over the
  unmasked positions."""

  def __init__(self, name: str = "sparse_cross_entropy"):
    super().__init__(name=name)

  def call(self, y_true, y_pred):
    return sparse_cross_entropy(y_true, y_pred)


class SparseCrossEntropyMetric(tf.keras.metrics.MeanMetricWrapper):
  """`tf.keras.metrics.SparseCategoricalCrossentropy(from_logits=True)` on `sparse_cross_entropy`
  (the mean over unmasked positions, as Keras' metric)."""

  def __init__(self, name: str = "loss"):
    super().__init__(sparse_cross_entropy, name=name)
