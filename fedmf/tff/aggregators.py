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
import numbers
import os
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions

from fedmf.errors import FedmfUserError
from fedmf.mf import streaming
from fedmf.privacy import adaptive_clip as adaptive_lib
from fedmf.tff import adaptive_clip as adaptive_tf
from fedmf.tff import clipping
from fedmf.tff import noise as noise_lib
from fedmf.tff import record_sum

__all__ = ['build_dp_aggregator', 'CorrelatedNoiseFactory', 'draw_noise_seed']


MAX_NOISE_SEED = 2**64 - 1


def draw_noise_seed() -> int:
  """A 63-bit seed from OS randomness (`os.urandom`)."""
  return int.from_bytes(os.urandom(8), 'little') >> 1


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


def _all_finite(tensors: list[tf.Tensor]) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def dp_mean_arguments(
  noise_multiplier: Any, clip_norm: Any, clients_per_round: Any
) -> tuple[float, float, float]:
  """(ζ, ζσ, B) of a DP mean, each checked to be a finite number (ζ, B > 0; σ >= 0)."""
  sigma = _finite_number(noise_multiplier, 'noise_multiplier', positive=False)
  clip = _finite_number(clip_norm, 'clip_norm', positive=True)
  cpr = _finite_number(clients_per_round, 'clients_per_round', positive=True)
  return clip, clip * sigma, cpr


def clip_computation(value_type, clip: float):
  """Step 1 as a TF computation: value -> (clipped value, was_clipped, was_zeroed)."""
  specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)

  @tff.tensorflow.computation(value_type)
  def clip_tf(value):
    clipped, was_clipped, was_zeroed = clipping.clip_update(_flatten(value), clip)
    return (tf.nest.pack_sequence_as(specs_struct, clipped), was_clipped, was_zeroed)

  return clip_tf


def noised_mean(flat_sum: list, unit_noise: list, scale: float, cpr: float) -> list:
  """Steps 2-3: (Σ clipped + ζσ·[C⁻¹ z]_i) × float32(1/B) per tensor (BandMF Alg. 1; BLT Eq. 1).

  × float32(1/B), not ÷ B: TF's graph optimizer rewrites a division by a constant into this
  multiplication anyway, and writing it so gives the same bits here, in eager TF and in numpy
  (the host server step, fedmf.program.server).
  """
  return [
    (t + tf.cast(scale, t.dtype) * z) * tf.cast(1.0 / cpr, t.dtype)
    for t, z in zip(flat_sum, unit_noise)
  ]


