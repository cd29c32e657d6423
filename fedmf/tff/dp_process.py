"""The DP mean as a TFF aggregation process with an adaptive clip and/or a record aggregation factory.

One concept: the production pieces of fedmf's DP mean (`fedmf.tff.dp_mean` holds its arithmetic),
as `tff.templates.AggregationProcess`es shared by the stateful factory (`fedmf.tff.aggregators`:
the noise stream's state in the aggregator's state) and the host-noise factory
(`fedmf.tff.host_noise`: the round's noise put in the state by the host). The noise comes from a
`NoiseSource`: `StreamNoise` draws it, `StateNoise` reads it. The fixed-clip process with
`tff.federated_sum` stays `fedmf.tff.aggregators.dp_mean_process` (its results stay the same bits);
`general_process` adds:

* adaptive clipping (`fedmf.privacy.adaptive_clip`; Andrew et al. 2021): ζ_t is in the state
  (float64), broadcast to the clients, who clip to it; the server scales the round's noise by
  ζ_t·σ and, when the source owns ζ (`StreamNoise`), releases the noisy count of clients within ζ_t
  and moves ζ (`fedmf.tff.adaptive_clip`); with `StateNoise` the host does that between rounds;
* a record aggregation factory (`fedmf.tff.record_sum`): the clipped records are summed by
  `SumFactory` or `SecureSumFactory` (with fedmf's quantization margin and scaling, and the counts
  summed securely too), and only then is the noise added.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

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
from fedmf.tff import dp_mean


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
    _, _, cpr = dp_mean.dp_mean_arguments(0.0, clip.initial, clients_per_round)
    clip = clip.with_count_noise(adaptive_lib.default_count_noise_multiplier(cpr))
  return clip


@dataclasses.dataclass(frozen=True)
class DPMean:
  """A DP mean's parameters: σ, a fixed ζ or an adaptive clip, B, and what sums the records."""

  noise_multiplier: float
  clip_norm: float  # ζ of a fixed clip; the initial ζ of an adaptive one
  clients_per_round: float
  adaptive: Optional[adaptive_lib.AdaptiveClip] = None
  records: Optional[record_sum.RecordSum] = None

  @classmethod
  def of(
    cls, noise_multiplier: Any, clip_norm: Any, clients_per_round: Any, record_factory: Any = None
  ) -> 'DPMean':
    """Checked arguments: `clip_norm` a number, 'adaptive' or an `AdaptiveClip`."""
    adaptive = resolve_adaptive(clip_norm, clients_per_round)
    clip, scale, cpr = dp_mean.dp_mean_arguments(
      noise_multiplier, clip_norm if adaptive is None else adaptive.initial, clients_per_round
    )
    sigma = float(noise_multiplier)  # (checked finite and >= 0 by dp_mean_arguments)
    return cls(sigma, clip, cpr, adaptive, record_sum.RecordSum.of(record_factory))

  @property
  def fixed_scale(self) -> float:
    """ζσ of a fixed clip, as the fixed-clip process computes it."""
    return self.clip_norm * self.noise_multiplier


@dataclasses.dataclass(frozen=True)
class StreamNoise:
  """The noise of the stateful factory: drawn from the stream, its state in the aggregator's;
  ζ moves in the aggregator too."""

  stream: streaming.NoiseStream
  seed: Optional[np.ndarray]  # the int64[2] key, or None: drawn at initialize()
  owns_clip: bool = True

  def init(self, specs) -> collections.OrderedDict:
    if self.seed is None:
      # Drawn anew by every `initialize` call from OS entropy, so the secret never appears in the
      # serialized computation (see `fedmf.tff.aggregators`).
      seed = tf.raw_ops.NonDeterministicInts(shape=[2], dtype=tf.int64)
    else:
      seed = tf.constant(self.seed, tf.int64)
    return collections.OrderedDict(seed=seed, noise=self.stream.init(specs, noise_lib.TF_OPS))

  def draw(self, state, specs):
    """(round t's unit noise, ‖row_t of C⁻¹‖, t, the new state's noise fields)."""
    noise_state = state['noise']
    round_index = noise_state[0]  # Every stream state starts with its round t.
    with tf.control_dependencies(noise_lib.horizon_checks(self.stream, round_index)):
      round_index = tf.identity(round_index)
      row_norm = self.stream.row_norm(noise_state, noise_lib.TF_OPS)
      noises, new_noise_state = self.stream.step(
        noise_state, noise_lib.round_draws(state['seed'], round_index, specs), noise_lib.TF_OPS
      )
    fields = collections.OrderedDict(seed=state['seed'], noise=new_noise_state)
    return noises, row_norm, round_index, fields


@dataclasses.dataclass(frozen=True)
class StateNoise:
  """The noise of the host-noise factory: round t's unit noise, put in the state by the host
  (with ζ_t, which the host moves between rounds)."""

  owns_clip: bool = False

  def init(self, specs) -> collections.OrderedDict:
    return collections.OrderedDict(noise=[tf.zeros(s.shape, s.dtype) for s in specs])

  def draw(self, state, specs):
    del specs
    noises = tf.nest.flatten(state['noise'])
    return noises, None, None, collections.OrderedDict(noise=state['noise'])


