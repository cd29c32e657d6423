"""TensorFlow streaming noise generators: round i's [C⁻¹ z]_i with explicit state.

Layer 3 of docs/architecture.md. Notation follows the architecture doc and
../shared/notes/mechanisms.md: `n` rounds (0-based), C the strategy, C⁻¹ the
noising matrix, `bands` = b̂, BLT `buf_decay` = θ and `output_scale` = ω,
`nbuf` BLT buffers.

Every generator is a frozen dataclass with three pure TF methods:

* `initial_state(specs)`: the stream state as a nested tuple of tensors, one
  entry (or several) per model tensor, so no tensor is larger than the model's
  own largest variable (the 2 GiB protobuf limit).
* `step(state, round_index, source)`: round i's unit-scale noise, one tensor
  per spec, and the next state. For the linear streams `source` is the list of
  round i's z_i (i.i.d. N(0, 1)); for the tree it is `node_noise(height,
  index) -> list of tensors`. Tests feed these directly to compare with the
  numpy references in `fedmf.mf.streaming` / `fedmf.mf.tree`.
* `generate(state, round_index, seed, specs)`: the same with z drawn by
  `tf.random.stateless_normal` keyed by (seed, round, tensor index), or for the
  tree by (seed, node height, node index, tensor index). Noise is therefore a
  pure function of (seed, state, round): restoring a checkpointed state
  continues bit-identically.

`row_norm(state, round_index)` (float64) is ‖row_i of C⁻¹‖, or for the tree
the std of the decoder's per-round noise at unit node noise.

`make_noise_stream(strategy, num_rounds=None)` builds the generator from a
strategy loaded by `fedmf.mf.strategies.load_strategy` (the one loader), so the
noise uses exactly the C the accountant sees.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st

__all__ = [
    'NoiseStream',
    'IdentityNoise',
    'BltNoise',
    'BandedNoise',
    'TreeNoise',
    'make_noise_stream',
    'horizon_checks',
    'tree_round_variances',
    'round_normals',
    'node_normals',
]

_RNG_ALG = 'philox'  # Fixed (not 'auto_select') so noise is device independent.
_TREE_DOMAIN = 0x7472656500  # Separates tree node keys from round keys.

Specs = Sequence[tf.TensorSpec]


def _fold(seed: tf.Tensor, data) -> tf.Tensor:
  return tf.random.experimental.stateless_fold_in(
      seed, tf.cast(data, tf.int64), alg=_RNG_ALG)


def round_normals(seed: tf.Tensor, round_index: tf.Tensor,
                  specs: Specs) -> list[tf.Tensor]:
  """z for round i: N(0, 1) keyed by (seed, round, tensor index)."""
  round_seed = _fold(seed, round_index)
  return [
      tf.random.stateless_normal(spec.shape, seed=_fold(round_seed, k),
                                 dtype=spec.dtype, alg=_RNG_ALG)
      for k, spec in enumerate(specs)
  ]


def node_normals(seed: tf.Tensor, height: tf.Tensor, index: tf.Tensor,
                 specs: Specs) -> list[tf.Tensor]:
  """Tree node noise: N(0, 1) keyed by (seed, height, index, tensor index)."""
  node_seed = _fold(_fold(_fold(seed, _TREE_DOMAIN), height), index)
  return [
      tf.random.stateless_normal(spec.shape, seed=_fold(node_seed, k),
                                 dtype=spec.dtype, alg=_RNG_ALG)
      for k, spec in enumerate(specs)
  ]


class NoiseStream(abc.ABC):
  """Round-by-round unit-scale correlated noise with tensor state."""

  #: Rounds the stream may produce (None: no horizon).
  horizon: Optional[int] = None

  @abc.abstractmethod
  def initial_state(self, specs: Specs) -> Any:
    """The state before round 0."""

  @abc.abstractmethod
  def step(self, state: Any, round_index: tf.Tensor,
           source: Any) -> tuple[list[tf.Tensor], Any]:
    """Round `round_index`'s noise from `source`, and the next state."""

  @abc.abstractmethod
  def row_norm(self, state: Any, round_index: tf.Tensor) -> tf.Tensor:
    """float64 std of one coordinate of this round's unit-scale noise."""

  def generate(self, state: Any, round_index: tf.Tensor, seed: tf.Tensor,
               specs: Specs) -> tuple[list[tf.Tensor], Any]:
    """`step` with z from `round_normals` (linear streams)."""
    return self.step(state, round_index, round_normals(seed, round_index, specs))


