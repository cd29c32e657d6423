"""Adaptive clipping in TensorFlow: round t's noisy count and the next clip norm, for both paths.

One concept: one step of quantile-based adaptive clipping (`fedmf.privacy.adaptive_clip`, Andrew et
al. 2021), written once in TF ops and run by the `tff.aggregators` factory (inside its server
computation) and by the training program's server step on the host (`HostAdaptiveClip`, a
tf.function over the same ops), so that both give the same ζ trajectory bit for bit:

  b̃_t     = min(1, max(0, (W_t + s_b·ξ_t) / n_t)),      W_t: clients within ζ_t, n_t: clients
  ζ_{t+1} = ζ_t · exp(−η (b̃_t − γ))                     (ζ unchanged when n_t = 0)

with s_b = z_b / 2 the count noise's standard deviation as trained (z_b the count noise
multiplier, scaled like σ by the papers' cheap simulation) and ξ_t = `fedmf.tff.noise.count_draw`
(seed, t), a pure function of the noise seed and the round: a restored ζ continues bit for bit.
ζ is float64 throughout; b̃_t is NaN in a round without clients.
"""

from __future__ import annotations

import math
import numpy as np
import tensorflow as tf

from fedmf.privacy.adaptive_clip import AdaptiveClip
from fedmf.tff import noise as noise_lib


def next_clip(
  clip: tf.Tensor,
  within: tf.Tensor,
  clients: tf.Tensor,
  draw: tf.Tensor,
  *,
  target_quantile: float,
  learning_rate: float,
  count_stddev: float,
) -> tuple[tf.Tensor, tf.Tensor]:
  """(b̃_t, ζ_{t+1}) from ζ_t, the round's count within ζ_t, its clients and ξ_t (float64)."""
  clip = tf.cast(clip, tf.float64)
  clients = tf.cast(clients, tf.float64)
  noisy = tf.cast(within, tf.float64) + tf.constant(count_stddev, tf.float64) * draw
  # tensorflow_privacy's QuantileEstimatorQuery clamps the noisy fraction to [0, 1] likewise.
  fraction = tf.clip_by_value(noisy / tf.maximum(clients, 1.0), 0.0, 1.0)
  some = clients > 0.0
  step = tf.where(some, tf.constant(learning_rate, tf.float64) * (fraction - target_quantile), 0.0)
  new_clip = clip * tf.exp(-step)
  return tf.where(some, fraction, tf.constant(math.nan, tf.float64)), new_clip


def clip_step(clip: AdaptiveClip, count_stddev: float):
  """`step(seed, round, ζ_t, within, clients) -> (b̃_t, ζ_{t+1})` with the clip's γ, η and s_b."""
  gamma, eta, std = float(clip.target_quantile), float(clip.learning_rate), float(count_stddev)

  def step(seed, round_index, value, within, clients):
    return next_clip(
      value,
      within,
      clients,
      noise_lib.count_draw(seed, round_index),
      target_quantile=gamma,
      learning_rate=eta,
      count_stddev=std,
    )

  return step


def count_stddev(count_noise_multiplier: float, scale: float = 1.0) -> float:
  """s_b = z_b / 2 (the centred report's sensitivity is ½), times the cheap simulation's scale."""
  return 0.5 * float(count_noise_multiplier) * float(scale)


class HostAdaptiveClip:
  """ζ on the host: the training program's adaptive clip, the factory's ζ for the same seed.

  `value` is ζ_t, the clip of the next round (np.float64); `update(t, within, clients)` releases
  round t's noisy fraction b̃_t (returned) and moves `value` to ζ_{t+1}. `state()`/`restore()`
  give and take ζ for checkpoints.
  """

  def __init__(self, clip: AdaptiveClip, seed_key: np.ndarray, count_stddev_value: float):
    self.clip = clip
    self.value = np.float64(clip.initial)
    self._seed = tf.constant(seed_key, tf.int64)
    step = clip_step(clip, count_stddev_value)
    self._step = tf.function(step, autograph=False)

  def update(self, round_index: int, within: int, clients: int) -> float:
    fraction, new = self._step(
      self._seed,
      tf.constant(round_index, tf.int64),
      tf.constant(self.value, tf.float64),
      tf.constant(within, tf.int64),
      tf.constant(clients, tf.int64),
    )
    self.value = np.float64(new.numpy())
    return float(fraction.numpy())

  def state(self) -> np.float64:
    return np.float64(self.value)

  def restore(self, value) -> None:
    self.value = np.float64(value)
