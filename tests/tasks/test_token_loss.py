"""The token cross-entropy against closed forms, finite differences and TF's fused kernel.

`fedmf.tasks.token_loss` replaces `tf.nn.sparse_softmax_cross_entropy_with_logits` in the models'
loss and loss metric; these tests bound the float difference that change makes, down to a client's
training on the same data.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from fedmf.tasks import models
from fedmf.tasks.token_loss import (
  SparseCrossEntropy,
  SparseCrossEntropyMetric,
  sparse_cross_entropy,
)


def _fused(labels, logits):
  return tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)


def test_closed_form():
  # softmax([0, ln 3]) = [1/4, 3/4]: the losses are ln 4 and ln 4/3.
  logits = tf.constant([[0.0, math.log(3.0)], [0.0, math.log(3.0)]], tf.float64)
  got = sparse_cross_entropy(tf.constant([0, 1]), logits).numpy()
  np.testing.assert_allclose(got, [math.log(4.0), math.log(4.0 / 3.0)], rtol=1e-14)


def test_gradient_matches_finite_differences():
  rng = np.random.default_rng(0)
  logits = tf.constant(rng.normal(size=(5, 7)) * 3.0, tf.float64)
  labels = tf.constant(rng.integers(0, 7, size=5), tf.int32)
  weights = tf.constant(rng.uniform(0.5, 2.0, size=5), tf.float64)  # a non-uniform upstream

  theoretical, numerical = tf.test.compute_gradient(
    lambda z: tf.reduce_sum(weights * sparse_cross_entropy(labels, z)), [logits]
  )
  np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-7)


@pytest.mark.parametrize("scale, shift", [(1.0, 0.0), (40.0, 0.0), (3.0, 1e4)])
def test_matches_tf_kernel_loss_and_gradient(scale, shift):
  # Large spreads (scale 40: softmax ≈ onehot, exp underflows) and a large common shift.
  rng = np.random.default_rng(1)
  logits = tf.constant(rng.normal(size=(4, 20, 1004)) * scale + shift, tf.float32)
  labels = tf.constant(rng.integers(0, 1004, size=(4, 20)), tf.int32)
  upstream = tf.constant(rng.uniform(0.0, 1.0, size=(4, 20)), tf.float32)

  def loss_and_grad(fn):
    with tf.GradientTape() as tape:
      tape.watch(logits)
      loss = fn(labels, logits)
      total = tf.reduce_sum(loss * upstream)
    return loss.numpy(), tape.gradient(total, logits).numpy()

  loss, grad = loss_and_grad(sparse_cross_entropy)
  ref_loss, ref_grad = loss_and_grad(_fused)
  assert np.all(np.isfinite(loss)) and np.all(np.isfinite(grad))
  # A few float32 ulps of the loss's magnitude (rounding of a sum over 1,004 classes).
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad, ref_grad, atol=1e-6)


def test_refuses_labels_outside_the_classes():
  logits = tf.zeros([2, 5])
  with pytest.raises(tf.errors.InvalidArgumentError):
    sparse_cross_entropy(tf.constant([0, 5]), logits)


def _model_and_batch(preset="lstm-small", vocab=50, length=8):
  rng = np.random.default_rng(2)
  x = rng.integers(1, vocab + 1, size=(6, length)).astype(np.int32)
  x[:, 5:] = 0  # post-padding, as TFF's padded_batch: the embedding's mask hides these positions
  x[0, 2:] = 0
  y = rng.integers(1, vocab + 1, size=(6, length)).astype(np.int32)
  tf.keras.utils.set_random_seed(3)
  return models.build_keras_model(preset, vocab, length), tf.constant(x), tf.constant(y)


def test_masked_loss_and_metric_match_keras():
  model, x, y = _model_and_batch()
  logits = model(x)
  keras_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, logits)
  ours = SparseCrossEntropy()(y, logits)
  np.testing.assert_allclose(float(ours), float(keras_loss), rtol=1e-6)
  # The mask is applied: the mean over the 2 + 5 × 5 = 27 unpadded positions only.
  per_token = sparse_cross_entropy(y, logits).numpy()
  unpadded = (x.numpy() != 0).astype(np.float64)
  expected = (per_token * unpadded).sum() / unpadded.sum()
  assert unpadded.sum() == 27
  np.testing.assert_allclose(float(ours), expected, rtol=1e-6)
  assert abs(float(ours) - per_token.mean()) > 1e-4  # ... which differs from the unmasked mean

  keras_metric = tf.keras.metrics.SparseCategoricalCrossentropy(from_logits=True)
  metric = SparseCrossEntropyMetric()
  for m in (keras_metric, metric):
    m.update_state(y, logits)
    m.update_state(y[:3], model(x[:3]))
  np.testing.assert_allclose(float(metric.result()), float(keras_metric.result()), rtol=1e-6)


def test_a_clients_training_stays_within_float_rounding_of_the_fused_kernel():
  """Eight SGD steps of a client from the same weights on the same data, with the fused kernel and
  with this module's loss: the weights may drift apart by float rounding only."""
  model, x, y = _model_and_batch("lstm-paper", vocab=200, length=20)
  start = [w.numpy() for w in model.trainable_weights]
  keras_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def train(loss_fn):
    for w, value in zip(model.trainable_weights, start):
      w.assign(value)
    for step in range(8):
      batch = slice(step % 3, step % 3 + 4)
      with tf.GradientTape() as tape:
        loss = loss_fn(y[batch], model(x[batch], training=True))
      grads = tape.gradient(loss, model.trainable_weights)
      for w, g in zip(model.trainable_weights, grads):
        w.assign_sub(0.5 * tf.convert_to_tensor(g))
    return [w.numpy() for w in model.trainable_weights]

  fused = train(keras_loss)
  ours = train(models.loss_fn())
  moved = sum(float(np.sum((f - s) ** 2)) for f, s in zip(fused, start)) ** 0.5
  apart = sum(float(np.sum((f - o) ** 2)) for f, o in zip(fused, ours)) ** 0.5
  assert moved > 1e-2  # the client did train
  # Rounding differences only: far below the update itself (measured: about 1e-7 of it).
  assert apart <= 1e-4 * moved, (apart, moved)
