"""Parameter counts, token layout, masked metric/loss, and FastLSTM == Keras LSTM."""

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.learning.models import keras_utils  # noqa: F401 (TFF's layout)
from tensorflow_federated.python.simulation.baselines import keras_metrics
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import (
  word_prediction_preprocessing as so_pre,
)

from fedmf.tasks import models
from fedmf.tasks import model_sizes


def _keras_reference(preset, vocab_size):
  """TFF's own StackOverflow model builder with the preset's sizes (Keras LSTM)."""
  spec = model_sizes.PRESETS[preset]
  return word_prediction_models.create_recurrent_model(
    vocab_size=model_sizes.num_classes(vocab_size),
    embedding_size=spec.embedding_size,
    num_lstm_layers=1,
    lstm_size=spec.lstm_size,
    shared_embedding=False,
  )


def test_lstm_paper_params():
  assert _keras_reference('lstm-paper', 10_000).count_params() == 4_050_748
  assert models.build_keras_model('lstm-paper', 10_000, 20).count_params() == 4_050_748
  assert model_sizes.count_params('lstm-paper', 10_000) == 4_050_748


def test_excluded_tokens_and_masks():
  v = 10_000
  t = so_pre.get_special_tokens(v, num_out_of_vocab_buckets=1)
  assert (
    models.excluded_tokens(v)
    == [t.padding, *t.out_of_vocab, t.beginning_of_sentence, t.end_of_sentence]
    == [0, 10_001, 10_002, 10_003]
  )
  m = models.build_keras_model('lstm-small', 20, 20)
  x = np.array([[22, 5, 6, 23, 0, 0]])
  y = np.array([[5, 6, 23, 0, 0, 0]])
  x = np.pad(x, ((0, 0), (0, 14)))
  y = np.pad(y, ((0, 0), (0, 14)))
  logits = m(x)
  ce = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)[0]
  assert np.isclose(float(models.loss_fn()(y, logits)), float(tf.reduce_mean(ce[:4])), rtol=1e-5)
  acc = keras_metrics.MaskedCategoricalAccuracy(masked_tokens=models.excluded_tokens(20))
  acc.update_state(y, tf.one_hot(y, 24) * 10.0)
  assert float(acc.result()) == 1.0 and float(acc.count) == 2.0  # only the words 5 and 6


def test_evaluator_agrees_with_tff_masked_accuracy_and_keras_loss():
  rng = np.random.default_rng(1)
  seq = np.zeros((40, 21), np.int32)
  for r in range(40):
    n = int(rng.integers(2, 22))
    seq[r, :n] = rng.integers(1, 24, n)
  x, y = seq[:, :-1], seq[:, 1:]
  ev = models.Evaluator('lstm-small', 20, 20, x, y, batch_size=16)
  weights = models.initial_weights('lstm-small', 20, 20, seed=3)
  got = ev(weights)
  m = models.build_keras_model('lstm-small', 20, 20)
  m.set_weights(weights)
  logits = m(x)
  acc = keras_metrics.MaskedCategoricalAccuracy(masked_tokens=models.excluded_tokens(20))
  acc.update_state(y, logits)
  assert (
    got['accuracy'] == np.float32(acc.result()) or abs(got['accuracy'] - float(acc.result())) < 1e-6
  )
  assert abs(got['loss'] - float(models.loss_fn()(y, logits))) < 1e-5


def test_fast_lstm_matches_keras():
  tf.random.set_seed(0)
  keras_m = _keras_reference('lstm-small', 46)
  fast_m = models.build_keras_model('lstm-small', 46, 20)
  fast_m.set_weights(keras_m.get_weights())
  rng = np.random.default_rng(0)
  seq = np.zeros((5, 21), np.int64)
  for r, n in enumerate([21, 3, 10, 1, 15]):
    seq[r, :n] = rng.integers(1, 50, n)
  x, y = seq[:, :-1], seq[:, 1:]
  out = []
  for m in (keras_m, fast_m):
    with tf.GradientTape() as tape:
      loss = models.loss_fn()(y, m(x))
    out.append(
      (
        float(loss),
        [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, m.trainable_variables)],
      )
    )
  assert abs(out[0][0] - out[1][0]) < 1e-6
  for a, b in zip(out[0][1], out[1][1]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
