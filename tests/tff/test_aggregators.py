"""The DP aggregator: noise covariance, restore, clipping, FedAvg integration."""

import collections
import copy

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.tff import build_dp_aggregator
from fedmf.mf import strategies as st
from fedmf.mf import tree
from fedmf.tff import learning

SIGMA, CLIP, CPR = 1.5, 0.7, 4
SCALE = SIGMA * CLIP / CPR  # std of the mean's noise per unit of C⁻¹ row norm.
D = 2000  # coordinates per round: the sample size of every variance check.
ROUNDS = 6


def _bandmf(n, bands, seed=0):
  rng = np.random.default_rng(seed)
  cols = [list(rng.uniform(0.2, 1.0, min(bands, n - j))) for j in range(n)]
  return st.load_strategy({'mechanism': 'bandmf', 'n': n, 'bands': bands, 'columns': cols})


BLT = {
  'mechanism': 'blt',
  'buf_decay': [0.95, 0.6, 0.2, 0.05],
  'output_scale': [0.3, 0.2, 0.1, 0.05],
}
BANDMF = _bandmf(ROUNDS, 3)
TOEPLITZ = {
  'mechanism': 'band-toeplitz',
  'coefficients': [1.0, 0.6, 0.3],
  'column_normalized': True,
}
LINEAR = {'dpsgd': {'mechanism': 'dpsgd'}, 'blt': BLT, 'bandmf': BANDMF, 'band-toeplitz': TOEPLITZ}
ALL = dict(
  LINEAR,
  tree={'mechanism': 'tree', 'variant': 'online-honaker'},
  **{'tree-vanilla': {'mechanism': 'tree', 'variant': 'vanilla'}},
)

VALUE_TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [D // 2]), tff.TensorType(np.float32, [D // 4, 2])], list
)


