"""Tests for fedmf.mf.tree: tree matrix, decoders, variances and streaming."""

import numpy as np
import pytest

from fedmf.mf import sensitivity as sens
from fedmf.mf import streaming
from fedmf.mf import tree
from fedmf.mf.checks import StrategyError
from tests.mf.brute_force import brute_force_sensitivity

_SIZES = [1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 21]


def _prefix(n):
  return np.tril(np.ones((n, n)))


def _recursive_tree(levels):
  # docs/mechanisms.md: C¹ = [1], C^l = [[C^{l-1}, 0], [0, C^{l-1}], [1 … 1]].
  c = np.ones((1, 1))
  for _ in range(levels - 1):
    z = np.zeros_like(c)
    c = np.vstack([np.hstack([c, z]), np.hstack([z, c]), np.ones((1, 2 * c.shape[1]))])
  return c


@pytest.mark.parametrize('levels', [1, 2, 3, 4, 5])
def test_tree_matrix_matches_recursive_definition(levels):
  n = 2 ** (levels - 1)
  c = tree.tree_matrix(n)
  assert c.shape == (2 * n - 1, n)
  np.testing.assert_array_equal(c, _recursive_tree(levels))


@pytest.mark.parametrize('n', _SIZES)
def test_tree_completion(n):
  nodes = tree.tree_nodes(n)
  c = tree.tree_matrix(n)
  assert len(nodes) == c.shape[0] == 2 * n - bin(n).count('1')
  assert len(set(nodes)) == len(nodes)
  big = tree.tree_matrix(1 << (n - 1).bit_length())
  # Completion = rows of the power-of-two tree lying inside the first n leaves.
  inside = big[big[:, n:].sum(axis=1) == 0][:, :n]
  np.testing.assert_array_equal(c, inside)
  for row, (h, j) in zip(c, nodes):
    assert row.sum() == 2**h
    assert row[j * 2**h] == 1.0


def test_tree_nodes_post_order():
  assert tree.tree_nodes(5) == [(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1), (2, 0), (0, 4)]


def test_vanilla_variances_are_popcount():
  np.testing.assert_allclose(tree.prefix_noise_variances(8, 'vanilla'), [1, 1, 2, 1, 2, 2, 3, 1])
  n = 37
  expected = [bin(t).count('1') for t in range(1, n + 1)]
  np.testing.assert_allclose(tree.decoder_row_sq_norms(n, 'vanilla'), expected)


def test_online_honaker_reference_variances():
  var = tree.prefix_noise_variances(16, 'online-honaker')
  assert var[0] == pytest.approx(1.0)
  assert var[1] == pytest.approx(2 / 3)
  assert var[3] == pytest.approx(4 / 7)
  assert var[7] == pytest.approx(8 / 15)
  assert var[15] == pytest.approx(16 / 31)


@pytest.mark.parametrize('n', _SIZES)
@pytest.mark.parametrize('variant', tree.VARIANTS)
def test_decoders_are_unbiased(n, variant):
  c = tree.tree_matrix(n)
  d = tree.decoder_matrix(n, variant)
  p = tree.per_round_decoder(n, variant)
  assert d.shape == (n, c.shape[0])
  np.testing.assert_allclose(d @ c, _prefix(n), atol=1e-12)
  np.testing.assert_allclose(p @ c, np.eye(n), atol=1e-12)
  np.testing.assert_allclose(_prefix(n) @ p, d, atol=1e-12)


@pytest.mark.parametrize('n', _SIZES)
def test_variance_ordering(n):
  vanilla = tree.decoder_row_sq_norms(n, 'vanilla')
  online = tree.decoder_row_sq_norms(n, 'online-honaker')
  full = tree.decoder_row_sq_norms(n, 'full-honaker')
  assert np.all(online <= vanilla + 1e-12)
  assert np.all(full <= online + 1e-12)  # A C⁺ is the least-squares decoder.


@pytest.mark.parametrize('n', [5, 8, 13])
def test_online_decoders_use_only_completed_nodes(n):
  nodes = tree.tree_nodes(n)
  done = np.array([((j + 1) << h) - 1 for h, j in nodes])
  for variant in tree.STREAMING_VARIANTS:
    d = tree.decoder_matrix(n, variant)
    for t in range(n):
      assert np.all(d[t, done > t] == 0.0)