def general_process(value_type, dp: DPMean, source) -> tff.templates.AggregationProcess:
  """The DP mean with an adaptive clip and/or a record aggregation factory (module docstring).

  State: the DP state OrderedDict(<the source's fields>[, clip]) (clip: ζ_t, float64), or with a
  record factory OrderedDict(dp=<that>, records=<the factory's state>). A round: ζ_t to the
  clients, clip to ζ_t (× 1 − m under a secure sum) and scale to the secure bound, sum the records
  with the factory (else `tff.federated_sum`) and the 0/1 flags (securely under a secure sum); at
  the server unscale, add ζ_t·σ·(the source's noise), divide by B and, when the source owns ζ,
  release the noisy count for ζ_{t+1}. Measurements: round, clipped_count, zeroed_count,
  noise_stddev (stream noise), clients, and clip_norm, unclipped_fraction (adaptive); with a record
  factory OrderedDict(dp=<those>, record_aggregation=<the factory's>).
  """
  specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)
  specs = tf.nest.flatten(specs_struct)
  cpr, adaptive, records = dp.clients_per_round, dp.adaptive, dp.records
  entries = sum(int(np.prod(spec.shape)) for spec in specs)
  secure = None if records is None or records.secure is None else records.secure
  if secure is not None:  # As TFF's process uses them: in the values' dtype.
    dtypes = {spec.dtype for spec in specs}
    if len(dtypes) != 1:
      raise FedmfUserError(
        f'a SecureSumFactory sums tensors of one dtype; the values have {sorted(map(str, dtypes))}'
      )
    secure = secure.as_dtype(dtypes.pop().as_numpy_dtype)
  bound = None if secure is None else secure.bound
  clip_factor = 1.0 if secure is None else 1.0 - secure.margin(entries)
  fixed_clip, fixed_scale, sigma = dp.clip_norm, dp.fixed_scale, dp.noise_multiplier
  # Records are scaled to the secure bound B unless ζ is fixed and B up to float32 rounding.
  scaled = secure is not None and (
    adaptive is not None or not (fixed_clip <= bound <= fixed_clip * (1.0 + 2.0**-22))
  )
  step = None
  if adaptive is not None and source.owns_clip:
    step = adaptive_tf.clip_step(
      adaptive, adaptive_tf.count_stddev(adaptive.count_noise_multiplier)
    )

  @tff.tensorflow.computation
  def init_tf():
    state = source.init(specs)
    if adaptive is not None:
      state['clip'] = tf.constant(adaptive.initial, tf.float64)
    return state

  dp_state_type = init_tf.type_signature.result

  @tff.tensorflow.computation(dp_state_type)
  def client_params_tf(state):
    # (ζ_t·(1 − m), B/ζ_t): what the clients clip to and scale their record by.
    clip = state['clip'] if adaptive is not None else tf.constant(fixed_clip, tf.float64)
    scale = tf.constant(bound, tf.float64) / clip if scaled else tf.constant(1.0, tf.float64)
    return (clip * clip_factor if clip_factor != 1.0 else clip), scale

  @tff.tensorflow.computation(value_type, np.float64, np.float64)
  def clip_tf(value, clip, scale):
    flat, was_clipped, was_zeroed = clipping.clip_update(dp_mean.flatten(value), clip)
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
    flat = dp_mean.flatten(total)
    clip = state['clip'] if adaptive is not None else None
    if scaled:  # Back from the secure bound B to ζ_t.
      unscale = clip / bound if adaptive is not None else fixed_clip / bound
      flat = [t * tf.cast(unscale, t.dtype) for t in flat]
    noises, row_norm, round_index, new_state = source.draw(state, specs)
    scale = clip * sigma if adaptive is not None else fixed_scale
    mean = dp_mean.noised_mean(flat, noises, scale, cpr)
    mean = dp_mean.guarded(
      mean,
      noises,
      flat,
      -1 if round_index is None else round_index,
      fixed_clip if clip is None else clip,
    )
    measurements = collections.OrderedDict(clipped_count=clipped_count, zeroed_count=zeroed_count)
    if round_index is not None:
      measurements['round'] = round_index
      measurements['noise_stddev'] = tf.cast(scale * row_norm / cpr, tf.float32)
    measurements['clients'] = clients
    if adaptive is not None:
      measurements['clip_norm'] = clip
      new_state['clip'] = clip
      if step is not None:
        within = clients - clipped_count - zeroed_count
        fraction, new_clip = step(state['seed'], round_index, clip, within, clients)
        new_state['clip'] = new_clip
        measurements['unclipped_fraction'] = fraction
    return new_state, tf.nest.pack_sequence_as(specs_struct, mean), measurements

  counts = (count_type, count_type, count_type)
  record_process = None if records is None else records.factory.create(sum_type)
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
    state = tff.federated_eval(init_tf, tff.SERVER)
    if record_process is None:
      return state
    return tff.federated_zip(collections.OrderedDict(dp=state, records=record_process.initialize()))

  @tff.federated_computation(
    init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
  )
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
    new_state = new_dp
    if record_process is not None:
      new_state = tff.federated_zip(collections.OrderedDict(dp=new_dp, records=record_state))
      measurements = tff.federated_zip(
        collections.OrderedDict(dp=measurements, record_aggregation=record_measurements)
      )
    return tff.templates.MeasuredProcessOutput(
      state=new_state, result=mean, measurements=measurements
    )

  return tff.templates.AggregationProcess(init_fn, next_fn)
