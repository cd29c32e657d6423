"""The server step on the host: correlated noise, the DP mean and server SGD with momentum.

One concept: what the server does with a round's clipped sum. The federated part of a round (model
broadcast, local training, clipping, the sum) runs as a TFF computation (`fedmf.tff.rounds`); the
rest runs here, in the program's process, because the noise state never has to cross TFF's
execution context then: only the model goes in and the sum comes out (issue 11's finding: moving
the state through the sync context each round, not the noise arithmetic, made correlated noise
expensive).

The noise is the strategy's `NoiseStream` run in numpy on the host (its `HostKernel`: in place,
one pass over the buffers a round), with the same seeded draws as the `tff.aggregators` factory
(`fedmf.tff.noise.round_draws`), so both give the same noise for the same seed, bit for bit.
Everything the server holds is plain data: weights and momentum as float32 numpy arrays, the stream
state as numpy arrays, the round, and the seed.

  mean_t  = (Σ clipped updates + ζ·σ·[C⁻¹ z]_t) / B           (BandMF Alg. 1; BLT Alg. 1)
  m_t     = β m_{t-1} + mean_t,   w_t = w_{t-1} − η_t m_t     (server SGD with momentum)

Updates are w_initial − w_trained (TFF's model-delta convention), so the mean is a pseudo-gradient.
η_t warms up linearly from `cooldown_factor`·η over the first `warmup_fraction` of the rounds and
cools down linearly to `cooldown_factor`·η over the last `cooldown_fraction` (BandMF App. I).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from fedmf.errors import FedmfUserError
from fedmf.mf import streaming
from fedmf.tff import aggregators as aggregators_lib
from fedmf.tff import noise as noise_lib


def learning_rate(
  round_index: int,
  rounds: int,
  base: float,
  warmup_fraction: float,
  cooldown_fraction: float,
  cooldown_factor: float,
) -> float:
  """η_t: linear warm-up from cooldown_factor·η, constant, linear cool-down to cooldown_factor·η."""
  warmup = int(round(warmup_fraction * rounds))
  cooldown = int(round(cooldown_fraction * rounds))
  low = cooldown_factor * base
  if round_index < warmup:
    return low + (base - low) * round_index / max(warmup - 1, 1)
  start = rounds - cooldown
  if cooldown and round_index >= start:
    return base - (base - low) * (round_index - start + 1) / cooldown
  return base


def draw_seed() -> int:
  """A 64-bit seed from OS randomness."""
  import os  # pylint: disable=g-import-not-at-top

  return int.from_bytes(os.urandom(8), "little")


class HostNoise:
  """A strategy's noise stream on the host: the aggregator's noise, with the state in numpy.

  The stream runs as its `HostKernel` (`NoiseStream.host_kernel`: the stream's own definition in
  numpy, with in-place kernels for the model-sized buffers of BLT, banded and tree streams), fed
  by the aggregator's seeded draws (`fedmf.tff.noise.round_draws` under the aggregator's seed key),
  so for the same seed it gives the `tff.aggregators` factory's noise bit for bit
  (tests/program/test_host_noise.py). Only the standard normals are drawn with TF (Philox).

  `next()` returns round t's unit-scale noise [C⁻¹ z]_t as float32 numpy arrays, one per model
  tensor (new arrays, the caller's), and advances. `prefetch()` starts computing it in a
  background thread (the noise does not depend on the data, so it can be computed while TFF trains
  the clients); `next()` then waits for it. The noise is the same with or without prefetching.
  `state()` / `restore()` give and take the stream state as flat numpy arrays.
  """

  def __init__(
    self,
    stream: streaming.NoiseStream,
    shapes: Sequence[tuple[int, ...]],
    seed: int,
    dtype=tf.float32,
    overlap: bool = False,
  ):
    self.stream = stream
    self.specs = [tf.TensorSpec(s, dtype) for s in shapes]
    self.overlap = overlap
    # The aggregator's own seed key, so both give the same noise for the same seed.
    self._seed = tf.constant(aggregators_lib._seed_pair(seed), tf.int64)  # pylint: disable=protected-access
    self._kernel = stream.host_kernel(self.specs)
    self._round = self._kernel.round
    self._row_norm = self._kernel_row_norm()
    self._pool = None
    self._pending = None  # Future of (round's noise, next round's row norm), from prefetch().
    specs = self.specs

    @tf.function(autograph=False)
    def draw(seed, round_index, j):
      return noise_lib.round_draws(seed, round_index, specs)(j)

    self._draw = draw

  @property
  def round(self) -> int:
    """The round whose noise `next()` returns."""
    return self._round

  def row_norm(self) -> float:
    """‖row_t of C⁻¹‖ of the next round (the noise std per unit of ζσ)."""
    return self._row_norm

  def _check_horizon(self, round_index: int) -> None:
    if self.stream.horizon is not None and round_index >= self.stream.horizon:
      raise FedmfUserError(
        f"the strategy was built for n={self.stream.horizon} rounds and cannot "
        f"produce noise for round {round_index}"
      )

  def _z(self, round_index: int):
    t = tf.constant(round_index, tf.int64)
    return lambda j: [x.numpy() for x in self._draw(self._seed, t, tf.constant(int(j), tf.int64))]

  def _kernel_row_norm(self) -> float:
    if self.stream.horizon is not None and self._kernel.round >= self.stream.horizon:
      return float("nan")  # No such round: next() refuses it.
    return self._kernel.row_norm()

  def _compute(self) -> tuple[list[np.ndarray], float]:
    noise = self._kernel.step(self._z(self._kernel.round))
    return noise, self._kernel_row_norm()

  def prefetch(self) -> None:
    """Starts round t's noise in a background thread (when `overlap`; else does nothing)."""
    if not self.overlap or self._pending is not None:
      return
    if self.stream.horizon is not None and self._round >= self.stream.horizon:
      return  # next() raises.
    if self._pool is None:
      import concurrent.futures  # pylint: disable=g-import-not-at-top

      self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fedmf-noise")
    self._pending = self._pool.submit(self._compute)

  def next(self) -> list[np.ndarray]:
    self._check_horizon(self._round)
    if self._pending is not None:
      pending, self._pending = self._pending, None
      noise, row_norm = pending.result()
    else:
      noise, row_norm = self._compute()
    self._round += 1
    self._row_norm = row_norm
    return noise

  def _settle(self) -> bool:
    """Waits for a prefetch; True if its noise is computed and not yet taken by next()."""
    if self._pending is None:
      return False
    self._pending.result()
    return True

  def state(self, copy: bool = True) -> list[np.ndarray]:
    """The stream state as flat numpy arrays; copy=False returns views of the buffers (no extra
    memory, for writing a big state to disk), valid until the next `next()`."""
    if self._settle():
      raise RuntimeError(
        f"round {self._round}'s noise is prefetched: call next() before taking the state"
      )
    return tf.nest.flatten(self._kernel.state(copy))

  def restore(self, flat: Sequence[np.ndarray]) -> None:
    if self._settle():
      self._pending = None  # Computed from the state being replaced: dropped.
    template = self._kernel.state(copy=False)
    leaves = tf.nest.flatten(template)
    if len(flat) != len(leaves):
      raise FedmfUserError(f"noise state has {len(flat)} arrays, the stream expects {len(leaves)}")
    try:
      self._kernel.restore(tf.nest.pack_sequence_as(template, list(flat)))
    except ValueError as e:
      raise FedmfUserError(str(e)) from None
    self._round = self._kernel.round
    self._row_norm = self._kernel_row_norm()

  def close(self) -> None:
    """Stops the background thread (after any prefetch finishes)."""
    if self._pool is not None:
      self._pool.shutdown(wait=True)
      self._pool = None
    self._pending = None


@dataclasses.dataclass
class ServerState:
  """What the server holds between rounds (plain data; checkpointed as is)."""

  weights: list[np.ndarray]
  momentum: list[np.ndarray]
  round: int = 0


def initial_server_state(weights: Sequence[np.ndarray]) -> ServerState:
  weights = [np.array(w, dtype=np.float32) for w in weights]
  return ServerState(weights=weights, momentum=[np.zeros_like(w) for w in weights])


def server_update(
  state: ServerState,
  clipped_sum: Sequence[np.ndarray],
  noise: Optional[Sequence[np.ndarray]],
  noise_scale: float,
  clients_per_round: int,
  learning_rate_value: float,
  momentum: float,
) -> list[np.ndarray]:
  """Adds the noise, divides by B, applies SGD with momentum in place; returns the noisy mean.

  Raises FedmfUserError naming the round if the noisy mean is not finite: a NaN must never reach
  the model.
  """
  mean = []
  # × float32(1/B) and σζ·noise added to the sum: the aggregator's operations, so the same bits.
  inverse = np.float32(1.0 / clients_per_round)
  for k, s in enumerate(clipped_sum):
    m = np.array(s, dtype=np.float32)
    if noise is not None and noise_scale:
      m += np.float32(noise_scale) * noise[k]
    m *= inverse
    if not np.all(np.isfinite(m)):
      raise FedmfUserError(
        f"round {state.round}: the noisy aggregate is not finite (tensor {k}); "
        "training stopped before it reached the model"
      )
    mean.append(m)
  lr = np.float32(learning_rate_value)
  beta = np.float32(momentum)
  for w, v, g in zip(state.weights, state.momentum, mean):
    v *= beta
    v += g
    w -= lr * v
  state.round += 1
  return mean
