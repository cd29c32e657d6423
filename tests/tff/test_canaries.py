"""The canary wrapper for users' own TFF loops (`fedmf.tff.canary_factory`): the canaries it adds
and projects in TensorFlow are the numpy directions' own; around `build_dp_aggregator` of every
mechanism it measures the μ the noise has; and in 10-round unweighted and weighted FedAvg loops
with the BLT aggregator (deploy/canary_example.py) its estimate agrees with `fedmf simulate`'s on
the same settings."""

import json
import os

import numpy as np
import pytest
import tensorflow_federated as tff

from fedmf.cli import main as cli_main
from fedmf.mf import strategies as st
from fedmf.privacy import gaussian_curve
from fedmf.tasks.synthetic import SyntheticTask
from fedmf.tff import build_dp_aggregator, canary_factory
from tests.helpers import load_script
from tests.mf.brute_force import brute_force_patterns

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


def _bandmf(n, bands, seed=0):
  rng = np.random.default_rng(seed)
  cols = [list(rng.uniform(0.2, 1.0, min(bands, n - j))) for j in range(n)]
  return st.load_strategy({'mechanism': 'bandmf', 'n': n, 'bands': bands, 'columns': cols})


MECHANISMS = {
  'dpsgd': {'mechanism': 'dpsgd'},
  'blt': BLT,
  'bandmf': _bandmf(ROUNDS, 3),  # b̂ = 3 ≤ b = 4: VecSens is the exact sensitivity (BandMF Thm 2)
  'tree': {'mechanism': 'tree', 'variant': 'online-honaker'},
}
WIDE_TYPE = tff.StructWithPythonType(  # 1100 parameters: N = 1024 canary directions
  [tff.TensorType(np.float32, [700]), tff.TensorType(np.float32, [50, 8])], list
)


@pytest.mark.parametrize('mechanism', MECHANISMS)
def test_every_mechanism_measures_its_pattern(tff_context, mechanism):
  """The wrapper around `build_dp_aggregator` of each mechanism, 10 rounds of zero updates: its
  canaries take the brute-force worst pattern, and the library estimate of the projections finds
  the μ the noise really has: the analytic ‖C 1_π‖/σ for a square C; for the tree, whose
  per-round releases are a post-processing of its nodes, √(1_πᵀ (P Pᵀ)⁻¹ 1_π)/σ ≤ the analytic."""
  strategy = st.load_strategy(MECHANISMS[mechanism])
  inner = build_dp_aggregator(
    strategy, noise_multiplier=SIGMA, clip_norm=CLIP, clients_per_round=CPR, noise_seed=3,
    num_rounds=ROUNDS,
  )  # fmt: skip
  factory = canary_factory(
    inner, count=400, held_out=400, seed=5, num_rounds=ROUNDS, strategy=strategy, min_sep=MIN_SEP
  )
  process = factory.create(WIDE_TYPE)
  state = process.initialize()
  zeros = [[np.zeros(700, np.float32), np.zeros((50, 8), np.float32)]] * 2
  projections = []
  for _ in range(ROUNDS):
    out = process.next(state, zeros)
    state = out.state
    projections.append(out.measurements['canaries']['projections'])
  c = strategy.matrix(ROUNDS)
  best = max(
    np.linalg.norm(c @ np.isin(range(ROUNDS), p)) for p in brute_force_patterns(ROUNDS, MIN_SEP)
  )
  pattern = np.isin(range(ROUNDS), factory.rounds).astype(float)
  assert np.linalg.norm(c @ pattern) == pytest.approx(best, rel=1e-9)

  result = factory.estimate(projections, strategy=strategy, noise_multiplier=SIGMA, delta=1e-6)
  e = result.estimates['all_releases']
  assert e.analytic_mu == pytest.approx(best / SIGMA)
  p = strategy.per_round_noise_matrix(ROUNDS)
  measurable = np.sqrt(pattern @ np.linalg.solve(p @ p.T, pattern)) / SIGMA
  if mechanism == 'tree':
    assert measurable < e.analytic_mu * (1 - 1e-3)  # 0.95 of it here
  else:
    assert measurable == pytest.approx(e.analytic_mu, rel=1e-9)
  assert abs(e.fit.mu - measurable) <= 3 * e.fit.mu_stderr
  held = result.scores['all_releases'][~result.inserted_mask]
  assert abs(held.mean()) <= 3 / np.sqrt(held.size) and abs(held.std() - 1) <= 0.15
  assert e.lower.epsilon <= e.analytic_epsilon and not result.failures()


def _example():
  return load_script('deploy/canary_example.py')


def _fed_avg_estimate(weighted):
  """deploy/canary_example.py's loop on `fedmf simulate`'s settings below."""
  example = _example()
  task = SyntheticTask(
    num_clients=60, vocab_size=40, preset='lstm-small', sequence_length=20, batch_size=16,
    max_sentences=8, test_sentences=32, seed=0,
  )  # fmt: skip
  return example.run(
    task, BLT, rounds=ROUNDS, clients_per_round=CPR, delta=1e-6, noise_multiplier=SIGMA,
    clip_norm=CLIP, min_sep=MIN_SEP, canaries=300, held_out=300, seed=7, weighted=weighted,
    noise_seed=2,
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
  assert e.analytic_epsilon == pytest.approx(gaussian_curve.gaussian_epsilon(analytic, 1e-6))
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
