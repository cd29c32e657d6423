"""The TensorFlow backend of the noise streams, and the seeded draws that feed them.

Layer 3 of docs/architecture.md. A mechanism's stream is defined once, in `fedmf.mf` against an
array backend (`fedmf.mf.streaming`); `TF_OPS` runs that same definition in TensorFlow, inside
TFF computations (the aggregator) and on the host (the training program). `round_draws` gives the
stream its standard normals: draw j of round t for tensor k is `tf.random.stateless_normal` keyed
by (seed, t, j, k) with the Philox algorithm, so noise is a pure function of (seed, state) and a
restored state continues bit for bit. `count_draw` gives adaptive clipping's count its normal under
the same seed, keyed apart from the model noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from fedmf.mf import strategies as st
from fedmf.mf import streaming

__all__ = ['TF_OPS', 'TfOps', 'round_draws', 'count_draw', 'make_noise_stream', 'horizon_checks']

_RNG_ALG = 'philox'  # Fixed (not 'auto_select') so noise is device independent.

Specs = Sequence[tf.TensorSpec]


class TfOps:
  """TensorFlow implementations of the `fedmf.mf.streaming` backend operations."""

  float64 = tf.float64
  int64 = tf.int64

  @staticmethod
  def zeros(shape, dtype):
    return tf.zeros(shape, dtype)

  @staticmethod
  def constant(value, dtype):
    return tf.constant(value, dtype)

  @staticmethod
  def cast(x, dtype):
    return tf.cast(x, dtype)

  @staticmethod
  def gather(table: np.ndarray, index, dtype):
    return tf.gather(tf.constant(table, dtype), tf.cast(index, tf.int32))

  @staticmethod
  def is_first_round(t, dtype):
    return tf.cast(tf.equal(t, 0), dtype)

  @staticmethod
  def sqrt(x):
    return tf.sqrt(x)

  @staticmethod
  def fori_loop(lower, upper, body: Callable[[Any, Any], Any], carry):
    lower = tf.cast(lower, tf.int64)
    _, carry = tf.while_loop(
      lambda i, _: i < upper, lambda i, c: (i + 1, body(i, c)), (lower, carry)
    )
    return carry

  @staticmethod
  def trailing_zeros(x):
    """Trailing zero bits of a positive int64 (exact up to 2^62)."""
    x = tf.cast(x, tf.int64)
    low = tf.bitwise.bitwise_and(x, -x)
    return tf.cast(tf.round(tf.math.log(tf.cast(low, tf.float64)) / np.log(2.0)), tf.int64)

  @staticmethod
  def empty_rows(shape, dtype):
    # A leading dimension of unknown size, so the state type stays fixed as the buffer grows.
    return tf.compat.v1.placeholder_with_default(
      tf.zeros([0] + list(shape), dtype), shape=[None] + list(shape)
    )

  @staticmethod
  def set_row(buffer, index, value):
    index = tf.cast(index, tf.int32)
    grown = tf.cond(
      index >= tf.shape(buffer)[0],
      lambda: tf.concat([buffer, tf.zeros_like(value)[None]], 0),
      lambda: buffer,
    )
    updated = tf.tensor_scatter_nd_update(grown, [[index]], value[None])
    updated.set_shape([None] + buffer.shape.as_list()[1:])
    return updated

  @staticmethod
  def row(buffer, index):
    return tf.gather(buffer, tf.cast(index, tf.int32))


TF_OPS = TfOps()


def _fold(seed: tf.Tensor, data) -> tf.Tensor:
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(data, tf.int64), alg=_RNG_ALG)


def round_draws(seed: tf.Tensor, round_index: tf.Tensor, specs: Specs) -> Callable[[Any], list]:
  """z(j): round t's j-th standard normal draw, one tensor per spec, keyed by (seed, t, j, k)."""
  round_seed = _fold(seed, round_index)

  def draw(j) -> list[tf.Tensor]:
    draw_seed = _fold(round_seed, j)
    return [
      tf.random.stateless_normal(
        spec.shape, seed=_fold(draw_seed, k), dtype=spec.dtype, alg=_RNG_ALG
      )
      for k, spec in enumerate(specs)
    ]

  return draw


# The count releases of adaptive clipping draw under the seed folded with this tag first, the model
# noise under the seed folded with the round t >= 0 first: two separate fold-in paths.
COUNT_DRAW_TAG = -1


def count_draw(seed: tf.Tensor, round_index: tf.Tensor) -> tf.Tensor:
  """ξ_t: round t's standard normal (float64 scalar) for the noisy count of adaptive clipping
  (`fedmf.tff.adaptive_clip`), keyed by (seed, tag, t), independent of the model noise's draws."""
  key = _fold(_fold(seed, COUNT_DRAW_TAG), round_index)
  return tf.random.stateless_normal([], seed=key, dtype=tf.float64, alg=_RNG_ALG)


def make_noise_stream(strategy: Any, num_rounds: Optional[int] = None) -> streaming.NoiseStream:
  """The noise stream of a strategy (object, dict or path; `fedmf.mf.strategies.load_strategy`).

  Args:
    strategy: anything the loader accepts.
    num_rounds: the horizon n where C depends on it (BandMF: default the file's n, or a smaller
      leading block; a column-normalized band-toeplitz needs it).

  Raises:
    StrategyError: a strategy that does not stream (full-Honaker tree) or a missing horizon.
  """
  return st.load_strategy(strategy).noise_stream(num_rounds)


def horizon_checks(stream: streaming.NoiseStream, round_index: tf.Tensor) -> list[tf.Operation]:
  """Assertions that `round_index` is below the stream's horizon (if any)."""
  if stream.horizon is None:
    return []
  return [
    tf.debugging.assert_less(
      tf.cast(round_index, tf.int64),
      tf.constant(stream.horizon, tf.int64),
      message=(
        f'fedmf: the strategy was built for n={stream.horizon} rounds and cannot produce '
        f'noise for a later round (0-based round index must be < {stream.horizon}). '
        f'Build the aggregator with a strategy for more rounds.'
      ),
    )
  ]
