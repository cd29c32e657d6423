"""An LSTM layer with Keras' math and weights but a cheaper backward pass (`lstm-*` models).

Keras 2.14 `LSTM` on CPU (`keras/src/layers/rnn/lstm.py: standard_lstm`) runs
`backend.rnn` (a `tf.while_loop`) whose step does both `x_t @ kernel` and
`h_{t-1} @ recurrent_kernel` at batch 16, and autodiff then accumulates the
weight gradients step by step. Here (same gate order i, f, c, o; sigmoid /
tanh; same initializers, `unit_forget_bias`):

* the input projection is one [B*T, E] x [E, 4H] matmul before the loop;
* the backward pass (`tf.custom_gradient`) runs only `dz_t @ U^T` per step
  and forms dW, dU, db and dx as single [B*T]-row matmuls afterwards.

The mask from `Embedding(mask_zero=True)` is passed through unchanged for the
loss, but not applied inside the recurrence. With post-padding (TFF's
`padded_batch`) masked steps only follow the real tokens, so every unmasked
output, hence the masked loss and its gradients, equals Keras'. Outputs at
padded steps differ (Keras writes zeros) but carry zero loss weight.
"""

from __future__ import annotations

import tensorflow as tf


def _gates(z, c_prev):
  i, f, g, o = tf.split(z, 4, axis=-1)
  i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
  c = f * c_prev + i * g
  tc = tf.tanh(c)
  return i, f, g, o, c, tc, o * tc


@tf.custom_gradient
def lstm_sequence(x, kernel, recurrent_kernel, bias):
  """[B, T, E] -> [B, T, H] hidden states; T must be static."""
  steps = x.shape[1]
  if steps is None:
    raise ValueError('FastLSTM needs a static sequence length (e.g. [None, 20])')
  batch = tf.shape(x)[0]
  units = recurrent_kernel.shape[0]
  emb = kernel.shape[0]
  z_in = tf.reshape(tf.matmul(tf.reshape(x, [-1, emb]), kernel) + bias, [batch, steps, 4 * units])
  h = c = tf.zeros([batch, units], x.dtype)
  saved, hs = [], []
  for t in range(steps):
    z = z_in[:, t] + tf.matmul(h, recurrent_kernel)
    c_prev, h_prev = c, h
    i, f, g, o, c, tc, h = _gates(z, c_prev)
    saved.append((i, f, g, o, c_prev, tc, h_prev))
    hs.append(h)
  out = tf.stack(hs, axis=1)

  def grad(d_out):
    dh_next = dc_next = tf.zeros([batch, units], x.dtype)
    dzs = [None] * steps
    for t in reversed(range(steps)):
      i, f, g, o, c_prev, tc, _ = saved[t]
      dh = d_out[:, t] + dh_next
      dc = dh * o * (1.0 - tc * tc) + dc_next
      dz = tf.concat(
        [
          dc * g * i * (1.0 - i),
          dc * c_prev * f * (1.0 - f),
          dc * i * (1.0 - g * g),
          dh * tc * o * (1.0 - o),
        ],
        axis=-1,
      )
      dzs[t] = dz
      dc_next = dc * f
      dh_next = tf.matmul(dz, recurrent_kernel, transpose_b=True)
    dz_all = tf.reshape(tf.stack(dzs, axis=1), [-1, 4 * units])
    h_prev_all = tf.reshape(tf.stack([s[6] for s in saved], axis=1), [-1, units])
    x_all = tf.reshape(x, [-1, emb])
    dx = tf.reshape(tf.matmul(dz_all, kernel, transpose_b=True), tf.shape(x))
    d_kernel = tf.matmul(x_all, dz_all, transpose_a=True)
    d_recurrent = tf.matmul(h_prev_all, dz_all, transpose_a=True)
    d_bias = tf.reduce_sum(dz_all, axis=0)
    return dx, d_kernel, d_recurrent, d_bias

  return out, grad


class FastLSTM(tf.keras.layers.Layer):
  """Drop-in for `tf.keras.layers.LSTM(units, return_sequences=True)`."""

  def __init__(self, units: int, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.supports_masking = True

  def build(self, input_shape):
    emb, h = int(input_shape[-1]), self.units
    self.kernel = self.add_weight('kernel', [emb, 4 * h], initializer='glorot_uniform')
    self.recurrent_kernel = self.add_weight(
      'recurrent_kernel', [h, 4 * h], initializer='orthogonal'
    )

    def bias_init(shape, dtype=None):
      return tf.concat([tf.zeros([h]), tf.ones([h]), tf.zeros([2 * h])], 0)

    self.bias = self.add_weight('bias', [4 * h], initializer=bias_init)

  def call(self, inputs, mask=None):
    del mask  # post-padding: see module docstring
    return lstm_sequence(inputs, self.kernel, self.recurrent_kernel, self.bias)

  def compute_mask(self, inputs, mask=None):
    return mask

  def get_config(self):
    return {**super().get_config(), 'units': self.units}