def horizon_checks(stream: 'NoiseStream',
                   round_index: tf.Tensor) -> list[tf.Operation]:
  """Assertions that `round_index` is below the stream's horizon (if any)."""
  return _check_horizon_op(round_index, stream.horizon,
                           getattr(stream, 'name', 'strategy'))


def _check_horizon_op(round_index: tf.Tensor, horizon: Optional[int],
                      what: str) -> list[tf.Operation]:
  if horizon is None:
    return []
  return [tf.debugging.assert_less(
      tf.cast(round_index, tf.int64), tf.constant(horizon, tf.int64),
      message=(f'fedmf: the {what} strategy was built for n={horizon} rounds '
               f'and cannot produce noise for a later round (0-based round '
               f'index must be < {horizon}). Build the aggregator with a '
               f'strategy for more rounds.'))]


# ---------------------------------------------------------------------------
# DP-SGD: C = I.


@dataclasses.dataclass(frozen=True)
class IdentityNoise(NoiseStream):
  """C = I: round i's noise is z_i itself. No state (an int32 placeholder)."""

  def initial_state(self, specs: Specs) -> Any:
    return tf.constant(0, tf.int32)  # TFF dislikes empty structures.

  def step(self, state, round_index, source):
    return list(source), state

  def row_norm(self, state, round_index):
    return tf.constant(1.0, tf.float64)


# ---------------------------------------------------------------------------
# BLT, 001 Alg. 2 with C's own parameters (mechanisms.md "BLT Streaming"):
#   y_t = z_t - ωᵀS,  S ← diag(θ)S + 1·y_t,   S_0 = 0.
# C⁻¹ is Toeplitz, so ‖row_i(C⁻¹)‖² = Σ_{k≤i} ĉ_k² with ĉ the impulse response
# of the same recursion; it is tracked in float64 in the state (no horizon).


@dataclasses.dataclass(frozen=True)
class BltNoise(NoiseStream):
  """BLT C⁻¹ stream; state = nbuf buffers per model tensor + impulse channel.

  Stacking puts the nbuf buffers of one model tensor into one `[nbuf, *shape]`
  tensor: far fewer tensors cross the TFF executor boundary per round
  (measured ~2× faster rounds). A stacked tensor must stay well below the 2 GiB
  protobuf limit, so with `stack_buffers=None` (default) a variable's buffers
  are stacked only while nbuf × its size is at most `STACK_LIMIT_BYTES`; larger
  variables keep one tensor per buffer. True/False force either layout.
  """

  buf_decay: tuple[float, ...]
  output_scale: tuple[float, ...]
  stack_buffers: Optional[bool] = None

  STACK_LIMIT_BYTES = 256 * 2**20

  @property
  def nbuf(self) -> int:
    return len(self.buf_decay)

  def _stacked(self, shape: tf.TensorShape, dtype: tf.DType) -> bool:
    if self.stack_buffers is not None:
      return self.stack_buffers
    return self.nbuf * shape.num_elements() * dtype.size <= self.STACK_LIMIT_BYTES

  def initial_state(self, specs):
    buffers = tuple(
        tf.zeros([self.nbuf] + spec.shape.as_list(), spec.dtype)
        if self._stacked(spec.shape, spec.dtype) else
        tuple(tf.zeros(spec.shape, spec.dtype) for _ in range(self.nbuf))
        for spec in specs)
    impulse = (tf.zeros([self.nbuf], tf.float64), tf.constant(0.0, tf.float64))
    return (buffers, impulse)

  def step(self, state, round_index, source):
    buffers, (imp_buf, imp_cum) = state
    outputs, new_buffers = [], []
    for z, bufs in zip(source, buffers):
      if not isinstance(bufs, tuple):  # stacked: one [nbuf, *shape] tensor
        expand = [self.nbuf] + [1] * z.shape.rank
        theta = tf.reshape(tf.constant(self.buf_decay, z.dtype), expand)
        omega = tf.constant(self.output_scale, z.dtype)
        y = z - tf.tensordot(omega, bufs, axes=1)
        outputs.append(y)
        new_buffers.append(theta * bufs + y[None])
        continue
      theta = [tf.constant(t, z.dtype) for t in self.buf_decay]
      omega = [tf.constant(w, z.dtype) for w in self.output_scale]
      memory = omega[0] * bufs[0]
      for w, s in zip(omega[1:], bufs[1:]):
        memory = memory + w * s
      y = z - memory
      outputs.append(y)
      new_buffers.append(tuple(t * s + y for t, s in zip(theta, bufs)))
    # Impulse response ĉ_i of the same recursion (input δ_{i,0}), float64.
    theta64 = tf.constant(self.buf_decay, tf.float64)
    omega64 = tf.constant(self.output_scale, tf.float64)
    delta = tf.cast(tf.equal(round_index, 0), tf.float64)
    c_hat = delta - tf.reduce_sum(omega64 * imp_buf)
    new_imp = (theta64 * imp_buf + c_hat, imp_cum + c_hat * c_hat)
    return outputs, (tuple(new_buffers), new_imp)

  def row_norm(self, state, round_index):
    _, (imp_buf, imp_cum) = state
    delta = tf.cast(tf.equal(round_index, 0), tf.float64)
    c_hat = delta - tf.reduce_sum(
        tf.constant(self.output_scale, tf.float64) * imp_buf)
    return tf.sqrt(imp_cum + c_hat * c_hat)


