"""TF noise streams equal the numpy references given the same z (float32)."""

import numpy as np
import pytest
import tensorflow as tf

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from fedmf.mf import streaming
from fedmf.mf import tree
from fedmf.tff import noise

N = 24
SPECS = [tf.TensorSpec([3, 2], tf.float32), tf.TensorSpec([5], tf.float32)]


def _bandmf(n=N, bands=4, seed=0):
  rng = np.random.default_rng(seed)
  cols = [list(rng.uniform(0.2, 1.0, min(bands, n - j))) for j in range(n)]
  return st.load_strategy({'mechanism': 'bandmf', 'n': n, 'bands': bands,
                           'columns': cols})


LINEAR = {
    'dpsgd': {'mechanism': 'dpsgd'},
    'blt': {'mechanism': 'blt', 'buf_decay': [0.95, 0.6, 0.2, 0.05],
            'output_scale': [0.3, 0.2, 0.1, 0.05]},
    'bandmf': _bandmf(),
    'band-toeplitz': {'mechanism': 'band-toeplitz',
                      'coefficients': [1.0, 0.5, 0.3, 0.2, 0.1],
                      'column_normalized': False},
    'band-toeplitz-normalized': {'mechanism': 'band-toeplitz',
                                 'coefficients': [1.0, 0.5, 0.3],
                                 'column_normalized': True},
}


@pytest.mark.parametrize('name', sorted(LINEAR))
def test_linear_stream_matches_numpy_reference(name):
  s = LINEAR[name]
  gen = noise.make_noise_stream(s, num_rounds=N)
  refs = [streaming.inverse_noise_stream(s, spec.shape, n=N) for spec in SPECS]
  rng = np.random.default_rng(1)
  state = gen.initial_state(SPECS)
  norms = []
  for i in range(N):
    z = [rng.standard_normal(spec.shape).astype(np.float32) for spec in SPECS]
    norms.append(float(gen.row_norm(state, tf.constant(i, tf.int64))))
    out, state = gen.step(state, tf.constant(i, tf.int64),
                          [tf.constant(x) for x in z])
    for o, ref, x in zip(out, refs, z):
      expected = ref.next(x.astype(np.float64))
      # float32 arithmetic on O(bands) terms of magnitude ~|expected|.
      np.testing.assert_allclose(o.numpy(), expected, rtol=2e-5,
                                 atol=2e-5 * (1 + np.max(np.abs(expected))))
  np.testing.assert_allclose(norms, streaming.noise_row_norms(s, N), rtol=1e-12)


@pytest.mark.parametrize('variant', ['vanilla', 'online-honaker'])
def test_tree_stream_matches_numpy_reference(variant):
  rng = np.random.default_rng(2)
  cache = {}

  def node(h, i, k):
    key = (int(h), int(i), k)
    if key not in cache:
      cache[key] = rng.standard_normal(SPECS[k].shape).astype(np.float32)
    return cache[key]

  gen = noise.make_noise_stream({'mechanism': 'tree', 'variant': variant})
  refs = [tree.TreeNoiseStream(variant, spec.shape,
                               lambda h, i, k=k: node(h, i, k).astype(np.float64))
          for k, spec in enumerate(SPECS)]
  state = gen.initial_state(SPECS)
  norms = []
  for i in range(N):
    norms.append(float(gen.row_norm(state, tf.constant(i, tf.int64))))
    out, state = gen.step(
        state, tf.constant(i, tf.int64),
        lambda h, idx: [tf.constant(node(h, idx, k)) for k in range(len(SPECS))])
    for o, ref in zip(out, refs):
      np.testing.assert_allclose(o.numpy(), ref.next(), rtol=1e-5, atol=1e-5)
  # O(log n) state: bit_length(N) levels.
  assert state[0].shape[0] == N.bit_length()
  decoder = tree.per_round_decoder(N, variant)
  np.testing.assert_allclose(norms, np.linalg.norm(decoder, axis=1), rtol=1e-12)


def test_tree_round_variances_match_decoder_far_out():
  n = 1024
  for variant in ('vanilla', 'online-honaker'):
    var = np.sum(tree.per_round_decoder(n, variant)**2, axis=1)
    h = np.array([((t + 1) & -(t + 1)).bit_length() - 1 for t in range(n)])
    np.testing.assert_allclose(noise.tree_round_variances(variant)[h], var,
                               rtol=1e-10)


def test_full_honaker_is_refused():
  with pytest.raises(FedmfUserError, match='does not stream'):
    noise.make_noise_stream({'mechanism': 'tree', 'variant': 'full-honaker'})


def test_bandmf_past_horizon_fails_loudly():
  gen = noise.make_noise_stream(_bandmf(n=3, bands=2))
  state = gen.initial_state(SPECS)
  with pytest.raises(tf.errors.InvalidArgumentError, match='built for n=3'):
    gen.step(state, tf.constant(3, tf.int64),
             [tf.zeros(s.shape) for s in SPECS])


def test_normalized_band_toeplitz_needs_horizon():
  with pytest.raises(FedmfUserError, match='num_rounds'):
    noise.make_noise_stream(LINEAR['band-toeplitz-normalized'])


def test_generate_is_a_function_of_seed_and_round():
  gen = noise.make_noise_stream(LINEAR['blt'])
  seed = tf.constant([7, 0], tf.int64)
  a, _ = gen.generate(gen.initial_state(SPECS), tf.constant(0, tf.int64), seed, SPECS)
  b, _ = gen.generate(gen.initial_state(SPECS), tf.constant(0, tf.int64), seed, SPECS)
  c, _ = gen.generate(gen.initial_state(SPECS), tf.constant(1, tf.int64), seed, SPECS)
  assert np.array_equal(a[0].numpy(), b[0].numpy())
  assert not np.array_equal(a[0].numpy(), c[0].numpy())
  assert not np.array_equal(a[0].numpy().ravel()[:5], a[1].numpy()[:5])


@pytest.mark.parametrize('stack', [True, False, None])
def test_blt_buffer_layouts_agree(stack, monkeypatch):
  # Auto layout with a tiny limit: the [3, 2] variable (24 bytes × 4 buffers = 96) is split while
  # the [5] variable (20 × 4 = 80 bytes) stays stacked, so one state mixes both layouts.
  monkeypatch.setattr(noise.BltNoise, 'STACK_LIMIT_BYTES', 88)
  s = st.load_strategy(LINEAR['blt'])
  gen = noise.BltNoise(tuple(s.buf_decay), tuple(s.output_scale), stack_buffers=stack)
  state = gen.initial_state(SPECS)
  layouts = [isinstance(b, tuple) for b in state[0]]
  assert layouts == {True: [False, False], False: [True, True], None: [True, False]}[stack]
  refs = [streaming.inverse_noise_stream(s, spec.shape) for spec in SPECS]
  rng = np.random.default_rng(5)
  for i in range(6):
    z = [rng.standard_normal(spec.shape).astype(np.float32) for spec in SPECS]
    out, state = gen.step(state, tf.constant(i, tf.int64), [tf.constant(x) for x in z])
    for o, ref, x in zip(out, refs, z):
      np.testing.assert_allclose(o.numpy(), ref.next(x.astype(np.float64)), rtol=2e-5, atol=2e-5)
