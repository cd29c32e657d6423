"""The host path's noise is the aggregator's noise (issue 11): for every mechanism and the same
seed, `fedmf.tff.host_noise.HostNoise` (numpy kernels, host-side state) gives the
`tff.aggregators` factory's noise bit for bit, as computed inside TFF; the DP mean too; a restored
checkpoint continues the same stream; prefetching in a thread changes nothing."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.mf import strategies as st
from fedmf.mf import tree
from fedmf.program import server
from fedmf.tff import dp_mean
from fedmf.tff import host_noise
from fedmf.tff import build_dp_aggregator
from tests.mf.random_strategies import random_bandmf, random_dense

ROUNDS = 8  # The tree reaches height 3 (round 7 completes 4 nodes).
SHAPES = [(300,), (20, 7), ()]
SEED = 2**63 + 12345  # Uses both halves of the seed key.


EVERY = {
  'dpsgd': {'mechanism': 'dpsgd'},
  'blt': {
    'mechanism': 'blt',
    'buf_decay': [0.99, 0.9, 0.6, 0.2],
    'output_scale': [0.2, 0.1, 0.05, 0.02],
  },
  'bandmf': random_bandmf(ROUNDS, bands=4),
  'band-toeplitz': {'mechanism': 'band-toeplitz', 'coefficients': [1.5, 0.6, 0.3]},
  'band-toeplitz-normalized': {
    'mechanism': 'band-toeplitz',
    'coefficients': [1.0, 0.6, 0.3],
    'column_normalized': True,
  },
  'dense': random_dense(ROUNDS),
  **{f'tree-{v}': {'mechanism': 'tree', 'variant': v} for v in tree.STREAMING_VARIANTS},
}
VALUE_TYPE = tff.StructWithPythonType([tff.TensorType(np.float32, s) for s in SHAPES], list)


def _factory_rounds(name, rounds, values, *, sigma, clip, cpr):
  """The aggregator's per-round results (its DP mean) inside TFF, and its measurements."""
  process = build_dp_aggregator(
    EVERY[name],
    noise_multiplier=sigma,
    clip_norm=clip,
    clients_per_round=cpr,
    noise_seed=SEED,
    num_rounds=ROUNDS,
  ).create(VALUE_TYPE)
  state = process.initialize()
  results, stddevs = [], []
  for _ in range(rounds):
    out = process.next(state, values)
    state = out.state
    results.append([np.asarray(x) for x in out.result])
    stddevs.append(float(out.measurements['noise_stddev']))
  return results, stddevs


_NOISE = {}


def _factory_noise(name):
  """σ = ζ = B = 1 and zero updates: the factory's mean is (0 + 1·noise)·1, its noise itself."""
  if name not in _NOISE:
    zeros = [[np.zeros(s, np.float32) for s in SHAPES]]
    _NOISE[name] = _factory_rounds(name, ROUNDS, zeros, sigma=1.0, clip=1.0, cpr=1)[0]
  return _NOISE[name]


def _host(name, **kwargs):
  stream = st.load_strategy(EVERY[name]).noise_stream(ROUNDS)
  return host_noise.HostNoise(stream, SHAPES, seed=SEED, **kwargs)


def _assert_same(a, b, what):
  for t, (x, y) in enumerate(zip(a, b)):
    for k, (u, v) in enumerate(zip(x, y)):
      assert np.asarray(u).dtype == np.float32 and np.asarray(v).dtype == np.float32
      np.testing.assert_array_equal(u, v, err_msg=f'{what}: round {t} tensor {k}')


@pytest.mark.parametrize('name', sorted(EVERY))
def test_host_noise_is_the_factory_noise_bit_for_bit(tff_context, name):
  factory = _factory_noise(name)
  host = _host(name)
  ours = [host.next() for _ in range(ROUNDS)]
  assert not np.array_equal(ours[0][0], ours[1][0])
  _assert_same(ours, factory, name)
  # The same bits with the next round computed in a background thread.
  overlapped = _host(name, overlap=True)
  again = []
  for _ in range(ROUNDS):
    overlapped.prefetch()
    again.append(overlapped.next())
  overlapped.close()
  _assert_same(again, ours, name + ' (overlap)')


@pytest.mark.parametrize('name', ['blt', 'bandmf', 'tree-online-honaker', 'dpsgd'])
def test_host_server_mean_is_the_factory_mean_bit_for_bit(tff_context, name):
  sigma, clip, cpr, rounds = 1.7, 0.9, 3, 4
  rng = np.random.default_rng(1)
  update = [np.asarray(rng.uniform(-1, 1, s) * 1e-3, np.float32) for s in SHAPES]  # Norm < clip.
  factory, stddevs = _factory_rounds(name, rounds, [update], sigma=sigma, clip=clip, cpr=cpr)
  host = _host(name)
  state = server.initial_server_state([np.zeros(s) for s in SHAPES])
  for t in range(rounds):
    np.testing.assert_allclose(stddevs[t], clip * sigma * host.row_norm() / cpr, rtol=1e-6)
    mean = server.server_update(state, update, host.next(), clip * sigma, cpr, 1.0, 0.9)
    _assert_same([mean], [factory[t]], f'{name} mean round {t}')


@pytest.mark.parametrize('name', ['blt', 'bandmf', 'band-toeplitz', 'tree-online-honaker'])
@pytest.mark.parametrize('overlap', [False, True])
def test_resuming_from_a_checkpoint_continues_the_factory_stream(tff_context, name, overlap):
  factory = _factory_noise(name)
  first = _host(name, overlap=overlap)
  for _ in range(3):
    first.prefetch()
    first.next()
  saved = first.state()  # Copies: the run goes on and must not change the checkpoint.
  for _ in range(2):
    first.prefetch()
    first.next()
  first.close()
  resumed = _host(name, overlap=overlap)
  resumed.restore(saved)
  assert resumed.round == 3
  rest = []
  for _ in range(ROUNDS - 3):
    resumed.prefetch()
    rest.append(resumed.next())
  resumed.close()
  _assert_same(rest, factory[3:], name + ' resumed')


def test_state_is_refused_while_a_round_is_prefetched(tff_context):
  host = _host('blt', overlap=True)
  host.prefetch()
  with pytest.raises(RuntimeError, match='prefetched'):
    host.state()
  host.next()
  assert len(host.state()) == 1 + len(SHAPES) + 2
  host.close()


def test_host_draws_are_the_aggregator_draws():
  """The host's compiled draw is `round_draws` itself (eager), bit for bit."""
  from fedmf.tff import noise  # pylint: disable=import-outside-toplevel

  host = _host('dpsgd')
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  key = tf.constant(dp_mean.seed_key(SEED), tf.int64)
  for t, j in [(0, 0), (5, 2)]:
    eager = noise.round_draws(key, tf.constant(t, tf.int64), specs)(j)
    for x, y in zip(host._z(t)(j), eager):  # pylint: disable=protected-access
      np.testing.assert_array_equal(x, y.numpy())