# ---------------------------------------------------------------------------
# Banded C (BandMF, banded Toeplitz), 000 App. J Alg. 9 / mechanisms.md
# "Streaming noise":  y_i = (z_i - Σ_{r=1}^{b̂-1} C[i, i-r] y_{i-r}) / C[i, i].
# State: the b̂-1 previous outputs per tensor, newest first, each a separate
# tensor. Coefficients: `table[i, r]` = C[i, i-r] (from banded_theta) with a
# horizon, or Toeplitz `coefs[r]` without one.


@dataclasses.dataclass(frozen=True, eq=False)
class BandedNoise(NoiseStream):
  """Banded C⁻¹ stream with a b̂-1 ring of previous outputs per tensor."""

  bands: int
  table: Optional[np.ndarray] = None  # (n, bands): C[i, i-r]; horizon n.
  coefs: Optional[np.ndarray] = None  # (bands,): Toeplitz, no horizon.
  row_norms: Optional[np.ndarray] = None  # (n,) ‖row_i C⁻¹‖ (table mode).
  name: str = 'banded'

  @property
  def horizon(self) -> Optional[int]:  # type: ignore[override]
    return None if self.table is None else int(self.table.shape[0])

  @property
  def memory(self) -> int:
    return self.bands - 1

  def initial_state(self, specs):
    buffers = tuple(
        tuple(tf.zeros(spec.shape, spec.dtype) for _ in range(self.memory))
        for spec in specs)
    if self.table is not None:
      return (buffers,)
    impulse = (tf.zeros([max(self.memory, 1)], tf.float64),
               tf.constant(0.0, tf.float64))
    return (buffers, impulse)

  def _coefs(self, round_index, dtype) -> tf.Tensor:
    if self.table is not None:
      return tf.gather(tf.constant(self.table, dtype),
                       tf.cast(round_index, tf.int32))
    return tf.constant(self.coefs, dtype)

  def step(self, state, round_index, source):
    checks = _check_horizon_op(round_index, self.horizon, self.name)
    with tf.control_dependencies(checks):
      buffers = state[0]
      outputs, new_buffers, coefs = [], [], {}
      for z, bufs in zip(source, buffers):
        if z.dtype not in coefs:
          coefs[z.dtype] = self._coefs(round_index, z.dtype)
        coef = coefs[z.dtype]
        acc = z
        for r in range(1, self.bands):  # Newest first: bufs[r-1] = y_{i-r}.
          acc = acc - coef[r] * bufs[r - 1]
        y = acc / coef[0]
        outputs.append(y)
        new_buffers.append(((y,) + tuple(bufs[:-1])) if self.memory else ())
      new_state = (tuple(new_buffers),)
      if self.table is None:
        imp_buf, imp_cum = state[1]
        c_hat = self._impulse(round_index, imp_buf)
        if self.memory:
          imp_buf = tf.concat([[c_hat], imp_buf[:-1]], axis=0)
        new_state += ((imp_buf, imp_cum + c_hat * c_hat),)
    return outputs, new_state

  def _impulse(self, round_index, imp_buf) -> tf.Tensor:
    coef = tf.constant(self.coefs, tf.float64)
    delta = tf.cast(tf.equal(round_index, 0), tf.float64)
    past = tf.reduce_sum(coef[1:] * imp_buf[:self.memory]) if self.memory else 0.0
    return (delta - past) / coef[0]

  def row_norm(self, state, round_index):
    if self.table is not None:
      return tf.gather(tf.constant(self.row_norms, tf.float64),
                       tf.cast(round_index, tf.int32))
    imp_buf, imp_cum = state[1]
    c_hat = self._impulse(round_index, imp_buf)
    return tf.sqrt(imp_cum + c_hat * c_hat)


