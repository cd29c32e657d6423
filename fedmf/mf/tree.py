"""Binary-tree aggregation (TreeAgg): strategy matrix, decoders, noise stream.

One concept: the tree mechanism of docs/mechanisms.md "TreeAgg", in the notation
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

import dataclasses
from typing import Any, ClassVar, List, Mapping, Optional, Tuple

import numpy as np

from fedmf.mf import checks
from fedmf.mf import resources
from fedmf.mf import streaming
from fedmf.mf import strategy as strategy_lib
from fedmf.mf import tree_sensitivity

VARIANTS = ('vanilla', 'online-honaker', 'full-honaker')
STREAMING_VARIANTS = ('vanilla', 'online-honaker')

Node = Tuple[int, int]


def _check_n(n: int) -> int:
  if int(n) != n or n < 1:
    raise ValueError(f'n must be an integer >= 1, got {n!r}')
  return int(n)


def _check_variant(variant: str) -> str:
  if variant not in VARIANTS:
    raise ValueError(f'unknown tree variant {variant!r}; expected one of {VARIANTS}')
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

  Source: docs/mechanisms.md TreeAgg (Dwork et al. 2010 binary tree): row (h, j)
  has ones on the leaves [j·2^h, (j+1)·2^h). Tree completion keeps only
  nodes inside [0, n).
  """
  nodes = tree_nodes(n)
  c = np.zeros((len(nodes), n))
  for row, (h, j) in enumerate(nodes):
    c[row, j << h : (j + 1) << h] = 1.0
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

  Source: docs/mechanisms.md TreeAgg "Vanilla decoding"; the variance of row t is
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
  (docs/mechanisms.md TreeAgg). A node's own noisy value (variance 1) and the sum
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

  Source: docs/mechanisms.md TreeAgg-Full (Honaker 2015 with all nodes). Row t
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


def round_variances(variant: str, max_height: int = 62) -> np.ndarray:
  """Variance of round t's noise (unit node noise) when leaf t completes a height-h node, by h.

  vanilla: w_h - Σ_{j<h} w_j → h + 1.
  online Honaker: s_h = Σ_{k≤h} 2^{-(h-k)} w'_k + Σ_{j<h} 2^{-(h-j)} s_j over the new right-chain
  nodes w'_k and the buffered left nodes s_j (independent, Var s_j = V_j, V_0 = 1,
  V_j = 1 + V_{j-1}/2), so Var = c_h² Σ_k 4^{-(h-k)} + Σ_{j<h} (c_h 2^{-(h-j)} - c_j)² V_j with
  c_j = 1/(2 - 2^{-j}).
  """
  variant = _check_variant(variant)
  if variant == 'vanilla':
    return np.arange(max_height + 1, dtype=np.float64) + 1.0
  out = np.zeros(max_height + 1)
  v = np.ones(max_height + 1)
  for j in range(1, max_height + 1):
    v[j] = 1.0 + 0.5 * v[j - 1]
  c = np.array([_honaker_variance(j) for j in range(max_height + 1)])
  for h in range(max_height + 1):
    k = np.arange(h + 1)
    total = c[h] ** 2 * np.sum(0.25 ** (h - k))
    j = np.arange(h)
    total += np.sum((c[h] * 0.5 ** (h - j) - c[j]) ** 2 * v[j])
    out[h] = total
  return out


