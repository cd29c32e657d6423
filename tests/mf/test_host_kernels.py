"""Host kernels (issue 11): every mechanism's in-place numpy kernel equals its stream definition run
with the numpy backend bit for bit, in float32, across chunk boundaries, and its state is the
stream's own state (checkpoint, restore, continue)."""

import numpy as np
import pytest

from fedmf.mf import streaming
from fedmf.mf import strategies as st
from fedmf.mf import tree
from tests.mf.random_strategies import random_bandmf, random_dense

N = 20
SHAPES = [(3, 7), (11,), (1,)]  # (Scalars: numpy computes 0-d float32 with Python floats in
# float64, so the generic numpy run is no float32 reference for them; the TF test has one.)
SPECS32 = [streaming.Spec(s, np.float32) for s in SHAPES]


EVERY = {
  'dpsgd': {'mechanism': 'dpsgd'},
  'blt': {'mechanism': 'blt', 'buf_decay': [0.95, 0.6, 0.2], 'output_scale': [0.3, 0.2, 0.1]},
  'bandmf': random_bandmf(N, bands=5),
  'bandmf-1-band': random_bandmf(N, bands=1),
  'band-toeplitz': {'mechanism': 'band-toeplitz', 'coefficients': [1.5, 0.5, 0.3, 0.2]},
  'band-toeplitz-normalized': {
    'mechanism': 'band-toeplitz',
    'coefficients': [1.0, 0.5, 0.3],
    'column_normalized': True,
  },
  'dense': random_dense(N),
  **{f'tree-{v}': {'mechanism': 'tree', 'variant': v} for v in tree.STREAMING_VARIANTS},
}


def _draws(seed, dtype=np.float32):
  """draws[t][j]: round t's j-th draw, one array per shape (j < 6 covers N = 20 for the tree)."""
  rng = np.random.default_rng(seed)
  return [
    [[rng.standard_normal(s).astype(dtype) for s in SHAPES] for _ in range(6)] for _ in range(N)
  ]


def _run_kernel(kernel, draws):
  outs, norms = [], []
  for round_draws in draws:
    norms.append(kernel.row_norm())
    outs.append(kernel.step(lambda j, d=round_draws: d[int(j)]))
  return outs, norms


def _assert_same(a, b, what):
  for t, (x, y) in enumerate(zip(a, b)):
    for k, (u, v) in enumerate(zip(x, y)):
      assert u.dtype == v.dtype and u.shape == v.shape, (what, t, k)
      np.testing.assert_array_equal(u, v, err_msg=f'{what}: round {t} tensor {k}')


def _assert_same_state(a, b):
  if isinstance(a, tuple):
    assert isinstance(b, tuple) and len(a) == len(b)
    for x, y in zip(a, b):
      _assert_same_state(x, y)
  else:
    assert np.asarray(a).shape == np.asarray(b).shape
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(params=[7, streaming.CHUNK], ids=['chunk-7', 'chunk-default'])
def chunk(request, monkeypatch):
  """Small chunks put chunk boundaries inside every tensor."""
  monkeypatch.setattr(streaming, 'CHUNK', request.param)
  return request.param


@pytest.mark.parametrize('name', sorted(EVERY))
def test_kernel_equals_the_stream_definition_bit_for_bit(name, chunk):
  strategy = st.load_strategy(EVERY[name])
  stream = strategy.noise_stream(N)
  draws = _draws(seed=len(name))
  generic = streaming.run(stream, draws, SPECS32)
  kernel = stream.host_kernel(SPECS32)
  got, norms = _run_kernel(kernel, draws)
  _assert_same(got, generic, name)
  np.testing.assert_allclose(norms, strategy.noise_row_norms(N), rtol=1e-12)
  assert kernel.round == N


@pytest.mark.parametrize('name', sorted(EVERY))
def test_kernel_state_is_the_stream_state_and_restores(name, chunk):
  stream = st.load_strategy(EVERY[name]).noise_stream(N)
  draws = _draws(seed=3)
  half = N // 2 + 1  # Odd: the tree's buffer has had rows replaced and grown.
  kernel = stream.host_kernel(SPECS32)
  _run_kernel(kernel, draws[:half])
  # Its state is the generic stream's state after the same rounds, leaf for leaf.
  state = stream.init(SPECS32, streaming.NUMPY)
  for round_draws in draws[:half]:
    _, state = stream.step(state, lambda j, d=round_draws: d[int(j)], streaming.NUMPY)
  saved = kernel.state()
  _assert_same_state(saved, state)
  rest, _ = _run_kernel(kernel, draws[half:])
  # A fresh kernel restored from the checkpoint (or from the generic state) continues bit for bit.
  for source in (saved, state):
    other = stream.host_kernel(SPECS32)
    other.restore(source)
    assert other.round == half
    again, _ = _run_kernel(other, draws[half:])
    _assert_same(again, rest, name)


@pytest.mark.parametrize('name', ['blt', 'bandmf', 'band-toeplitz', 'tree-online-honaker'])
def test_float32_kernel_is_close_to_the_float64_definition(name):
  """float32 buffers against the float64 reference (which test_noise.py checks against C⁻¹Z)."""
  strategy = st.load_strategy(EVERY[name])
  stream = strategy.noise_stream(N)
  draws = _draws(seed=5)
  draws64 = [[[x.astype(np.float64) for x in d] for d in rd] for rd in draws]
  reference = streaming.run(stream, draws64, [streaming.Spec(s) for s in SHAPES])
  got, _ = _run_kernel(stream.host_kernel(SPECS32), draws)
  for t in range(N):
    for k in range(len(SHAPES)):
      expected = reference[t][k]
      np.testing.assert_allclose(
        got[t][k], expected, rtol=3e-5, atol=3e-5 * (1 + abs(expected).max())
      )


def test_restore_refuses_a_state_of_another_shape():
  stream = st.load_strategy(EVERY['bandmf']).noise_stream(N)
  kernel = stream.host_kernel(SPECS32)
  state = kernel.state()
  bad = (state[0], ((np.zeros((2, 2), np.float32),) * 4,) + state[1][1:])
  with pytest.raises(ValueError, match='shape'):
    kernel.restore(bad)