def _zeros(clients=2):
  return [
    [np.zeros([D // 2], np.float32), np.zeros([D // 4, 2], np.float32)] for _ in range(clients)
  ]


def _flat(result):
  return np.concatenate([np.asarray(t, np.float64).ravel() for t in result])


def _run(process, rounds, values, state=None):
  state = process.initialize() if state is None else state
  outs, meas = [], []
  for _ in range(rounds):
    out = process.next(state, values)
    state = out.state
    outs.append(_flat(out.result))
    meas.append(out.measurements)
  return np.stack(outs), meas, state


def _apply_c(name, noise_rows):
  """x = C y over the rounds (y: rounds × D), C as the loader normalizes it at n = ROUNDS."""
  return st.load_strategy(LINEAR[name]).matrix(ROUNDS) @ noise_rows


@pytest.mark.parametrize('name', sorted(LINEAR))
def test_noise_covariance_is_scaled_c_inverse(tff_context, name):
  factory = build_dp_aggregator(
    LINEAR[name],
    noise_multiplier=SIGMA,
    clip_norm=CLIP,
    clients_per_round=CPR,
    noise_seed=11,
    num_rounds=ROUNDS,
  )
  outs, meas, _ = _run(factory.create(VALUE_TYPE), ROUNDS, _zeros())
  # Noise of the mean = SCALE·C⁻¹z, so C·outs/SCALE must be i.i.d. N(0, 1).
  white = _apply_c(name, outs) / SCALE
  # Tolerances: 5 standard errors. Var of a sample variance of m normals is
  # 2/m; a sample correlation has std 1/sqrt(m).
  m = white.size
  assert abs(white.mean()) < 5 / np.sqrt(m)
  assert abs(white.var() - 1.0) < 5 * np.sqrt(2.0 / m)
  for i in range(ROUNDS):
    assert abs(white[i].var() - 1.0) < 5 * np.sqrt(2.0 / D)
  corr = np.corrcoef(white)
  off = corr[~np.eye(ROUNDS, dtype=bool)]
  assert np.max(np.abs(off)) < 5 / np.sqrt(D)
  # Reported per-round std matches the raw outputs' empirical std.
  stds = np.array([mm['noise_stddev'] for mm in meas])
  for i in range(ROUNDS):
    assert abs(outs[i].var() / stds[i] ** 2 - 1.0) < 5 * np.sqrt(2.0 / D)
  assert [mm['round'] for mm in meas] == list(range(ROUNDS))
  assert all(set(mm) == {'round', 'clipped_count', 'zeroed_count', 'noise_stddev'} for mm in meas)


@pytest.mark.parametrize('variant', ['online-honaker', 'vanilla'])
def test_tree_per_round_variance_matches_decoder(tff_context, variant):
  rounds = 8
  factory = build_dp_aggregator(
    {'mechanism': 'tree', 'variant': variant},
    noise_multiplier=SIGMA,
    clip_norm=CLIP,
    clients_per_round=CPR,
    noise_seed=5,
  )
  outs, meas, _ = _run(factory.create(VALUE_TYPE), rounds, _zeros())
  expected = SCALE**2 * np.sum(tree.per_round_decoder(rounds, variant) ** 2, axis=1)
  for i in range(rounds):
    assert abs(outs[i].var() / expected[i] - 1.0) < 5 * np.sqrt(2.0 / D)
  np.testing.assert_allclose([mm['noise_stddev'] for mm in meas], np.sqrt(expected), rtol=1e-6)


@pytest.mark.parametrize('name', ['blt', 'bandmf', 'tree', 'dpsgd'])
def test_restore_from_state_is_bit_identical(tff_context, name):
  factory = build_dp_aggregator(
    ALL[name],
    noise_multiplier=SIGMA,
    clip_norm=CLIP,
    clients_per_round=CPR,
    noise_seed=None,
    num_rounds=ROUNDS,
  )
  process = factory.create(VALUE_TYPE)
  rng = np.random.default_rng(3)
  values = [
    [rng.normal(size=[D // 2]).astype(np.float32), rng.normal(size=[D // 4, 2]).astype(np.float32)]
    for _ in range(3)
  ]
  first, _, state2 = _run(process, 2, values)
  saved = copy.deepcopy(state2)  # The "checkpoint".
  rest, _, _ = _run(process, 3, values, state=state2)
  resumed, _, _ = _run(process, 3, values, state=saved)
  assert np.array_equal(rest, resumed)
  assert not np.array_equal(rest[0], rest[1])
  # A missing seed is drawn per initialize(): different runs differ.
  other, _, _ = _run(process, 1, values)
  assert not np.array_equal(other[0], first[0])


def test_adversarial_updates_are_clipped_or_zeroed(tff_context):
  factory = build_dp_aggregator(
    {'mechanism': 'dpsgd'},
    noise_multiplier=0.0,
    clip_norm=CLIP,
    clients_per_round=CPR,
    noise_seed=1,
  )
  vt = tff.StructWithPythonType(
    [tff.TensorType(np.float32, [2]), tff.TensorType(np.float32, [1])], list
  )
  process = factory.create(vt)
  f32 = lambda *x: np.array(x, np.float32)
  clients = [
    [f32(3e38, 3e38), f32(0.0)],  # huge: squares overflow float32
    [f32(np.nan, 0.0), f32(1.0)],  # NaN
    [f32(0.0, 0.0), f32(np.inf)],  # +Inf
    [f32(-np.inf, 1.0), f32(0.0)],  # -Inf
    [f32(0.1, 0.0), f32(0.0)],  # small: unchanged
    [f32(0.0, 0.0), f32(5.0)],  # clipped to CLIP
  ]
  out = process.next(process.initialize(), clients)
  result = _flat(out.result)
  expected = (
    np.array([CLIP / np.sqrt(2), CLIP / np.sqrt(2), 0.0])
    + np.array([0.1, 0.0, 0.0])
    + np.array([0.0, 0.0, CLIP])
  ) / CPR
  np.testing.assert_allclose(result, expected, rtol=1e-6)
  assert out.measurements['clipped_count'] == 2
  assert out.measurements['zeroed_count'] == 3
  assert out.measurements['noise_stddev'] == 0.0


def test_bandmf_past_horizon_raises(tff_context):
  factory = build_dp_aggregator(
    _bandmf(2, 2), noise_multiplier=1.0, clip_norm=1.0, clients_per_round=1, noise_seed=0
  )
  vt = tff.TensorType(np.float32, [3])
  process = factory.create(vt)
  state = process.initialize()
  for _ in range(2):
    state = process.next(state, [np.zeros(3, np.float32)]).state
  with pytest.raises(Exception, match='built for n=2 rounds'):
    process.next(state, [np.zeros(3, np.float32)])


def _model_fn():
  keras_model = tf.keras.Sequential(
    [
      tf.keras.layers.InputLayer(input_shape=(3,)),
      tf.keras.layers.Dense(2, kernel_initializer='zeros'),
    ]
  )
  return tff.learning.models.from_keras_model(
    keras_model,
    input_spec=(tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.int32)),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )


def _client_data(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(8, 3)).astype(np.float32)
  y = (x[:, :1] > 0).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


@pytest.mark.parametrize(
  'name,weighted',
  [('dpsgd', False), ('blt', True), ('bandmf', False), ('band-toeplitz', False), ('tree', False)],
)
def test_fed_avg_runs_with_each_mechanism(tff_context, name, weighted):
  strategy = _bandmf(3, 2) if name == 'bandmf' else ALL[name]
  process = learning.build_dp_fed_avg(
    _model_fn,
    strategy,
    noise_multiplier=0.5,
    clip_norm=1.0,
    clients_per_round=2,
    noise_seed=4,
    num_rounds=3,
    weighted=weighted,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
  )
  state = process.initialize()
  data = [_client_data(0), _client_data(1)]
  for r in range(3):
    out = process.next(state, data)
    state = out.state
    agg = out.metrics['aggregator']
    assert agg['round'] == r
    assert agg['noise_stddev'] > 0
  weights = process.get_model_weights(state).trainable
  assert all(np.all(np.isfinite(w)) for w in weights)


def test_missing_seed_is_unpredictable_even_with_a_global_tf_seed(tff_context):
  # Programs often fix TF's global seed (tf.random.set_seed, Keras' set_random_seed). The noise
  # seed must not follow it: two processes built under the same global seed must differ.
  seeds = []
  for _ in range(2):
    tf.random.set_seed(1234)
    factory = build_dp_aggregator(
      ALL['dpsgd'], noise_multiplier=SIGMA, clip_norm=CLIP, clients_per_round=CPR
    )
    seeds.append(np.asarray(factory.create(VALUE_TYPE).initialize()['seed']))
  assert not np.array_equal(seeds[0], seeds[1])
