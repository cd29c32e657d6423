"""Per-client clipping of a model update, in TensorFlow: the one bound the sensitivity relies on.

One concept: what a client contributes. An update (all model tensors as one vector) is
  * zeroed if it holds a NaN or ±Inf, or if its largest |entry| exceeds `zeroing_linf` (the
    papers' zeroing of updates with a huge ℓ∞ norm, for stability early in training; BandMF App. I);
  * otherwise scaled to L2 norm at most ζ = `clip_norm` (tf.clip_by_global_norm semantics).
The norm is computed without overflow (entries divided by the peak |entry| before squaring), so a
huge finite update is scaled down to ζ rather than zeroed by an inf norm. A zeroed update
contributes nothing, so every contribution has norm ≤ ζ, which is the sensitivity's assumption.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf


def global_norm(tensors: list[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
  """‖x‖ over all tensors as one vector, overflow-safe, as (peak, relative): ‖x‖ = peak·relative.

  peak = max |entry| (float64 scalar). Entries are divided by the peak before squaring, so huge
  finite updates (e.g. 3e38 in float32) get their true norm instead of inf.
  """
  peaks = [
    tf.cast(tf.reduce_max(tf.abs(t)), tf.float64) for t in tensors if t.shape.num_elements() != 0
  ]
  if not peaks:
    return tf.constant(1.0, tf.float64), tf.constant(0.0, tf.float64)
  peak = tf.reduce_max(tf.stack(peaks))
  safe = tf.where(peak > 0.0, peak, 1.0)
  sq = tf.add_n(
    [tf.cast(tf.reduce_sum(tf.square(t / tf.cast(safe, t.dtype))), tf.float64) for t in tensors]
  )
  return safe, tf.sqrt(sq)


def clip_update(
  flat: list[tf.Tensor], clip_norm: float, zeroing_linf: Optional[float] = None
) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
  """(clipped tensors, 1 if clipped else 0, 1 if zeroed else 0), all int32 flags."""
  finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in flat])
  peak, relative = global_norm(flat)
  keep = finite
  if zeroing_linf is not None:
    keep = tf.logical_and(keep, peak <= zeroing_linf)
  clipping = tf.logical_and(keep, peak * relative > clip_norm)
  # Clipped: (t / peak)·(clip / relative), both factors well scaled, so no overflow or flush to
  # zero for huge updates; unclipped: t unchanged. Dropped: zeros (explicitly: NaN·0 is NaN).
  clipped = []
  for t in flat:
    div = tf.cast(tf.where(clipping, peak, 1.0), t.dtype)
    mul = tf.cast(tf.where(clipping, clip_norm / tf.maximum(relative, 1e-300), 1.0), t.dtype)
    clipped.append(tf.where(keep, (t / div) * mul, tf.zeros_like(t)))
  return clipped, tf.cast(clipping, tf.int32), tf.cast(tf.logical_not(keep), tf.int32)
