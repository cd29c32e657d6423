"""Correlated noise on the host, for fedmf's round loop and for users' own TFF loops.

One concept: the strategy's noise stream run in numpy next to TFF, not inside it. Moving the noise
state through TFF's synchronous execution context every round (what a stateful `tff.aggregators`
factory does) costs more than the noise arithmetic itself (docs/benchmarks.md §3: BLT-4 at 4M
parameters made the factory 2.38× `gaussian_fixed`). `HostNoise` keeps the state in numpy and
gives each round's noise; fedmf's own loop adds it on the host (`fedmf.program.server`).

For users' own `tff.learning` FedAvg (their `model_fn` and optimizers),
`fedmf.tff.build_dp_fed_avg(..., noise_on_host=True)` returns a `HostNoiseFedAvg`: a learning process whose aggregator takes
the round's noise as its state, set on the host before each `next` call, so only this round's
model-sized noise crosses the context (no buffers), and whose noise equals the factory's for the
same seed. The factory (`build_dp_aggregator`) stays for deployments that need one pure TFF
computation.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions

from fedmf.errors import FedmfUserError
from fedmf.mf import streaming
from fedmf.tff import adaptive_clip as adaptive_tf
from fedmf.tff import aggregators as aggregators_lib
from fedmf.tff import client_data as client_data_lib
from fedmf.tff import dp_mean
from fedmf.tff import dp_process
from fedmf.tff import noise as noise_lib


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
    self._seed = tf.constant(dp_mean.seed_key(seed), tf.int64)
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


class HostNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """Clip, sum, add the noise held in the state, divide by clients_per_round.

  The state is the round's unit-scale noise [C⁻¹ z]_t (one tensor per model tensor), put there by
  the host (`HostNoiseFedAvg.next`); the arithmetic is the factory's, so for the same noise the
  mean is the same bits: (Σ clipped + ζσ·z) × float32(1/B) (BandMF Alg. 1; BLT Alg. 1). With an
  adaptive clip or a record aggregation factory the state is OrderedDict(noise, [clip]) (with a
  record factory inside OrderedDict(dp=..., records=...)), ζ_t set by the host too, and the
  measurements give the host the counts it moves ζ with (`fedmf.tff.dp_process.general_process`).
  """

  def __init__(
    self,
    *,
    noise_multiplier: float,
    clip_norm,
    clients_per_round: float,
    record_aggregation_factory=None,
  ):
    self._dp = dp_process.DPMean.of(
      noise_multiplier, clip_norm, clients_per_round, record_aggregation_factory
    )

  @property
  def general(self) -> bool:
    """The state holds more than the noise (an adaptive clip or a record factory)."""
    return self._dp.adaptive is not None or self._dp.records is not None

  @property
  def adaptive_clip(self):
    return self._dp.adaptive

  def create(self, value_type) -> tff.templates.AggregationProcess:
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(f"value_type must be a structure of floats, got {value_type}")
    if self.general:
      return dp_process.general_process(value_type, self._dp, dp_process.StateNoise())
    specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)
    specs = tf.nest.flatten(specs_struct)
    scale, cpr = self._dp.fixed_scale, self._dp.clients_per_round

    @tff.tensorflow.computation
    def init_tf():
      return [tf.zeros(s.shape, s.dtype) for s in specs]

    clip_tf = aggregators_lib.clip_computation(value_type, self._dp.clip_norm)

    @tff.tensorflow.computation(init_tf.type_signature.result, clip_tf.type_signature.result[0])
    def noise_tf(noise, total):
      mean = dp_mean.noised_mean(dp_mean.flatten(total), tf.nest.flatten(noise), scale, cpr)
      return tf.nest.pack_sequence_as(specs_struct, mean)

    def server(state, total, counts):
      return state, tff.federated_map(noise_tf, (state, total)), counts

    return aggregators_lib.dp_mean_process(init_tf, value_type, clip_tf, server)


class HostNoiseFedAvg:
  """A `tff.learning` FedAvg whose correlated noise stays on the host (see the module docstring).

  Use it like the `LearningProcess` it wraps (`process`): `state = p.initialize()`, then
  `output = p.next(state, client_data)` in your own loop; `output.state` goes into the next call.
  It is a Python object, not a TFF computation: for `tff.learning.programs.train_model` or a
  deployment that needs one computation, use `build_dp_fed_avg` (the stateful factory).

  With an adaptive clip, `clip` (`fedmf.tff.adaptive_clip.HostAdaptiveClip`) holds ζ: each `next`
  puts ζ_t in the aggregator's state and moves ζ with the round's noisy count of clients within
  it (keyed by the noise seed), as the stateful factory does, bit for bit.
  """

  def __init__(
    self, process, noise: HostNoise, shapes: Sequence[tuple[int, ...]], clip=None, general=False
  ):
    self.process = process
    self.noise = noise
    self.clip = clip
    self._general = general
    self._shapes = [tuple(s) for s in shapes]

  def initialize(self):
    return self.process.initialize()

  def next(self, state, client_data):
    round_index = self.noise.round
    noise = self.noise.next()  # round t's unit-scale noise (prefetched during the last call)
    aggregator = noise
    if self._general:
      aggregator = state.aggregator
      fields = dict(aggregator["dp"] if "dp" in aggregator else aggregator)
      fields["noise"] = noise
      if self.clip is not None:
        fields["clip"] = np.float64(self.clip.value)
      inner = collections.OrderedDict(fields)
      aggregator = (
        collections.OrderedDict(dp=inner, records=aggregator["records"])
        if "dp" in aggregator
        else inner
      )
    state = state._replace(aggregator=aggregator)
    # Autotuning off (fedmf.tff.client_data): otherwise each client's end can stall the round.
    output = self.process.next(state, client_data_lib.worker_datasets(client_data))
    if self.clip is not None:  # Round t's count release: ζ_{t+1}.
      measured = output.metrics["aggregator"]
      measured = measured.get("dp", measured)
      within = (
        int(measured["clients"]) - int(measured["clipped_count"]) - int(measured["zeroed_count"])
      )
      self.clip.update(round_index, within, int(measured["clients"]))
    self.noise.prefetch()  # the next round's noise, computed while the caller does other work
    return output

  def close(self) -> None:
    self.noise.close()


def host_noise_fed_avg(
  process, stream: streaming.NoiseStream, noise_seed: Optional[int], factory: HostNoiseFactory
):
  """Wraps a FedAvg `process` built with `factory` as its aggregator: its noise, on the host.

  For the same `noise_seed` the noise (and so the model, and an adaptive clip's ζ) is the stateful
  factory's; None draws one from OS randomness (never stored in TFF's state).
  """
  weights_type = process.initialize.type_signature.result.member.global_model_weights.trainable
  shapes = [tuple(t.shape) for t in tff.structure.flatten(weights_type)]
  seed = dp_mean.draw_noise_seed() if noise_seed is None else int(noise_seed)
  noise = HostNoise(stream, shapes, seed, overlap=True)
  noise.prefetch()
  clip = None
  if factory.adaptive_clip is not None:
    clip = adaptive_tf.HostAdaptiveClip(
      factory.adaptive_clip,
      dp_mean.seed_key(seed),
      adaptive_tf.count_stddev(factory.adaptive_clip.count_noise_multiplier),
    )
  return HostNoiseFedAvg(process, noise, shapes, clip=clip, general=factory.general)