def _flatten(value: Any) -> list:
  if isinstance(value, tff.structure.Struct):
    return tff.structure.flatten(value)
  return tf.nest.flatten(value)


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
    self._adaptive = resolve_adaptive(clip_norm, clients_per_round)
    fixed = clip_norm if self._adaptive is None else self._adaptive.initial
    self._clip_norm, self._scale, self._clients_per_round = dp_mean_arguments(
      noise_multiplier, fixed, clients_per_round
    )
    self._sigma = self._scale / self._clip_norm if self._adaptive is not None else None
    self._stream = stream
    self._seed = None if noise_seed is None else seed_key(noise_seed)
    self._records = record_sum.RecordSum.of(record_aggregation_factory)

  @property
  def stream(self) -> streaming.NoiseStream:
    return self._stream

  @property
  def adaptive_clip(self) -> Optional[adaptive_lib.AdaptiveClip]:
    """The adaptive clip with its count noise multiplier resolved (None: a fixed clip)."""
    return self._adaptive

  def create(self, value_type) -> tff.templates.AggregationProcess:
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(f'value_type must be a structure of floats, got {value_type}')
    if self._adaptive is not None or self._records is not None:
      return self._create_general(value_type)
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
      flat = _flatten(total)
      noise_state = state['noise']
      round_index = noise_state[0]  # Every stream state starts with its round t.
      # Past a banded strategy's horizon: fail loudly, before any table lookup.
      with tf.control_dependencies(noise_lib.horizon_checks(stream, round_index)):
        round_index = tf.identity(round_index)
        row_norm = stream.row_norm(noise_state, noise_lib.TF_OPS)
        noises, new_noise_state = stream.step(
          noise_state, noise_lib.round_draws(state['seed'], round_index, specs), noise_lib.TF_OPS
        )
      mean = noised_mean(flat, noises, scale, cpr)
      # Runtime guard: training stops in the round where the noise or the aggregate stops being
      # finite (an overflowing sum of huge updates, σ·ζ beyond float32, a stream that overflows),
      # never after. Non-finite client updates were zeroed above, and stay so.
      finite_noise, finite_sum, finite_mean = (
        _all_finite(noises),
        _all_finite(flat),
        _all_finite(mean),
      )
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
          tf.constant(clip),
          'times the number of clients).',
        ],
      )
      with tf.control_dependencies([guard]):
        mean = [tf.identity(m) for m in mean]
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


  def _init_tf(self, specs):
    """init_tf() -> OrderedDict(seed, noise[, clip]): the DP state (see `create`)."""
    stream, fixed_seed, adaptive = self._stream, self._seed, self._adaptive

    @tff.tensorflow.computation
    def init_tf():
      if fixed_seed is None:
        seed = tf.raw_ops.NonDeterministicInts(shape=[2], dtype=tf.int64)  # (see `create`)
      else:
        seed = tf.constant(fixed_seed, tf.int64)
      state = collections.OrderedDict(seed=seed, noise=stream.init(specs, noise_lib.TF_OPS))
      if adaptive is not None:
        state['clip'] = tf.constant(adaptive.initial, tf.float64)
      return state

    return init_tf

  def _create_general(self, value_type) -> tff.templates.AggregationProcess:
    """The process with an adaptive clip and/or a record aggregation factory (module docstring).

    State: the DP state OrderedDict(seed, noise[, clip]) (clip: ζ_t, float64), or with a record
    factory OrderedDict(dp=<that>, records=<the factory's state>). A round: ζ_t to the clients,
    clip to ζ_t (× 1 − m under a secure sum) and scale to the secure bound, sum the records with
    the factory (else `tff.federated_sum`) and the 0/1 flags (securely under a secure sum), then
    at the server unscale, add ζ_t·σ·[C⁻¹ z]_t, divide, and release the noisy count for ζ_{t+1}.
    """
    specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)
    specs = tf.nest.flatten(specs_struct)
    stream, cpr = self._stream, self._clients_per_round
    adaptive, records = self._adaptive, self._records
    entries = sum(int(np.prod(spec.shape)) for spec in specs)
    clip_factor = 1.0 if records is None else records.clip_factor(entries)
    secure = None if records is None else records.secure
    bound = None if secure is None else secure.bound
    fixed_clip = self._clip_norm
    # ζ·σ of a fixed clip (a Python float, as the plain factory has it), else σ per unit of ζ_t.
    fixed_scale, sigma = self._scale, self._sigma
    # Records are scaled to the secure bound B unless ζ is fixed and equal to it.
    scaled = secure is not None and (adaptive is not None or fixed_clip != bound)
    step = None
    if adaptive is not None:
      step = adaptive_tf.clip_step(
        adaptive, adaptive_tf.count_stddev(adaptive.count_noise_multiplier)
      )
    init_tf = self._init_tf(specs)
    dp_state_type = init_tf.type_signature.result

    @tff.tensorflow.computation(dp_state_type)
    def client_params_tf(state):
      # (ζ_t·(1 − m), B/ζ_t): what the clients clip to and scale their record by.
      clip = state['clip'] if adaptive is not None else tf.constant(fixed_clip, tf.float64)
      scale = (
        tf.constant(bound, tf.float64) / clip if scaled else tf.constant(1.0, tf.float64)
      )
      return clip * clip_factor if clip_factor != 1.0 else clip, scale

    @tff.tensorflow.computation(value_type, np.float64, np.float64)
    def clip_tf(value, clip, scale):
      flat, was_clipped, was_zeroed = clipping.clip_update(_flatten(value), clip)
      if scaled:
        flat = [t * tf.cast(scale, t.dtype) for t in flat]
      return (
        tf.nest.pack_sequence_as(specs_struct, flat),
        was_clipped,
        was_zeroed,
        tf.constant(1, tf.int32),
      )

    sum_type = clip_tf.type_signature.result[0]
    count_type = clip_tf.type_signature.result[1]

    def noise_body(state, total, clipped_count, zeroed_count, clients):
      flat = _flatten(total)
      noise_state = state['noise']
      round_index = noise_state[0]  # Every stream state starts with its round t.
      clip = state['clip'] if adaptive is not None else None
      if scaled:  # Back from the secure bound B to ζ_t.
        unscale = clip / bound if adaptive is not None else fixed_clip / bound
        flat = [t * tf.cast(unscale, t.dtype) for t in flat]
      with tf.control_dependencies(noise_lib.horizon_checks(stream, round_index)):
        round_index = tf.identity(round_index)
        row_norm = stream.row_norm(noise_state, noise_lib.TF_OPS)
        noises, new_noise_state = stream.step(
          noise_state, noise_lib.round_draws(state['seed'], round_index, specs), noise_lib.TF_OPS
        )
      scale = clip * sigma if adaptive is not None else fixed_scale
      mean = noised_mean(flat, noises, scale, cpr)
      mean = _guarded(mean, noises, flat, round_index, clip if clip is not None else fixed_clip)
      new_state = collections.OrderedDict(seed=state['seed'], noise=new_noise_state)
      measurements = collections.OrderedDict(
        round=round_index,
        clipped_count=clipped_count,
        zeroed_count=zeroed_count,
        noise_stddev=tf.cast(scale * row_norm / cpr, tf.float32),
      )
      if adaptive is not None:
        within = clients - clipped_count - zeroed_count
        fraction, new_clip = step(state['seed'], round_index, clip, within, clients)
        new_state['clip'] = new_clip
        measurements.update(clip_norm=clip, unclipped_fraction=fraction, clients=clients)
      return new_state, tf.nest.pack_sequence_as(specs_struct, mean), measurements

    counts = (count_type, count_type, count_type)
    if records is None:
      record_process = None
      noise_tf = tff.tensorflow.computation(noise_body, dp_state_type, sum_type, *counts)
    else:
      record_process = records.factory.create(sum_type)
      if secure is None:
        noise_tf = tff.tensorflow.computation(noise_body, dp_state_type, sum_type, *counts)
      else:
        measured = record_process.next.type_signature.result.measurements.member

        def checked_noise_body(state, total, clipped_count, zeroed_count, clients, m):
          # The bounds fedmf read from the factory are the ones its process quantized against.
          check = tf.debugging.assert_equal(
            tf.stack(
              [
                tf.cast(m['secure_lower_threshold'], tf.float64),
                tf.cast(m['secure_upper_threshold'], tf.float64),
              ]
            ),
            tf.constant([secure.lower, secure.upper], tf.float64),
            message='fedmf: the SecureSumFactory quantized against other bounds than fedmf read',
          )
          with tf.control_dependencies([check]):
            total = tf.nest.map_structure(tf.identity, total)
          return noise_body(state, total, clipped_count, zeroed_count, clients)

        noise_tf = tff.tensorflow.computation(
          checked_noise_body, dp_state_type, sum_type, *counts, measured
        )

    @tff.federated_computation
    def init_fn():
      dp = tff.federated_eval(init_tf, tff.SERVER)
      if record_process is None:
        return dp
      return tff.federated_zip(
        collections.OrderedDict(dp=dp, records=record_process.initialize())
      )

    state_type = init_fn.type_signature.result

    @tff.federated_computation(state_type, tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      dp_state = state if record_process is None else state.dp
      clip, scale = tff.federated_map(client_params_tf, dp_state)
      clipped, was_clipped, was_zeroed, one = tff.federated_map(
        clip_tf, (value, tff.federated_broadcast(clip), tff.federated_broadcast(scale))
      )
      is_secure = secure is not None
      if record_process is None:
        total, record_state, record_measurements = tff.federated_sum(clipped), None, None
      else:
        out = record_process.next(state.records, clipped)
        total, record_state, record_measurements = out.result, out.state, out.measurements
      arguments = [
        dp_state,
        total,
        record_sum.sum_counts(was_clipped, is_secure),
        record_sum.sum_counts(was_zeroed, is_secure),
        record_sum.sum_counts(one, is_secure),
      ]
      if is_secure:
        arguments.append(record_measurements)
      new_dp, mean, measurements = tff.federated_map(noise_tf, tuple(arguments))
      if record_process is not None:
        new_state = tff.federated_zip(collections.OrderedDict(dp=new_dp, records=record_state))
        measurements = tff.federated_zip(
          collections.OrderedDict(dp=measurements, record_aggregation=record_measurements)
        )
      else:
        new_state = new_dp
      return tff.templates.MeasuredProcessOutput(
        state=new_state, result=mean, measurements=measurements
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)


def _guarded(mean: list, noises: list, flat: list, round_index, clip) -> list:
  """The mean, after an assertion that the noise, the sum and the mean are finite (the runtime
  guard of `create`)."""
  finite_noise, finite_sum, finite_mean = _all_finite(noises), _all_finite(flat), _all_finite(mean)
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
      tf.cast(clip, tf.float64),
      'times the number of clients).',
    ],
  )
  with tf.control_dependencies([guard]):
    return [tf.identity(m) for m in mean]


