"""Binary-tree aggregation (TreeAgg): strategy matrix, decoders, noise stream.

One concept: the tree mechanism of mechanisms.md "TreeAgg", in the notation
of docs/architecture.md (`n` rounds, 0-based; C the strategy; B = A·(per-round
decoder) the decoder for workload A). The tree has no C⁻¹: its noise is
defined through a decoder D (n × num_nodes) for prefix sums, and round i's
noise is [D w]_i - [D w]_{i-1} for node noise w.

Nodes are labelled (height, index): node (h, j) covers leaves (rounds)
[j·2^h, (j+1)·2^h). With tree completion only nodes whose subtree lies in
[0, n) exist, i.e. (j+1)·2^h ≤ n. Rows of `tree_matrix` and columns of the
decoders follow `tree_nodes(n)`: post-order, i.e. sorted by the round in
which the node's subtree completes, (j+1)·2^h - 1, then by height. This is
the order of the recursive definition C^l = [[C^{l-1}, 0], [0, C^{l-1}],
[1 … 1]] and the order in which a stream meets the nodes.

Variants: 'vanilla' (dyadic sums), 'online-honaker' (tensorflow_privacy's
EfficientTreeAggregator), 'full-honaker' (B = A C⁺; not streamable).
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import numpy as np

VARIANTS = ('vanilla', 'online-honaker', 'full-honaker')
STREAMING_VARIANTS = ('vanilla', 'online-honaker')

Node = Tuple[int, int]


def _check_n(n: int) -> int:
  if int(n) != n or n < 1:
    raise ValueError(f'n must be an integer >= 1, got {n!r}')
  return int(n)


def _check_variant(variant: str) -> str:
  if variant not in VARIANTS:
    raise ValueError(
        f'unknown tree variant {variant!r}; expected one of {VARIANTS}')
  return variant


def tree_nodes(n: int) -> List[Node]:
  """Returns the (height, index) labels of the completed tree's nodes.

  Post-order: sorted by completion round (index+1)·2^height - 1, then by
  height. There are Σ_h floor(n / 2^h) = 2n - popcount(n) nodes (2n - 1 when
  n is a power of two).
  """
  n = _check_n(n)
  nodes = []
  h = 0
  while (1 << h) <= n:
    nodes.extend((h, j) for j in range(n >> h))
    h += 1
  nodes.sort(key=lambda node: (((node[1] + 1) << node[0]) - 1, node[0]))
  return nodes


def _node_positions(n: int) -> dict:
  return {node: row for row, node in enumerate(tree_nodes(n))}


def tree_matrix(n: int) -> np.ndarray:
  """Returns the binary-tree strategy C, shape (num_nodes, n), rows by `tree_nodes`.

  Source: mechanisms.md TreeAgg (Dwork et al. 2010 binary tree): row (h, j)
  has ones on the leaves [j·2^h, (j+1)·2^h). Tree completion keeps only
  nodes inside [0, n).
  """
  nodes = tree_nodes(n)
  c = np.zeros((len(nodes), n))
  for row, (h, j) in enumerate(nodes):
    c[row, j << h:(j + 1) << h] = 1.0
  return c


def _dyadic_cover(t: int) -> List[Node]:
  """The nodes whose disjoint union is [0, t], largest first.

  The binary digits of t + 1 give the node heights; every node ends at or
  before round t, so it is complete when round t is released.
  """
  cover = []
  start = 0
  count = t + 1
  for h in range(count.bit_length() - 1, -1, -1):
    if count >> h & 1:
      cover.append((h, start >> h))
      start += 1 << h
  return cover


def _honaker_variance(h: int) -> float:
  """Variance of the online-Honaker estimate of a height-h node (unit noise).

  v_0 = 1 and v_h = 1 / (1 + 1 / (2 v_{h-1})) = 1 / (2 - 2^{-h}): the weight
  tensorflow_privacy's EfficientTreeAggregator applies to its buffer.
  """
  return 1.0 / (2.0 - 0.5**h)


def vanilla_decoder(n: int) -> np.ndarray:
  """Returns D (n × num_nodes): row t sums the dyadic nodes covering [0, t].

  Source: mechanisms.md TreeAgg "Vanilla decoding"; the variance of row t is
  popcount(t + 1).
  """
  pos = _node_positions(n)
  d = np.zeros((n, len(pos)))
  for t in range(n):
    for node in _dyadic_cover(t):
      d[t, pos[node]] = 1.0
  return d


def _online_honaker_node_estimates(n: int) -> dict:
  """Maps each node to its estimate as a row vector over node noises.

  Source: Honaker (2015) as in tensorflow_privacy EfficientTreeAggregator
  (mechanisms.md TreeAgg). A node's own noisy value (variance 1) and the sum
  of its two children's estimates (variance 2 v_{h-1}) are independent
  unbiased estimates of the node's sum; inverse-variance weighting gives
  e = v_h (w + (e_left + e_right) / (2 v_{h-1})) with variance v_h.
  Only nodes of the subtree are used, so the estimate is available online
  as soon as the node completes.
  """
  pos = _node_positions(n)
  estimates = {}
  for node in tree_nodes(n):  # Post-order: children come first.
    h, j = node
    e = np.zeros(len(pos))
    e[pos[node]] = 1.0
    if h > 0:
      children = estimates[(h - 1, 2 * j)] + estimates[(h - 1, 2 * j + 1)]
      e = _honaker_variance(h) * (e + children / (2.0 * _honaker_variance(h - 1)))
    estimates[node] = e
  return estimates


def online_honaker_decoder(n: int) -> np.ndarray:
  """Returns D (n × num_nodes): row t sums the node estimates covering [0, t].

  Source: tensorflow_privacy EfficientTreeAggregator (node weights
  1 / (2 - 2^{-h})); prefix variance 4/7 at T = 4 and 8/15 at T = 8.
  """
  estimates = _online_honaker_node_estimates(n)
  d = np.zeros((n, len(tree_nodes(n))))
  for t in range(n):
    for node in _dyadic_cover(t):
      d[t] += estimates[node]
  return d


def full_honaker_decoder(n: int) -> np.ndarray:
  """Returns D = A C⁺ for the prefix workload A: the least-squares decoder.

  Source: mechanisms.md TreeAgg-Full (Honaker 2015 with all nodes). Row t
  uses nodes that complete after round t, so it does not stream.
  """
  n = _check_n(n)
  return np.tril(np.ones((n, n))) @ np.linalg.pinv(tree_matrix(n))


def decoder_matrix(n: int, variant: str) -> np.ndarray:
  """Returns the prefix-sum decoder D (n × num_nodes) of `variant`."""
  variant = _check_variant(variant)
  if variant == 'vanilla':
    return vanilla_decoder(n)
  if variant == 'online-honaker':
    return online_honaker_decoder(n)
  return full_honaker_decoder(n)


def per_round_decoder(n: int, variant: str) -> np.ndarray:
  """Returns P (n × num_nodes), rows D_i - D_{i-1}, so that A_prefix P = D.

  P C = I, and round i's noise is [P w]_i. For a general workload A the
  decoder is B = A P. For 'full-honaker' this is C⁺ itself.
  """
  variant = _check_variant(variant)
  if variant == 'full-honaker':
    return np.linalg.pinv(tree_matrix(n))
  return np.diff(decoder_matrix(n, variant), axis=0, prepend=0.0)


def decoder_row_sq_norms(n: int, variant: str) -> np.ndarray:
  """Returns ‖row_t(D)‖², the squared per-round error of the prefix workload.

  Sensitivity excluded; at unit node noise this is the variance of the
  cumulative noise at round t.
  """
  d = decoder_matrix(n, variant)
  return np.sum(d * d, axis=1)


def prefix_noise_variances(n: int, variant: str) -> np.ndarray:
  """Returns the variance of the cumulative noise at rounds 0..n-1 (unit node std).

  Same numbers as `decoder_row_sq_norms`; named after the tensorflow_privacy
  test quantity (vanilla: popcount(t + 1)).
  """
  return decoder_row_sq_norms(n, variant)


class TreeNoiseStream:
  """Streams round i's tree noise [D w]_i - [D w]_{i-1}, with no horizon.

  State: at most one buffered node per height (the dyadic cover of the
  rounds so far) plus the previous cumulative noise, i.e. O(log i · d).
  Node noises come from `node_noise(height, index)`, so any implementation
  that draws them keyed by (seed, height, index) reproduces this stream.

  Source: tensorflow_privacy TreeAggregator / EfficientTreeAggregator and
  TFF's TreeResidualSumQuery (mechanisms.md TreeAgg). For 'online-honaker'
  the buffer holds the unweighted recursion s = w + (s_left + s_right) / 2,
  whose weighted value s / (2 - 2^{-h}) is the node's inverse-variance
  estimate.
  """

  def __init__(self, variant: str, shape: Sequence[int],
               node_noise: Callable[[int, int], np.ndarray]):
    variant = _check_variant(variant)
    if variant not in STREAMING_VARIANTS:
      raise ValueError(
          f'tree variant {variant!r} does not stream (its decoder uses '
          f'nodes from future rounds); use one of {STREAMING_VARIANTS}')
    self._variant = variant
    self._shape = tuple(int(s) for s in shape)
    self._node_noise = node_noise
    self._round = 0
    # (height, buffered value), heights strictly decreasing.
    self._buffer: List[Tuple[int, np.ndarray]] = []
    self._prev_cumsum = np.zeros(self._shape)

  @property
  def round(self) -> int:
    """The 0-based index of the round the next call to `next` returns."""
    return self._round

  def _draw(self, height: int, index: int) -> np.ndarray:
    value = np.asarray(self._node_noise(height, index), dtype=np.float64)
    if value.shape != self._shape:
      raise ValueError(
          f'node_noise({height}, {index}) returned shape {value.shape}, '
          f'expected {self._shape}')
    return value

  def next(self) -> np.ndarray:
    """Returns the noise of the current round and advances one round."""
    t = self._round
    count = t + 1
    # Height of the node completed by leaf t; the buffered nodes below it
    # are its left descendants and leave the dyadic cover.
    top = (count & -count).bit_length() - 1
    if self._variant == 'vanilla':
      del self._buffer[len(self._buffer) - top:]
      self._buffer.append((top, self._draw(top, t >> top)))
      cumsum = sum(value for _, value in self._buffer)
    else:
      value = self._draw(0, t)
      for h in range(1, top + 1):
        _, left = self._buffer.pop()
        value = self._draw(h, t >> h) + 0.5 * (left + value)
      self._buffer.append((top, value))
      cumsum = sum(_honaker_variance(h) * v for h, v in self._buffer)
    cumsum = np.asarray(cumsum, dtype=np.float64).reshape(self._shape)
    noise = cumsum - self._prev_cumsum
    self._prev_cumsum = cumsum
    self._round += 1
    return noise


def gaussian_node_noise(seed: int, shape: Sequence[int],
                        std: float = 1.0) -> Callable[[int, int], np.ndarray]:
  """Returns node_noise(height, index) drawing N(0, std²) keyed by (seed, height, index)."""
  shape = tuple(int(s) for s in shape)

  def node_noise(height: int, index: int) -> np.ndarray:
    rng = np.random.default_rng([int(seed), int(height), int(index)])
    return std * rng.standard_normal(shape)

  return node_noise