@dataclasses.dataclass(frozen=True)
class TreeStream(streaming.NoiseStream):
  """Round t's tree noise [P w]_t = [D w]_t - [D w]_{t-1}, with no horizon.

  Leaf t completes the nodes (j, t >> j) for j = 0..h, h = trailing zeros of t + 1; draw j of
  round t is node (j, t >> j)'s noise, so every node is drawn exactly once. The buffered nodes at
  heights j < h are left descendants of node (h, t >> h) and leave the dyadic cover:

      noise_t = c_h e_h - c_0 s_0 - c_1 s_1 - … - c_{h-1} s_{h-1}   (subtracted in this order),

  vanilla: e = the node's own draw, c = 1; online Honaker (tensorflow_privacy's
  EfficientTreeAggregator, TFF's TreeResidualSumQuery): the unweighted recursion
  s = w + (s_left + s_right)/2 and c_j = 1/(2 - 2^{-j}).
  State: (t, per tensor a [rows, *shape] buffer, row j = the buffered node at height j).
  """

  variant: str = 'online-honaker'

  def model_buffers(self, rounds: int) -> int:
    return max(int(rounds), 1).bit_length()  # One buffered node per height.

  def init(self, specs, ops):
    return (
      streaming.round_counter(ops),
      tuple(ops.empty_rows(spec.shape, spec.dtype) for spec in specs),
    )

  def _weight(self, h, ops):
    if self.variant == 'vanilla':
      return ops.constant(1.0, ops.float64)
    return 1.0 / (2.0 - ops.cast(0.5, ops.float64) ** ops.cast(h, ops.float64))

  def step(self, state, z, ops):
    t, buffers = state
    h = ops.trailing_zeros(t + 1)
    if self.variant == 'vanilla':
      nodes = list(z(h))
    else:

      def climb(j, values):  # s ← w(j+1) + (s_left + s)/2, up to height h.
        return [w + 0.5 * (ops.row(buf, j) + s) for w, buf, s in zip(z(j + 1), buffers, values)]

      nodes = ops.fori_loop(0, h, climb, list(z(0)))
    outputs, new_buffers = [], []
    for node, buf in zip(nodes, buffers):
      dtype = node.dtype

      def below(j, acc, buf=buf, dtype=dtype):
        return acc - ops.cast(self._weight(j, ops), dtype) * ops.row(buf, j)

      out = ops.fori_loop(0, h, below, ops.cast(self._weight(h, ops), dtype) * node)
      outputs.append(out)
      new_buffers.append(ops.set_row(buf, h, node))
    return outputs, (t + 1, tuple(new_buffers))

  def row_norm(self, state, ops):
    h = ops.trailing_zeros(state[0] + 1)
    return ops.gather(np.sqrt(round_variances(self.variant)), h, ops.float64)

  def host_kernel(self, specs):
    return TreeKernel(self, specs)


class TreeKernel(streaming.HostKernel):
  """`TreeStream.step` in numpy, in place: one array per buffered node (a list per tensor, so a
  new height appends instead of copying the buffer), chunk by chunk, with the definition's
  operations in its order (tests/mf/test_host_kernels.py)."""

  def __init__(self, stream: TreeStream, specs):
    super().__init__(stream, specs)
    self._levels = [[] for _ in self.specs]  # _levels[k][j]: tensor k's node at height j.

  def step(self, z):
    stream = self.stream
    h = streaming.NUMPY.trailing_zeros(self.round + 1)
    honaker = stream.variant != 'vanilla'
    draws = [z(j) for j in range(h + 1)] if honaker else [None] * h + [z(h)]
    outputs = []
    for k, (levels, spec) in enumerate(zip(self._levels, self.specs)):
      dtype = np.dtype(spec.dtype).type
      weights = [dtype(stream._weight(j, streaming.NUMPY)) for j in range(h + 1)]
      node = np.array(draws[h][k] if not honaker else draws[0][k], spec.dtype).reshape(-1)
      y = np.empty_like(node)
      tmp = np.empty(min(streaming.CHUNK, node.size), node.dtype)
      half = dtype(0.5)
      for lo, hi in streaming.chunks(node.size):
        s, out, t = node[lo:hi], y[lo:hi], tmp[: hi - lo]
        if honaker:  # s ← w(j+1) + 0.5·(s_j + s), in place in the node's array.
          for j in range(h):
            np.add(levels[j][lo:hi], s, out=s)
            np.multiply(half, s, out=s)
            np.add(np.asarray(draws[j + 1][k], node.dtype).reshape(-1)[lo:hi], s, out=s)
        np.multiply(weights[h], s, out=out)
        for j in range(h):
          np.subtract(out, np.multiply(weights[j], levels[j][lo:hi], out=t), out=out)
      if h == len(levels):
        levels.append(node)
      else:
        levels[h] = node
      outputs.append(y.reshape(spec.shape))
    self._advance_scalars()
    return outputs

  def buffers(self):
    return [level for levels in self._levels for level in levels]

  def tensor_state(self, copy):
    return tuple(
      np.stack(levels).reshape((len(levels),) + spec.shape)
      if levels
      else np.zeros((0,) + spec.shape, spec.dtype)
      for levels, spec in zip(self._levels, self.specs)
    )

  def restore_tensors(self, tensors):
    restored = []
    for value, spec in zip(tensors, self.specs):
      value = np.asarray(value)
      if value.shape[1:] != spec.shape:
        raise ValueError(
          f'tree noise state has shape {value.shape}, expected (rows,) + {spec.shape}'
        )
      restored.append([np.array(row, spec.dtype).reshape(-1) for row in value])
    self._levels = restored


# ---------------------------------------------------------------------------------------------
# The tree strategy.


