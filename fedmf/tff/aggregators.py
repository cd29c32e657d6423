"""DP mean aggregators with correlated (matrix-mechanism) noise for TFF.

Layer 3 of docs/architecture.md; notation from there and docs/mechanisms.md.

`build_dp_aggregator(strategy, ...)` returns a
`tff.aggregators.UnweightedAggregationFactory`. Its process, in round i
(0-based, counted by the aggregator itself):

1. each client update is L2-clipped to `clip_norm` over the whole model as one
   vector (tf.clip_by_global_norm semantics, with an overflow-safe norm);
   non-finite updates are replaced by zeros and counted;
2. the clipped updates are summed, and the noise
   `clip_norm · noise_multiplier · [C⁻¹ z]_i` is added (BandMF Alg. 1, BLT
   Eq. 1/4; for the tree, the decoder's per-round noise), with z from
   `tf.random.stateless_normal` keyed by (noise_seed, i, tensor index);
3. the result is divided by the fixed `clients_per_round` (the DP mean; as a
   multiplication by float32(1/clients_per_round), like the host path);
4. a non-finite noise or mean stops the round with an InvalidArgumentError
   naming it ("fedmf: round i ...").

State (at SERVER, all tensors): `seed` (int64[2], secret) and `noise`, the
stream state of `fedmf.mf.streaming` (its first entry is the round i). Feeding
a saved state back continues with bit-identical noise.

Measurements: `round`, `clipped_count`, `zeroed_count`, `noise_stddev` =
clip·σ·‖row_i of C⁻¹‖ / clients_per_round (std of one coordinate of the noise in
this round's mean). The seed and the raw noise are never measured.
"""

from __future__ import annotations

import collections
from typing import Any, Optional, Union

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions

from fedmf.mf import streaming
from fedmf.privacy import adaptive_clip as adaptive_lib
from fedmf.tff import clipping
from fedmf.tff import dp_mean
from fedmf.tff import dp_process
from fedmf.tff import noise as noise_lib

__all__ = ['build_dp_aggregator', 'CorrelatedNoiseFactory']


def clip_computation(value_type, clip: float):
  """Step 1 as a TF computation: value -> (clipped value, was_clipped, was_zeroed)."""
  specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)

  @tff.tensorflow.computation(value_type)
  def clip_tf(value):
    clipped, was_clipped, was_zeroed = clipping.clip_update(dp_mean.flatten(value), clip)
    return (tf.nest.pack_sequence_as(specs_struct, clipped), was_clipped, was_zeroed)

  return clip_tf


class CorrelatedNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """Clip, sum, add streaming correlated noise, divide by clients_per_round."""

  def __init__(
    self,
    stream: streaming.NoiseStream,
    *,
    noise_multiplier: float,
    clip_norm: Union[float, str, adaptive_lib.AdaptiveClip],
    clients_per_round: float,
    noise_seed: Optional[int] = None,
    record_aggregation_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
  ):
    self._dp = dp_process.DPMean.of(
      noise_multiplier, clip_norm, clients_per_round, record_aggregation_factory
    )
    self._clip_norm, self._scale, self._clients_per_round = (
      self._dp.clip_norm,
      self._dp.fixed_scale,
      self._dp.clients_per_round,
    )
    self._stream = stream
    self._seed = None if noise_seed is None else dp_mean.seed_key(noise_seed)

  @property
  def stream(self) -> streaming.NoiseStream:
    return self._stream

  @property
  def adaptive_clip(self) -> Optional[adaptive_lib.AdaptiveClip]:
    """The adaptive clip with its count noise multiplier resolved (None: a fixed clip)."""
    return self._dp.adaptive

  @property
  def clip_norm(self) -> float:
    """ζ, the clip of each client update (the initial ζ_0 of an adaptive clip)."""
    return self._clip_norm

  @property
  def clients_per_round(self) -> float:
    """B, the fixed denominator of the DP mean."""
    return self._clients_per_round

  def create(self, value_type) -> tff.templates.AggregationProcess:
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(f'value_type must be a structure of floats, got {value_type}')
    if self._dp.adaptive is not None or self._dp.records is not None:
      return dp_process.general_process(
        value_type, self._dp, dp_process.StreamNoise(self._stream, self._seed)
      )
    specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)
    specs = tf.nest.flatten(specs_struct)
    stream = self._stream
    clip, scale, cpr = self._clip_norm, self._scale, self._clients_per_round
    fixed_seed = self._seed

    @tff.tensorflow.computation
    def init_tf():
      if fixed_seed is None:
        # Drawn anew by every `initialize` call from OS entropy, so the secret
        # never appears in the serialized computation. Not tf.random.uniform:
        # once a program sets a global seed (tf.random.set_seed, Keras'
        # set_random_seed), its op seeds are derived from it and the noise
        # seed would be predictable.
        seed = tf.raw_ops.NonDeterministicInts(shape=[2], dtype=tf.int64)
      else:
        seed = tf.constant(fixed_seed, tf.int64)
      return collections.OrderedDict(seed=seed, noise=stream.init(specs, noise_lib.TF_OPS))

    state_type = init_tf.type_signature.result

    clip_tf = clip_computation(value_type, clip)
    sum_type = clip_tf.type_signature.result[0]

    @tff.tensorflow.computation(state_type, sum_type)
    def noise_tf(state, total):
      flat = dp_mean.flatten(total)
      noise_state = state['noise']
      round_index = noise_state[0]  # Every stream state starts with its round t.
      # Past a banded strategy's horizon: fail loudly, before any table lookup.
      with tf.control_dependencies(noise_lib.horizon_checks(stream, round_index)):
        round_index = tf.identity(round_index)
        row_norm = stream.row_norm(noise_state, noise_lib.TF_OPS)
        noises, new_noise_state = stream.step(
          noise_state, noise_lib.round_draws(state['seed'], round_index, specs), noise_lib.TF_OPS
        )
      mean = dp_mean.noised_mean(flat, noises, scale, cpr)
      mean = dp_mean.guarded(mean, noises, flat, round_index, clip)
      new_state = collections.OrderedDict(seed=state['seed'], noise=new_noise_state)
      stddev = tf.cast(scale * row_norm / cpr, tf.float32)
      return (new_state, tf.nest.pack_sequence_as(specs_struct, mean), round_index, stddev)

    def server(state, total, counts):
      new_state, mean, round_index, stddev = tff.federated_map(noise_tf, (state, total))
      return (
        new_state,
        mean,
        collections.OrderedDict(round=round_index, **counts, noise_stddev=stddev),
      )

    return dp_mean_process(init_tf, value_type, clip_tf, server)