# ---------------------------------------------------------------------------
# Tree (mechanisms.md TreeAgg; tensorflow_privacy EfficientTreeAggregator and
# TFF's TreeResidualSumQuery). Round t's noise is the change in the decoded
# prefix noise, [D w]_t - [D w]_{t-1}. With t+1 = P + 2^h (h = trailing zeros
# of t+1) the leaf t completes node (h, t >> h); the buffered nodes at heights
# j < h are its left descendants and leave the dyadic cover, so
#   noise_t = e(h) - Σ_{j<h} e(j),
# where e is a node's estimate: vanilla e = w; online Honaker keeps the
# unweighted recursion s = w + (s_left + s_right)/2 and e(j) = s_j/(2 - 2^{-j}).
# State per tensor: one [L, *shape] tensor (L = bit_length(rounds so far)),
# slot j = the buffered node at height j (valid when bit j of t is set).


def _honaker_weight(h) -> Any:
  return 1.0 / (2.0 - 0.5**h)


def tree_round_variances(variant: str, max_height: int = 62) -> np.ndarray:
  """Variance of the per-round noise when leaf t completes a height-h node.

  vanilla: w_h - Σ_{j<h} w_j  → h + 1.
  online Honaker: s_h = Σ_{k≤h} 2^{-(h-k)} w'_k + Σ_{j<h} 2^{-(h-j)} s_j over
  the new right-chain nodes w'_k and the buffered left nodes s_j (independent,
  Var s_j = V_j, V_0 = 1, V_j = 1 + V_{j-1}/2), so
  Var = c_h² Σ_k 4^{-(h-k)} + Σ_{j<h} (c_h 2^{-(h-j)} - c_j)² V_j, c_j = 1/(2-2^{-j}).
  """
  out = np.zeros(max_height + 1)
  if variant == 'vanilla':
    return np.arange(max_height + 1, dtype=np.float64) + 1.0
  v = np.ones(max_height + 1)
  for j in range(1, max_height + 1):
    v[j] = 1.0 + 0.5 * v[j - 1]
  c = np.array([_honaker_weight(j) for j in range(max_height + 1)])
  for h in range(max_height + 1):
    k = np.arange(h + 1)
    total = c[h]**2 * np.sum(0.25**(h - k))
    j = np.arange(h)
    total += np.sum((c[h] * 0.5**(h - j) - c[j])**2 * v[j])
    out[h] = total
  return out


def _trailing_zeros(x: tf.Tensor) -> tf.Tensor:
  """Number of trailing zero bits of a positive int64 (exact up to 2^62)."""
  low = tf.bitwise.bitwise_and(x, -x)
  return tf.cast(tf.round(tf.math.log(tf.cast(low, tf.float64)) / np.log(2.0)),
                 tf.int64)


@dataclasses.dataclass(frozen=True)
class TreeNoise(NoiseStream):
  """Streaming tree noise (vanilla or online Honaker), O(log t · d) state."""

  variant: str = 'online-honaker'

  def initial_state(self, specs):
    return tuple(
        tf.compat.v1.placeholder_with_default(
            tf.zeros([0] + spec.shape.as_list(), spec.dtype),
            shape=[None] + spec.shape.as_list()) for spec in specs)

  def step(self, state, round_index, source: Callable[[Any, Any], list]):
    t = tf.cast(round_index, tf.int64)
    h = _trailing_zeros(t + 1)
    if self.variant == 'vanilla':
      new_nodes = source(h, tf.bitwise.right_shift(t, h))
    else:
      # s = w(0, t); for j < h: s = w(j+1, t >> (j+1)) + (buf[j] + s)/2.
      leaf = source(tf.constant(0, tf.int64), t)

      def body(j, values):
        node = source(j + 1, tf.bitwise.right_shift(t, j + 1))
        return j + 1, [w + 0.5 * (buf[j] + s)
                       for w, buf, s in zip(node, state, values)]

      _, new_nodes = tf.while_loop(lambda j, _: j < h, body,
                                   (tf.constant(0, tf.int64), leaf))
    hi = tf.cast(h, tf.int32)
    weights = tf.range(tf.cast(hi, tf.float64), dtype=tf.float64)
    if self.variant == 'vanilla':
      c_h = tf.constant(1.0, tf.float64)
      c_j = tf.ones_like(weights)
    else:
      c_h = 1.0 / (2.0 - tf.pow(tf.constant(0.5, tf.float64), tf.cast(h, tf.float64)))
      c_j = 1.0 / (2.0 - tf.pow(tf.constant(0.5, tf.float64), weights))
    outputs, new_state = [], []
    for node, buf in zip(new_nodes, state):
      dtype = node.dtype
      below = tf.tensordot(tf.cast(c_j, dtype), buf[:hi], axes=1)
      outputs.append(tf.cast(c_h, dtype) * node - below)
      size = tf.shape(buf)[0]
      grown = tf.cond(hi >= size,
                      lambda b=buf, n=node: tf.concat([b, tf.zeros_like(n)[None]], 0),
                      lambda b=buf: b)
      updated = tf.tensor_scatter_nd_update(grown, [[hi]], node[None])
      updated.set_shape([None] + buf.shape.as_list()[1:])
      new_state.append(updated)
    return outputs, tuple(new_state)

  def generate(self, state, round_index, seed, specs):
    return self.step(state, round_index,
                     lambda height, index: node_normals(seed, height, index, specs))

  def row_norm(self, state, round_index):
    table = tf.constant(np.sqrt(tree_round_variances(self.variant)), tf.float64)
    h = _trailing_zeros(tf.cast(round_index, tf.int64) + 1)
    return tf.gather(table, h)


