"""The aggregator factory refuses bad seeds and numbers in one line, and a non-finite noise or mean
stops training in the round it appears (issue 14)."""

import dataclasses

import numpy as np
import pytest
import tensorflow_federated as tff

from fedmf.errors import FedmfUserError
from fedmf.mf import streaming
from fedmf.tff import aggregators, build_dp_aggregator, dp_mean

DPSGD = {'mechanism': 'dpsgd'}
VT = tff.TensorType(np.float32, [3])


@pytest.mark.parametrize('seed', [-1, 2**64, 2**130, 1.0, '5', True, [5]])
def test_seeds_outside_64_bits_or_not_integers_are_refused(seed):
  with pytest.raises(FedmfUserError, match=r'noise_seed must be an integer in \[0, 2\^64\)'):
    build_dp_aggregator(
      DPSGD, noise_multiplier=1.0, clip_norm=1.0, clients_per_round=1, noise_seed=seed
    )


def test_seed_keys_are_distinct_and_unchanged_below_2_63():
  keys = {s: tuple(dp_mean.seed_key(s)) for s in (0, 1, 2**63 - 1, 2**63, 2**64 - 1)}
  assert len(set(keys.values())) == len(keys)
  assert keys[0] == (0, 0) and keys[2**63 - 1] == (2**63 - 1, 0)  # as before this change
  assert keys[2**64 - 1] == (2**63 - 1, 1)  # the top bit is kept
  assert tuple(dp_mean.seed_key(np.uint64(2**64 - 1))) == keys[2**64 - 1]


def _noise(seed):
  process = build_dp_aggregator(
    DPSGD, noise_multiplier=1.0, clip_norm=1.0, clients_per_round=1, noise_seed=seed
  ).create(VT)
  return np.asarray(process.next(process.initialize(), [np.zeros(3, np.float32)]).result)


def test_the_top_seed_bit_changes_the_noise(tff_context):
  low, high = _noise(2**63 - 1), _noise(2**64 - 1)
  assert np.all(np.isfinite(low)) and not np.array_equal(low, high)
  np.testing.assert_array_equal(_noise(2**64 - 1), high)  # still a pure function of the seed


@pytest.mark.parametrize(
  'kwargs, name',
  [
    ({'noise_multiplier': '1.0'}, 'noise_multiplier'),
    ({'noise_multiplier': float('nan')}, 'noise_multiplier'),
    ({'clip_norm': True}, 'clip_norm'),
    ({'clip_norm': float('inf')}, 'clip_norm'),
    ({'clients_per_round': 0}, 'clients_per_round'),
    ({'clients_per_round': [1]}, 'clients_per_round'),
  ],
)
def test_numbers_of_the_wrong_type_or_range_are_one_line_errors(kwargs, name):
  args = {'noise_multiplier': 1.0, 'clip_norm': 1.0, 'clients_per_round': 1} | kwargs
  with pytest.raises(FedmfUserError, match=f'{name} must be a finite number') as info:
    build_dp_aggregator(DPSGD, **args)
  assert '\n' not in str(info.value)


def test_an_overflowing_aggregate_stops_training_in_its_round(tff_context):
  """Finite, unclipped updates whose float32 sum overflows: round 1 fails, naming round 1."""
  factory = build_dp_aggregator(
    DPSGD, noise_multiplier=0.0, clip_norm=3e38, clients_per_round=2, noise_seed=0
  )
  process = factory.create(VT)
  state = process.next(process.initialize(), [np.ones(3, np.float32)] * 2).state
  huge = np.array([2e38, 0.0, 0.0], np.float32)
  with pytest.raises(Exception, match=r'fedmf: round\] \[1\] .*not finite.*clipped sum:\] \[0\]'):
    process.next(state, [huge, huge])


@dataclasses.dataclass(frozen=True)
class _OverflowingStream(streaming.NoiseStream):
  """C = I, except that round 2's noise is inf: a stream that passed the loader and still fails."""

  def init(self, specs, ops):
    return (streaming.round_counter(ops),)

  def step(self, state, z, ops):
    in_round_2 = ops.cast(ops.is_first_round(state[0] - 2, ops.float64), z(0)[0].dtype)
    return [x / (1.0 - in_round_2) for x in z(0)], (state[0] + 1,)  # ±inf in round 2

  def row_norm(self, state, ops):
    return ops.constant(1.0, ops.float64)


def test_a_non_finite_noise_stops_training_in_its_round(tff_context):
  factory = aggregators.CorrelatedNoiseFactory(
    _OverflowingStream(), noise_multiplier=1.0, clip_norm=1.0, clients_per_round=1, noise_seed=3
  )
  process = factory.create(VT)
  state = process.initialize()
  for _ in range(2):
    state = process.next(state, [np.zeros(3, np.float32)]).state
  with pytest.raises(Exception, match=r'fedmf: round\] \[2\] .*Finite noise:\] \[0\]'):
    process.next(state, [np.zeros(3, np.float32)])


def test_non_finite_client_updates_are_still_zeroed_not_fatal(tff_context):
  process = build_dp_aggregator(
    DPSGD, noise_multiplier=0.0, clip_norm=1.0, clients_per_round=2, noise_seed=0
  ).create(VT)
  out = process.next(
    process.initialize(), [np.array([np.nan, np.inf, 1.0], np.float32), np.full(3, 0.5, np.float32)]
  )
  np.testing.assert_allclose(out.result, [0.25, 0.25, 0.25])
  assert out.measurements['zeroed_count'] == 1
