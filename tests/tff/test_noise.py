"""One stream definition, two backends: for every mechanism the TF stream equals the numpy stream,
and both equal C⁻¹Z (for the tree, the per-round decoder applied to the node noise)."""

import numpy as np
import pytest
import tensorflow as tf

from fedmf.mf import streaming
from fedmf.mf import strategies as st
from fedmf.mf import tree
from fedmf.tff import noise

N = 24
SHAPES = [(3, 2), (5,)]
TF_SPECS = [tf.TensorSpec(s, tf.float32) for s in SHAPES]


def _bandmf(n=N, bands=4, seed=0):
  rng = np.random.default_rng(seed)
  cols = [list(rng.uniform(0.2, 1.0, min(bands, n - j))) for j in range(n)]
  return st.load_strategy({'mechanism': 'bandmf', 'n': n, 'bands': bands, 'columns': cols})


def _dense(n=N, seed=1):
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(-0.3, 0.5, (n, n)))
  c[np.diag_indices(n)] = 1.0
  return {'mechanism': 'dense', 'matrix': c.tolist()}


LINEAR = {
  'dpsgd': {'mechanism': 'dpsgd'},
  'blt': {
    'mechanism': 'blt',
    'buf_decay': [0.95, 0.6, 0.2, 0.05],
    'output_scale': [0.3, 0.2, 0.1, 0.05],
  },
  'bandmf': _bandmf(),
  'band-toeplitz': {'mechanism': 'band-toeplitz', 'coefficients': [1.0, 0.5, 0.3, 0.2, 0.1]},
  'band-toeplitz-normalized': {
    'mechanism': 'band-toeplitz',
    'coefficients': [1.0, 0.5, 0.3],
    'column_normalized': True,
  },
  'dense': _dense(),
}
TREES = {f'tree-{v}': {'mechanism': 'tree', 'variant': v} for v in tree.STREAMING_VARIANTS}
EVERY = dict(LINEAR, **TREES)


def _draws(seed):
  """draws[t][j] = round t's j-th draw (float32, one array per shape); j < 7 covers N = 24."""
  rng = np.random.default_rng(seed)
  return [
    [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(7)]
    for _ in range(N)
  ]


def _run_tf(stream, draws):
  state = stream.init(TF_SPECS, noise.TF_OPS)
  outs, norms = [], []
  for round_draws in draws:
    norms.append(float(stream.row_norm(state, noise.TF_OPS)))
    z = lambda j, d=round_draws: [tf.constant(x) for x in d[int(j)]]
    out, state = stream.step(state, z, noise.TF_OPS)
    outs.append([o.numpy() for o in out])
  return outs, norms, state


@pytest.mark.parametrize('name', sorted(EVERY))
def test_tf_stream_equals_numpy_stream_equals_c_inverse_z(name):
  strategy = st.load_strategy(EVERY[name])
  stream = strategy.noise_stream(N)
  draws = _draws(seed=len(name))
  # The same definition on the two backends, both in float32: the same operations, the same bits.
  numpy32 = streaming.run(stream, draws, [streaming.Spec(s, np.float32) for s in SHAPES])
  tf32, norms, _ = _run_tf(stream, draws)
  for t in range(N):
    for k in range(len(SHAPES)):
      np.testing.assert_array_equal(tf32[t][k], numpy32[t][k], err_msg=f'round {t} tensor {k}')
  # Float64 numpy against the dense math.
  draws64 = [[[x.astype(np.float64) for x in d] for d in rd] for rd in draws]
  numpy64 = streaming.run(stream, draws64, [streaming.Spec(s) for s in SHAPES])
  for k, shape in enumerate(SHAPES):
    got = np.stack([numpy64[t][k] for t in range(N)]).reshape(N, -1)
    if name.startswith('tree'):
      # Draw j of round t is the noise of node (j, t >> j), the node that round t completes.
      nodes = tree.tree_nodes(N)
      w = np.stack([draws64[((i + 1) << h) - 1][h][k] for h, i in nodes]).reshape(len(nodes), -1)
      expected = tree.per_round_decoder(N, strategy.variant) @ w
    else:
      z = np.stack([draws64[t][0][k] for t in range(N)]).reshape(N, -1)
      expected = np.linalg.solve(strategy.matrix(N), z)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    # float32 arithmetic on O(bands) terms of magnitude ~|expected|.
    got32 = np.stack([tf32[t][k] for t in range(N)]).reshape(N, -1)
    np.testing.assert_allclose(got32, expected, rtol=2e-5, atol=2e-5 * (1 + np.abs(expected).max()))
  np.testing.assert_allclose(norms, strategy.noise_row_norms(N), rtol=1e-10)


def test_tree_state_is_logarithmic_in_tf():
  stream = st.load_strategy(TREES['tree-online-honaker']).noise_stream()
  _, _, state = _run_tf(stream, _draws(0))
  assert state[1][0].shape[0] == N.bit_length()


def test_full_honaker_is_refused():
  with pytest.raises(st.StrategyError, match='does not stream'):
    noise.make_noise_stream({'mechanism': 'tree', 'variant': 'full-honaker'})


def test_normalized_band_toeplitz_needs_horizon():
  with pytest.raises(st.StrategyError, match='horizon'):
    noise.make_noise_stream(LINEAR['band-toeplitz-normalized'])


def test_bandmf_past_horizon_fails_loudly():
  stream = noise.make_noise_stream(_bandmf(n=3, bands=2))
  state = stream.init(TF_SPECS, noise.TF_OPS)
  late = (tf.constant(3, tf.int64),) + tuple(state[1:])
  with pytest.raises(tf.errors.InvalidArgumentError, match='built for n=3'):
    with tf.control_dependencies(noise.horizon_checks(stream, late[0])):
      tf.identity(late[0])


def test_draws_are_a_function_of_seed_round_and_index():
  seed = tf.constant([7, 0], tf.int64)
  a = noise.round_draws(seed, tf.constant(0, tf.int64), TF_SPECS)
  b = noise.round_draws(seed, tf.constant(0, tf.int64), TF_SPECS)
  c = noise.round_draws(seed, tf.constant(1, tf.int64), TF_SPECS)
  assert np.array_equal(a(0)[0].numpy(), b(0)[0].numpy())
  assert not np.array_equal(a(0)[0].numpy(), c(0)[0].numpy())
  assert not np.array_equal(a(0)[0].numpy(), a(1)[0].numpy())
  assert not np.array_equal(a(0)[0].numpy().ravel()[:5], a(0)[1].numpy()[:5])
  other = noise.round_draws(tf.constant([8, 0], tf.int64), tf.constant(0, tf.int64), TF_SPECS)
  assert not np.array_equal(a(0)[0].numpy(), other(0)[0].numpy())