# ---------------------------------------------------------------------------


def make_noise_stream(strategy: Any,
                      num_rounds: Optional[int] = None) -> NoiseStream:
  """Builds the TF noise generator for a strategy (object, dict or path).

  Args:
    strategy: anything `fedmf.mf.strategies.load_strategy` accepts.
    num_rounds: the horizon n. Defaults to the BandMF file's n; required for a
      column-normalized banded Toeplitz (its C depends on n); for BandMF it may
      be smaller than the file's n (its leading block, normalized at n).
      Ignored (no horizon) for DP-SGD, BLT, unnormalized Toeplitz and the tree.

  Returns:
    A `NoiseStream`.

  Raises:
    FedmfUserError: full-Honaker tree (does not stream), or a missing horizon.
  """
  s = st.load_strategy(strategy)
  if isinstance(s, st.DpSgd):
    return IdentityNoise()
  if isinstance(s, st.Blt):
    return BltNoise(tuple(float(x) for x in s.buf_decay),
                    tuple(float(x) for x in s.output_scale))
  if isinstance(s, st.Tree):
    if s.variant not in ('vanilla', 'online-honaker'):
      raise FedmfUserError(
          f"tree variant {s.variant!r} does not stream (its decoder uses nodes "
          f"of future rounds); use 'online-honaker' or 'vanilla' for training")
    return TreeNoise(s.variant)
  if isinstance(s, st.BandToeplitz) and st.is_toeplitz(s):
    coefs = np.asarray(s.coefficients, np.float64)
    if coefs[0] == 0.0:
      raise st.StrategyError('coefficients: the diagonal coefs[0] must be non-zero')
    return BandedNoise(bands=len(coefs), coefs=coefs, name='band-toeplitz')
  if isinstance(s, (st.BandMF, st.BandToeplitz)):
    if num_rounds is None:
      if isinstance(s, st.BandMF):
        num_rounds = s.n
      else:
        raise FedmfUserError(
            'num_rounds: a column-normalized band-toeplitz strategy needs the '
            'horizon n (its columns are normalized at n)')
    theta = st.banded_theta(s, int(num_rounds))  # theta[r, j] = C[j+r, j].
    bands, n = theta.shape
    table = np.zeros((n, bands))
    for r in range(bands):  # table[i, r] = C[i, i-r] = theta[r, i-r].
      table[r:, r] = theta[r, :n - r]
    if np.any(table[:, 0] == 0.0):
      raise st.StrategyError('columns: banded C has a zero diagonal entry')
    # ‖row_i(C⁻¹)‖ via forward substitution on the identity (dense, n×n).
    import scipy.linalg  # pylint: disable=import-outside-toplevel
    c_inv = scipy.linalg.solve_triangular(st.theta_to_dense(theta), np.eye(n),
                                          lower=True)
    return BandedNoise(bands=bands, table=table,
                       row_norms=np.linalg.norm(c_inv, axis=1), name=s.mechanism)
  raise FedmfUserError(f'unsupported strategy {type(s).__name__}')
