"""The DP mean's arithmetic, one definition for the TFF aggregator (`fedmf.tff.aggregators`), the
host noise (`fedmf.tff.host_noise`) and the program's server step (`fedmf.program.server`), so that
all three give the same bits for the same seed.

  mean_i = (Σ clipped updates + ζ·σ·[C⁻¹ z]_i) × float32(1/B)       (BandMF Alg. 1; BLT Eq. 1)

The seed: `draw_noise_seed` (the one drawer, from OS randomness) and `seed_key` (the stateless
RNG's int64[2] key of a seed in [0, 2^64)); the arguments (ζ, ζσ, B) checked once
(`dp_mean_arguments`); the mean in TF (`noised_mean`) and in numpy (`noised_mean_numpy`), with the
same operations in the same order; the finite guard that stops training in the round where the
mean stops being finite (`guarded`).
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.errors import FedmfUserError


MAX_NOISE_SEED = 2**64 - 1


def draw_noise_seed() -> int:
  """A secret seed in [0, 2^64) from OS randomness (`os.urandom`): the one seed drawer of the
  aggregator, the host noise and the training program, when no noise_seed is given."""
  return int.from_bytes(os.urandom(8), 'little')


def seed_key(seed: int) -> np.ndarray:
  """The int64[2] key of the stateless RNG for a seed in [0, 2^64): its low 63 bits, then its top bit.

  Distinct seeds give distinct keys. Anything else is refused: an integer beyond 64 bits used to
  be reduced to a key shared with a small seed (2**130 gave the noise of seed 0).
  """
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
    raise FedmfUserError(
      f'noise_seed must be an integer in [0, 2^64), got {type(seed).__name__} {str(seed)[:40]!r}'
    )
  seed = int(seed)
  if not 0 <= seed <= MAX_NOISE_SEED:
    shown = str(seed) if seed.bit_length() <= 128 else f'an integer of {seed.bit_length()} bits'
    raise FedmfUserError(f'noise_seed must be an integer in [0, 2^64), got {shown}')
  return np.array([seed & ((1 << 63) - 1), seed >> 63], np.int64)


def _finite_number(value: Any, name: str, *, positive: bool) -> float:
  """`value` as a float, refusing non-numbers (a string, a bool) and non-finite or out-of-range values."""
  bound = '> 0' if positive else '>= 0'
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise FedmfUserError(
      f'{name} must be a finite number {bound}, got {type(value).__name__} {str(value)[:40]!r}'
    )
  number = float(value)
  if not np.isfinite(number) or not (number > 0.0 if positive else number >= 0.0):
    raise FedmfUserError(f'{name} must be a finite number {bound}, got {value}')
  return number


def dp_mean_arguments(
  noise_multiplier: Any, clip_norm: Any, clients_per_round: Any
) -> tuple[float, float, float]:
  """(ζ, ζσ, B) of a DP mean, each checked to be a finite number (ζ, B > 0; σ >= 0)."""
  sigma = _finite_number(noise_multiplier, 'noise_multiplier', positive=False)
  clip = _finite_number(clip_norm, 'clip_norm', positive=True)
  cpr = _finite_number(clients_per_round, 'clients_per_round', positive=True)
  return clip, clip * sigma, cpr


def noised_mean(flat_sum: list, unit_noise: list, scale: float, cpr: float) -> list:
  """Steps 2-3: (Σ clipped + ζσ·[C⁻¹ z]_i) × float32(1/B) per tensor (BandMF Alg. 1; BLT Eq. 1).

  × float32(1/B), not ÷ B: TF's graph optimizer rewrites a division by a constant into this
  multiplication anyway, and writing it so gives the same bits here, in eager TF and in numpy
  (the host server step, fedmf.program.server). `scale` (ζσ) is a Python float, or a float64
  tensor ζ_t·σ under adaptive clipping (`fedmf.tff.dp_process`); either is rounded once to the
  sum's dtype.
  """
  return [
    (t + tf.cast(scale, t.dtype) * z) * tf.cast(1.0 / cpr, t.dtype)
    for t, z in zip(flat_sum, unit_noise)
  ]


def all_finite(tensors: list[tf.Tensor]) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def guarded(mean: list, noises: list, flat: list, round_index, clip) -> list:
  """The mean, after asserting that the noise, the sum and the mean are finite: training stops
  in the round where one stops being finite (an overflowing sum of huge updates, σ·ζ beyond
  float32, a stream that overflows), never after. Non-finite client updates were zeroed before."""
  finite_noise, finite_sum, finite_mean = all_finite(noises), all_finite(flat), all_finite(mean)
  guard = tf.debugging.Assert(
    tf.logical_and(finite_mean, tf.logical_and(finite_noise, finite_sum)),
    [
      'fedmf: round',
      round_index,
      '(0-based): the noised mean is not finite; training stopped. Finite noise:',
      finite_noise,
      'finite clipped sum:',
      finite_sum,
      '(check noise_multiplier, clip_norm and clients_per_round; the clipped sum is at most',
      clip if tf.is_tensor(clip) else tf.constant(clip),
      'times the number of clients).',
    ],
  )
  with tf.control_dependencies([guard]):
    return [tf.identity(m) for m in mean]


def flatten(value: Any) -> list:
  """The tensors of a TFF value (a `tff.structure.Struct` or a nest), in order."""
  if isinstance(value, tff.structure.Struct):
    return tff.structure.flatten(value)
  return tf.nest.flatten(value)


def noised_mean_numpy(
  clipped_sum: Sequence[np.ndarray],
  unit_noise: Optional[Sequence[np.ndarray]],
  scale: float,
  cpr: float,
) -> list[np.ndarray]:
  """`noised_mean` in numpy (float32): (Σ clipped + ζσ·noise) × float32(1/B), the same bits.

  No noise (None, or ζσ = 0) gives the plain mean.
  """
  inverse = np.float32(1.0 / cpr)
  mean = []
  for k, s in enumerate(clipped_sum):
    m = np.array(s, dtype=np.float32)
    if unit_noise is not None and scale:
      m += np.float32(scale) * unit_noise[k]
    m *= inverse
    mean.append(m)
  return mean