def resolve_adaptive(clip_norm: Any, clients_per_round: Any) -> Optional[adaptive_lib.AdaptiveClip]:
  """The adaptive clip of a `clip_norm` argument, its z_b resolved (None for a fixed clip norm).

  'adaptive' is `AdaptiveClip()`; without a count noise multiplier, Andrew et al.'s m/10 for
  m = clients_per_round. A budget fraction needs the strategy's sensitivity: calibrate with
  `fedmf.privacy.accounting.calibrate_noise_multiplier(..., count_budget_fraction=f)` and pass its
  count noise multiplier.
  """
  if isinstance(clip_norm, str):
    if clip_norm != 'adaptive':
      raise FedmfUserError(
        f"clip_norm must be a number > 0, 'adaptive' or an AdaptiveClip, got {clip_norm[:40]!r}"
      )
    clip_norm = adaptive_lib.AdaptiveClip()
  if not isinstance(clip_norm, adaptive_lib.AdaptiveClip):
    return None
  clip = clip_norm.validate(prefix='clip_norm.')
  if clip.count_budget_fraction is not None:
    raise FedmfUserError(
      'clip_norm.count_budget_fraction needs the strategy and schema: get the count noise '
      'multiplier from fedmf.privacy.accounting.calibrate_noise_multiplier(..., '
      'count_budget_fraction=f) and pass AdaptiveClip(count_noise_multiplier=...)'
    )
  if clip.count_noise_multiplier is None:
    cpr = _finite_number(clients_per_round, 'clients_per_round', positive=True)
    clip = clip.with_count_noise(adaptive_lib.default_count_noise_multiplier(cpr))
  return clip


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