def dp_mean_process(init_tf, value_type, clip_tf, server) -> tff.templates.AggregationProcess:
  """The process of a DP-mean factory (this one and `fedmf.tff.host_noise.HostNoiseFactory`).

  The state is `init_tf()` at SERVER; a round clips the clients' values (`clip_tf`), sums them and
  calls `server(state, total, counts)`, where `counts` holds the summed clipped_count and
  zeroed_count, for (new state, noised mean, measurements: an OrderedDict of SERVER values).
  """
  state_type = init_tf.type_signature.result

  @tff.federated_computation
  def init_fn():
    return tff.federated_eval(init_tf, tff.SERVER)

  @tff.federated_computation(
    tff.FederatedType(state_type, tff.SERVER), tff.FederatedType(value_type, tff.CLIENTS)
  )
  def next_fn(state, value):
    clipped, was_clipped, was_zeroed = tff.federated_map(clip_tf, value)
    total = tff.federated_sum(clipped)
    counts = collections.OrderedDict(
      clipped_count=tff.federated_sum(was_clipped), zeroed_count=tff.federated_sum(was_zeroed)
    )
    new_state, mean, measurements = server(state, total, counts)
    return tff.templates.MeasuredProcessOutput(
      state=new_state, result=mean, measurements=tff.federated_zip(measurements)
    )

  return tff.templates.AggregationProcess(init_fn, next_fn)


def build_dp_aggregator(
  strategy: Any,
  *,
  noise_multiplier: float,
  clip_norm: float,
  clients_per_round: Union[int, float],
  noise_seed: Optional[int] = None,
  num_rounds: Optional[int] = None,
  record_aggregation_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
) -> tff.aggregators.UnweightedAggregationFactory:
  """The DP-mean aggregator factory for a correlated-noise strategy.

  Args:
    strategy: a strategy object, a dict in the strategy JSON schema, or a path
      to a strategy JSON file, read by `fedmf.mf.strategies.load_strategy`.
      Mechanisms: dpsgd, blt, bandmf, band-toeplitz, tree (vanilla or
      online-honaker; full-honaker does not stream and is refused).
    noise_multiplier: σ, applied to C as loaded (sensitivity is the
      accountant's business): the sum gets clip_norm·σ·[C⁻¹ z]_i.
    clip_norm: ζ, the L2 bound on each client update over the whole model; or adaptive
      clipping (Andrew et al. 2021): `fedmf.privacy.adaptive_clip.AdaptiveClip(target_quantile,
      initial, learning_rate, count_noise_multiplier)` (or 'adaptive' for its defaults; z_b
      defaults to clients_per_round/10): round t clips to and scales its noise by ζ_t, and
      releases the count of clients within ζ_t with noise of std z_b/2 to move ζ (measurements
      `clip_norm`, `unclipped_fraction`). Account it with the count releases composed in
      (`fedmf.privacy.accounting.account(..., count_noise_multiplier=z_b)`).
    clients_per_round: the fixed denominator of the DP mean.
    noise_seed: an integer in [0, 2^64) (anything else is refused). None draws
      a fresh seed from OS randomness in every `initialize()`. The seed lives
      in the server state: checkpoints of the state are secret.
    num_rounds: the horizon n for banded strategies (default: the BandMF
      file's n; required for a column-normalized band-toeplitz). Running past
      it fails with an InvalidArgumentError naming the horizon.
    record_aggregation_factory: what sums the clipped records (None: `tff.federated_sum`):
      `tff.aggregators.SumFactory()`, or `tff.aggregators.SecureSumFactory(upper_bound_threshold=ζ,
      lower_bound_threshold=-ζ)` for secure summation: fedmf then clips with a quantization margin,
      scales the records to the bounds, sums the counts securely too, and adds the noise after
      the dequantized sum (`fedmf.tff.record_sum`; docs/aggregators.md, *Secure summation*).

  Returns:
    A `tff.aggregators.UnweightedAggregationFactory`; wrap it with
    `tff.aggregators.as_weighted_aggregator` for weighted FedAvg.
  """
  stream = noise_lib.make_noise_stream(strategy, num_rounds=num_rounds)
  return CorrelatedNoiseFactory(
    stream,
    noise_multiplier=noise_multiplier,
    clip_norm=clip_norm,
    clients_per_round=clients_per_round,
    noise_seed=noise_seed,
    record_aggregation_factory=record_aggregation_factory,
  )
