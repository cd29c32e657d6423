"""The canary wrapper for users' own TFF loops (`fedmf.tff.canary_factory`): the canaries it adds
and projects in TensorFlow are the numpy directions' own, and in a 10-round FedAvg loop with the
BLT aggregator its estimate agrees with `fedmf simulate`'s on the same settings."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.cli import main as cli_main
from fedmf.mf import strategies as st
from fedmf.privacy import accounting
from fedmf.tff import build_dp_aggregator, canary_factory

BLT = {'mechanism': 'blt', 'buf_decay': [0.9, 0.5], 'output_scale': [0.2, 0.3]}
VALUE_TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [300]), tff.TensorType(np.float32, [50, 5])], list
)
ROUNDS, MIN_SEP, SIGMA, CLIP, CPR = 10, 4, 1.2, 0.5, 3


def _factory(sigma, count=40, held_out=40, **kwargs):
  inner = build_dp_aggregator(
    BLT, noise_multiplier=sigma, clip_norm=CLIP, clients_per_round=CPR, noise_seed=2
  )
  return canary_factory(
    inner, count=count, held_out=held_out, seed=7, num_rounds=ROUNDS, strategy=BLT,
    min_sep=MIN_SEP, **kwargs,
  )  # fmt: skip


def test_canaries_added_and_projected_as_the_numpy_directions(tff_context):
  factory = _factory(0.0)  # no noise: the mean is the canaries' alone
  process = factory.create(VALUE_TYPE)
  assert factory.rounds == (0, 4, 8)  # BLT Thm 3.1's π* for b = 4
  state = process.initialize()
  zeros = [[np.zeros(300, np.float32), np.zeros((50, 5), np.float32)]] * 2
  for r in range(ROUNDS):
    out = process.next(state, zeros)
    state = out.state
    expected = np.where(factory.design.inserted, float(r in factory.rounds), 0.0)
    measured = out.measurements['canaries']
    assert measured['round'] == r
    np.testing.assert_allclose(measured['projections'], expected, atol=1e-5)
    mean = [np.asarray(t, np.float64) for t in out.result]
    coefficients = expected * CLIP / CPR
    want = [np.zeros((300,)), np.zeros((50, 5))]
    factory.directions.add(want, coefficients)
    for got, w in zip(mean, want):
      np.testing.assert_allclose(got, w, atol=1e-6)
    assert 'noise_stddev' in out.measurements['dp']


def _model_fn():
  keras_model = tf.keras.Sequential(
    [tf.keras.layers.InputLayer(input_shape=(40,)), tf.keras.layers.Dense(30)]
  )
  return tff.learning.models.from_keras_model(
    keras_model,
    input_spec=(tf.TensorSpec([None, 40], tf.float32), tf.TensorSpec([None, 1], tf.int32)),
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
  )


def _client_data(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(8, 40)).astype(np.float32)
  y = rng.integers(0, 30, size=(8, 1)).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


def _fed_avg_estimate(weighted):
  factory = _factory(SIGMA, count=300, held_out=300)
  build = (
    tff.learning.algorithms.build_weighted_fed_avg
    if weighted
    else tff.learning.algorithms.build_unweighted_fed_avg
  )
  aggregator = tff.aggregators.as_weighted_aggregator(factory) if weighted else factory
  process = build(
    _model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
    model_aggregator=aggregator,
  )
  state = process.initialize()
  initial = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  projections = []
  for r in range(ROUNDS):
    out = process.next(state, [_client_data(r), _client_data(r + 100), _client_data(r + 200)])
    state = out.state
    projections.append(out.metrics['aggregator']['canaries']['projections'])
  final = [np.asarray(w) for w in process.get_model_weights(state).trainable]
  return factory.estimate(
    projections, strategy=BLT, noise_multiplier=SIGMA, delta=1e-6,
    initial_weights=initial, final_weights=final,
  )  # fmt: skip


@pytest.fixture(scope='module')
def simulate_estimate(tmp_path_factory):
  """`fedmf simulate` on the same settings: BLT, n = 10, b = 4, σ, 600 worst-case canaries."""
  root = tmp_path_factory.mktemp('canary_simulate')
  strategy = root / 'blt.json'
  strategy.write_text(json.dumps(BLT))
  os.environ['FEDMF_CACHE_DIR'] = str(root / 'cache')
  args = ['simulate', '--out', str(root / 'run'), '--no-progress']
  for item in [
    'task=synthetic', 'num_clients=60', 'vocab_size=40', f'rounds={ROUNDS}',
    f'clients_per_round={CPR}', f'reference_clients_per_round={CPR}', 'max_sentences_per_client=8',
    'test_sentences=32', 'eval_every=5', f'participation.min_sep={MIN_SEP}', f'strategy={strategy}',
    'force_strategy=true', f'noise_multiplier={SIGMA}', f'clip_norm={CLIP}', 'canaries.count=300',
    'canaries.held_out=300', 'canaries.pattern=worst-case', 'canaries.seed=7', 'noise_seed=2',
  ]:  # fmt: skip
    args += ['--set', item]
  assert cli_main.main(args) == 0
  return json.loads((root / 'run' / 'audit.json').read_text())['empirical']['all_releases']


@pytest.mark.parametrize('weighted', [False, True])
def test_fed_avg_estimate_agrees_with_fedmf_simulate(tff_context, simulate_estimate, weighted):
  result = _fed_avg_estimate(weighted)
  e = result.estimates['all_releases']
  analytic = (
    np.linalg.norm(st.load_strategy(BLT).matrix(ROUNDS) @ np.isin(range(ROUNDS), [0, 4, 8])) / SIGMA
  )
  assert e.analytic_mu == pytest.approx(analytic)
  assert e.analytic_epsilon == pytest.approx(accounting.gaussian_epsilon(analytic, 1e-6))
  assert e.analytic_mu == pytest.approx(simulate_estimate['analytic_mu'])
  # Within the estimators' stated error (three standard errors of the difference).
  gap = abs(e.fit.mu - simulate_estimate['mu_estimate'])
  assert gap <= 3 * np.hypot(e.fit.mu_stderr, simulate_estimate['mu_stderr'])
  assert abs(e.fit.mu - analytic) <= 3 * e.fit.mu_stderr
  assert e.lower.epsilon <= e.analytic_epsilon and not result.failures()
  assert 'final_model' in result.estimates


def test_bad_arguments_are_refused():
  inner = build_dp_aggregator(BLT, noise_multiplier=1.0, clip_norm=1.0, clients_per_round=2)
  with pytest.raises(Exception, match="needs strategy"):
    canary_factory(inner, count=2, held_out=2, seed=0, num_rounds=5)
  with pytest.raises(Exception, match="must lie in"):
    canary_factory(inner, count=2, held_out=2, seed=0, num_rounds=5, pattern=[7])
  with pytest.raises(Exception, match="clip_norm and clients_per_round"):
    canary_factory(tff.aggregators.SumFactory(), count=2, held_out=2, seed=0, num_rounds=5,
                   pattern=[0])  # fmt: skip
  # An adaptive clip moves ζ inside the aggregator: canaries at one ζ would be mis-scaled.
  adaptive = build_dp_aggregator(
    BLT, noise_multiplier=1.0, clip_norm="adaptive", clients_per_round=2
  )
  with pytest.raises(Exception, match="adaptive clip"):
    canary_factory(adaptive, count=2, held_out=2, seed=0, num_rounds=5, strategy=BLT)