@dataclasses.dataclass(frozen=True, eq=False)
class Tree(strategy_lib.Strategy):
  """Binary-tree aggregation; `variant` names the decoder (TreeAgg).

  JSON: {"mechanism": "tree", "variant": "vanilla" | "online-honaker" | "full-honaker"}. C is the
  (2n - popcount(n)) × n tree matrix; there is no C⁻¹, the noise comes from the decoder.
  Full Honaker is for error comparisons: it does not stream.
  """

  variant: str = 'online-honaker'
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = 'tree'
  optimizer_options: ClassVar[tuple[str, ...]] = ("tree_variant",)
  optimizer_reports_progress: ClassVar[bool] = False  # closed form

  @classmethod
  def from_dict(cls, obj):
    variant = obj.get('variant', 'online-honaker')
    if variant not in VARIANTS:
      raise checks.StrategyError(
        f"strategy field 'variant': unknown tree variant {checks.short_repr(variant)}; "
        f"expected one of "
        f"{', '.join(VARIANTS)}"
      )
    return cls(variant=variant, metadata=checks.extra_fields(obj, ('variant',)))

  def fields(self):
    return {'variant': self.variant}

  def describe(self) -> str:
    return f'tree ({self.variant})'

  def matrix(self, n: int) -> np.ndarray:
    self.check_horizon(n)
    return tree_matrix(n)

  def matrix_shape(self, n: int) -> tuple[int, int]:
    return (2 * n - bin(n).count('1'), n)

  def error_cost(self, n, dense_workload=False):
    nodes = float(self.matrix_shape(n)[0])
    if self.variant == 'full-honaker':
      # The pseudo-inverse (SVD) of the nodes×n C and A C⁺ (or A times it).
      cost = resources.Cost.of(
        f'the pseudo-inverse of the dense {int(nodes)}×{n} tree matrix',
        resources.FLOAT * (6.0 * nodes * n + 2.0 * float(n) ** 2),
        (4.0 * nodes * n * n + 24.0 * float(n) ** 3) / resources.DENSE_RATE,
      )
    else:
      # Online Honaker keeps one estimate vector per node (nodes²); both keep the n×nodes D.
      per_node = nodes if self.variant == 'online-honaker' else 0.0
      cost = resources.Cost.of(
        f'the dense {n}×{int(nodes)} tree decoder',
        resources.FLOAT * (3.0 * n * nodes + per_node * nodes),
        float(n) * int(n).bit_length() / resources.PYTHON_RATE
        + (2.0 * n * nodes + per_node * nodes) / resources.VECTOR_RATE,
      )
    return cost + super().error_cost(n, True) if dense_workload else cost

  def decoder_row_sq_norms(self, n: int, workload: Optional[np.ndarray] = None) -> np.ndarray:
    self.check_horizon(n)
    if workload is None:
      return np.asarray(decoder_row_sq_norms(n, self.variant), dtype=np.float64)
    if self.variant == 'full-honaker':
      b_mat = workload @ np.linalg.pinv(tree_matrix(n))  # The optimal decoder for A is A C⁺.
    else:
      b_mat = workload @ per_round_decoder(n, self.variant)
    return np.sum(b_mat * b_mat, axis=1)

  def prefix_sensitivities(self, min_seps, max_participations):
    # The Gram of the first r rounds' tree grows by blocks: every prefix in one pass
    # (`fedmf.mf.tree_sensitivity`), not a dense O(r³) Gram per r.
    self.check_horizon(len(min_seps))
    return tree_sensitivity.prefix_sensitivities(min_seps, max_participations)

  def check_streamable(self) -> None:
    if self.variant not in STREAMING_VARIANTS:
      raise checks.StrategyError(
        f"tree variant {self.variant!r} does not stream (its decoder uses nodes of future "
        f"rounds); use 'online-honaker' or 'vanilla' for training"
      )

  def noise_stream(self, n: Optional[int] = None) -> TreeStream:
    self.check_streamable()
    return TreeStream(self.variant)

  def noise_row_norms(self, n: int) -> np.ndarray:
    self.check_horizon(n)
    return np.linalg.norm(per_round_decoder(n, self.variant), axis=1)

  def per_round_noise_matrix(self, n: int) -> np.ndarray:
    # No C⁻¹: round t's noise is [P w]_t over the node noise w (n × nodes).
    self.check_horizon(n)
    return per_round_decoder(n, self.variant)

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    return cls(variant=options.tree_variant).evaluation_cost(schema)  # Nothing to optimize.

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):
    return cls(variant=options.tree_variant), {'objective': options.objective or 'rms'}