def test_online_honaker_matches_streaming_buffer_recursion():
  # tensorflow_privacy's buffer: s = w + (s_left + s_right)/2, weight
  # 1/(2 - 2^-h); at T = 4 the estimate is the weighted root buffer.
  w = {
    node: np.random.default_rng(len(node) + 7 * node[0] + node[1]).normal()
    for node in tree.tree_nodes(4)
  }
  s1 = [w[(1, j)] + 0.5 * (w[(0, 2 * j)] + w[(0, 2 * j + 1)]) for j in (0, 1)]
  s2 = w[(2, 0)] + 0.5 * (s1[0] + s1[1])
  d = tree.online_honaker_decoder(4)
  vec = np.array([w[node] for node in tree.tree_nodes(4)])
  assert d[3] @ vec == pytest.approx(s2 / (2 - 0.25))
  assert d[1] @ vec == pytest.approx(s1[0] / 1.5)


def _node_noise(seed, shape):
  """node_noise(h, j) ~ N(0, 1), keyed by (seed, h, j)."""
  return lambda h, j: np.random.default_rng([seed, h, j]).standard_normal(shape)


def _run_tree_stream(variant, n, shape, node_noise):
  """The tree stream fed node (j, t >> j) as round t's draw j; returns outputs and drawn nodes."""
  stream = tree.Tree(variant).noise_stream()
  state = stream.init([streaming.Spec(shape)], streaming.NUMPY)
  calls, outs = [], []
  for t in range(n):

    def z(j, t=t):
      calls.append((int(j), t >> int(j)))
      return [node_noise(int(j), t >> int(j))]

    out, state = stream.step(state, z, streaming.NUMPY)
    outs.append(out[0])
  return np.stack(outs), calls, state


@pytest.mark.parametrize('n', _SIZES + [64, 100])
@pytest.mark.parametrize('shape', [(), (3,), (2, 2)])
@pytest.mark.parametrize('variant', tree.STREAMING_VARIANTS)
def test_stream_matches_dense_decoder(n, shape, variant):
  noise = _node_noise(n, shape)
  got, calls, _ = _run_tree_stream(variant, n, shape, noise)
  nodes = tree.tree_nodes(n)
  w = np.stack([noise(*node) for node in nodes]).reshape(len(nodes), -1)
  want = (tree.per_round_decoder(n, variant) @ w).reshape((n,) + shape)
  np.testing.assert_allclose(got, want, atol=1e-12)
  assert set(calls) <= set(nodes)
  assert len(calls) == len(set(calls))  # Each node is drawn once.


def test_stream_state_is_logarithmic():
  _, _, state = _run_tree_stream('online-honaker', 300, (2,), _node_noise(0, (2,)))
  assert state[1][0].shape[0] == (300).bit_length()


def test_stream_refuses_full_honaker():
  with pytest.raises(StrategyError, match='does not stream'):
    tree.Tree('full-honaker').noise_stream()


def test_unknown_variant():
  with pytest.raises(ValueError, match='variant'):
    tree.decoder_matrix(4, 'honaker')


def test_round_variances_match_the_decoder():
  for variant in tree.STREAMING_VARIANTS:
    n = 64
    per_round = np.sum(tree.per_round_decoder(n, variant) ** 2, axis=1)
    heights = [((t + 1) & -(t + 1)).bit_length() - 1 for t in range(n)]
    np.testing.assert_allclose(tree.round_variances(variant)[heights], per_round, rtol=1e-12)
    np.testing.assert_allclose(tree.Tree(variant).noise_row_norms(n), np.sqrt(per_round))


@pytest.mark.parametrize('n', [4, 8, 16, 13])
def test_single_participation_sensitivity(n):
  # Every leaf sits under one node per level that exists for it.
  c = tree.tree_matrix(n)
  expected = np.sqrt(np.max(c.sum(axis=0)))
  assert sens.single_participation_sensitivity(c).value == pytest.approx(expected)
  if n & (n - 1) == 0:
    assert expected == pytest.approx(np.sqrt(np.log2(n) + 1))
  assert sens.gram_upper_bound(c, 1, 1).value == pytest.approx(expected)


@pytest.mark.parametrize('n, b, k', [(8, 1, 8), (8, 2, 3), (8, 3, 2), (7, 2, 4), (10, 4, 3)])
def test_multi_participation_bound(n, b, k):
  c = tree.tree_matrix(n)
  brute = brute_force_sensitivity(c, b, k)
  # X ≥ 0, so 0/1 patterns are the truth.
  assert brute == pytest.approx(brute_force_sensitivity(c, b, k, signs=False))
  assert sens.gram_upper_bound(c, b, k).value >= brute * (1 - 1e-12)
  assert sens.fixed_epoch_sensitivity(c, b, k).method == 'exact'
