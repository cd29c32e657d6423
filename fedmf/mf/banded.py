"""Column-normalized b̂-banded strategy matrices C (BandMF).

Notation follows docs/architecture.md: n rounds, `bands` = b̂, workload A, strategy C, decoder
B = A C⁻¹, X = CᵀC. A b̂-banded lower-triangular C has C_ij ≠ 0 only for 0 ≤ i - j < b̂.

Internal representation: a (bands × n) float64 array `theta` with theta[r, j] = C[j + r, j]. Entries
with j + r ≥ n are out of range and always zero. Column j of C is theta[:, j] (the architecture's
`columns[j]`, padded with zeros). "Column-normalized" (Scaling BandMF §3.1) means every column has unit L2 norm,
so diag(X) = 1 and, under b-min-sep participation with b ≥ b̂, sens² = k_eff exactly (BandMF §4,
columns b̂ apart have disjoint support).

Implemented here:
- conversion and normalization (`columns_to_theta`, `normalize_columns`, `banded_matrix`);
- streaming C⁻¹ z (BandMF App. J Alg. 9) and C x with O(b̂·d) state;
- the per-round squared error, i.e. squared row norms of B = A C⁻¹, in O(n²b̂) time and O(n b̂)
  memory for the prefix workload (Scaling BandMF Alg. 3, corrected in docs/mechanisms.md);
- ‖A C⁻¹‖²_F and its gradient in the column-normalized parametrization;
- X = CᵀC ↔ C by banded reverse Cholesky (BandMF Prop 4.1).

Squared quantities say so in their names (architecture convention): `loss_sq` = ‖A C⁻¹‖²_F,
`decoder_row_sq_norms`, `sensitivity_sq`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import numpy as np
import scipy.linalg

from fedmf.mf import resources
from fedmf.mf import strategy as strategy_lib
from fedmf.mf import streaming
from fedmf.mf import workloads as workloads_lib

ColumnsLike = Sequence[Sequence[float]] | np.ndarray


# ---------------------------------------------------------------------------------------------
# Representation.


def columns_to_theta(columns: ColumnsLike, n: int | None = None) -> np.ndarray:
  """Packs `columns[j]` (column j from the diagonal down) into a (bands × n) theta array.

  Args:
    columns: a sequence of 1-D arrays, or an already packed 2-D (bands × m) array.
    n: number of rounds; defaults to the number of columns. Only the leading n columns are kept.

  Returns:
    theta with theta[r, j] = columns[j][r]; zero where a column is shorter or j + r ≥ n. The number
    of bands is min(max column length, n).
  """
  if isinstance(columns, np.ndarray) and columns.ndim == 2:
    packed = np.asarray(columns, dtype=np.float64)
    m = packed.shape[1]
    n = m if n is None else int(n)
    if n > m:
      raise ValueError(f'columns has {m} columns, fewer than n={n}')
    bands = min(packed.shape[0], n)
    theta = packed[:bands, :n].copy()
  else:
    cols = [np.asarray(c, dtype=np.float64).reshape(-1) for c in columns]
    m = len(cols)
    n = m if n is None else int(n)
    if n > m or n < 1:
      raise ValueError(f'columns has {m} columns, need n={n} ≥ 1 of them')
    bands = min(max(len(c) for c in cols[:n]), n)
    theta = np.zeros((bands, n), dtype=np.float64)
    for j in range(n):
      c = cols[j][:bands]
      theta[: len(c), j] = c
  if bands < 1:
    raise ValueError('columns must have at least one entry (the diagonal)')
  return _zero_out_of_range(theta)


def theta_to_columns(theta: np.ndarray) -> list[np.ndarray]:
  """Unpacks theta into `columns[j]` of length min(bands, n - j)."""
  bands, n = theta.shape
  return [np.array(theta[: min(bands, n - j), j]) for j in range(n)]


def normalize_columns(columns: ColumnsLike, n: int | None = None) -> np.ndarray:
  """Column-normalized theta for the leading n×n block (Scaling BandMF §3.1).

  Columns are first truncated to their in-range entries min(bands, n - j), then each is divided by
  the L2 norm of those entries. Evaluating a strategy saved for n rounds at n' ≤ n therefore
  renormalizes the truncated last columns.

  Args:
    columns: `columns[j]` sequence or a packed (bands × m) array, m ≥ n.
    n: number of rounds (default: all columns).

  Returns:
    (bands × n) theta whose columns have unit norm.

  Raises:
    ValueError: if a truncated column is all zero.
  """
  theta = columns_to_theta(columns, n)
  with np.errstate(over="ignore", under="ignore"):
    norms = np.sqrt(np.sum(theta * theta, axis=0))
  # Entries below 1e-154 or above 1e154 under- or overflow when squared: rescale those columns by
  # their largest entry first (the others keep the plain formula, bit for bit).
  rescale = np.flatnonzero(~(norms > 1e-150) | ~(norms < 1e150))
  if rescale.size:
    peaks = np.max(np.abs(theta[:, rescale]), axis=0)
    scaled = theta[:, rescale] / np.where(peaks > 0.0, peaks, 1.0)
    norms[rescale] = peaks * np.sqrt(np.sum(scaled * scaled, axis=0))
  bad = np.flatnonzero(~(norms > 0.0) | ~np.isfinite(norms))
  if bad.size:
    raise ValueError(
      f'column {bad[0]} of the banded strategy is zero (or not finite) within n rounds'
    )
  return theta / norms


def banded_matrix(theta: np.ndarray) -> np.ndarray:
  """Dense n×n lower-triangular C with C[j + r, j] = theta[r, j] (for tests and small n)."""
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  c = np.zeros((n, n), dtype=np.float64)
  for r in range(min(bands, n)):
    j = np.arange(n - r)
    c[j + r, j] = theta[r, : n - r]
  return c


def theta_from_matrix(c: np.ndarray, bands: int) -> np.ndarray:
  """Inverse of `banded_matrix`: reads the first `bands` diagonals (entries further down are ignored)."""
  c = np.asarray(c, dtype=np.float64)
  n = c.shape[0]
  bands = min(bands, n)
  theta = np.zeros((bands, n), dtype=np.float64)
  for r in range(bands):
    theta[r, : n - r] = np.diagonal(c, -r)
  return theta


def sensitivity_sq(n: int, bands: int, min_sep: int, max_participations: int | None) -> float:
  """sens² = k_eff of a column-normalized b̂-banded C under b-min-sep with b ≥ b̂ (BandMF §4, Scaling BandMF §3.1).

  k_eff = min(k, ceil(n / b)); k = None means unbounded. Refuses b < b̂, where the columns of
  participating rounds may overlap and this value is not the sensitivity.
  """
  if min_sep < 1:
    raise ValueError(f'min_sep must be ≥ 1, got {min_sep}')
  if min(bands, n) > min_sep:
    raise ValueError(f'bands={bands} > min_sep={min_sep}: sens² = k_eff does not apply')
  k_max = math.ceil(n / min_sep)
  return float(k_max if max_participations is None else min(max_participations, k_max))


# ---------------------------------------------------------------------------------------------
# Streaming C⁻¹ z (one definition for numpy and TensorFlow, see fedmf.mf.streaming).


@dataclasses.dataclass(frozen=True, eq=False)
class BandedStream(streaming.NoiseStream):
  """Round t's [C⁻¹ z]_t for a b̂-banded lower-triangular C (BandMF App. J Alg. 9):

      y_t = (z_t - Σ_{r=1}^{b̂-1} C[t, t-r] y_{t-r}) / C[t, t].

  State: (t, per tensor the b̂ - 1 previous outputs, newest first); the ring shifts by tuple
  re-indexing, so a step allocates one model-sized output and copies nothing. C[t, t-r] comes from
  `table[t, r]` (any banded C over a horizon n: BandMF, a column-normalized banded Toeplitz, a
  dense C as b̂ = n), or from Toeplitz `coefs[r]` (no horizon). The Toeplitz form also carries the
  impulse response ĉ of C⁻¹ in float64, whose running sum of squares is ‖row_t of C⁻¹‖².

  Bit-exact everywhere (issue 11): the sum is a chain of subtractions, and the Toeplitz form
  multiplies by 1/coefs[0] rather than dividing by the constant, which TF's graph optimizer would
  rewrite as that multiplication in the TFF aggregator only. The table's C[t, t] is looked up by
  the round, so its division stays a division in every backend.
  """

  bands: int
  table: Optional[np.ndarray] = None  # (n, b̂): table[t, r] = C[t, t-r] (0 where t < r).
  coefs: Optional[tuple[float, ...]] = None  # (b̂,): C[t, t-r] = coefs[r].
  row_norm_table: Optional[np.ndarray] = None  # (n,): ‖row_t of C⁻¹‖ with `table`.
  rounds: Optional[int] = None  # A horizon for the Toeplitz form (its C⁻¹ grows with the rounds).

  @property
  def horizon(self) -> Optional[int]:  # type: ignore[override]
    return self.rounds if self.table is None else int(self.table.shape[0])

  @property
  def memory(self) -> int:
    return self.bands - 1

  def _ring(self, shape, dtype, ops) -> tuple:
    # A bands = 1 (diagonal) C keeps one unused scalar: TFF refuses empty state structures.
    if not self.memory:
      return (ops.zeros((), dtype),)
    return tuple(ops.zeros(shape, dtype) for _ in range(self.memory))

  def model_buffers(self, rounds: int) -> int:
    return max(self.bands - 1, 0)

  def init(self, specs, ops):
    state = (
      streaming.round_counter(ops),
      tuple(self._ring(spec.shape, spec.dtype, ops) for spec in specs),
    )
    if self.table is None:
      state += ((self._ring((), ops.float64, ops), ops.constant(0.0, ops.float64)),)
    return state

  def _coefficients(self, t, dtype, ops):
    if self.table is not None:
      return ops.gather(self.table, t, dtype)
    return self.coefs

  def _apply(self, z, ring, coef):
    acc = z
    for r in range(1, self.bands):  # Newest first: ring[r-1] = y_{t-r}.
      acc = acc - coef[r] * ring[r - 1]
    y = acc / coef[0] if self.table is not None else acc * (1.0 / coef[0])
    return y, (((y,) + tuple(ring[:-1])) if self.memory else tuple(ring))

  def step(self, state, z, ops):
    t, rings = state[0], state[1]
    draws = z(0)
    coefs = {}
    outputs, new_rings = [], []
    for zk, ring in zip(draws, rings):
      if zk.dtype not in coefs:
        coefs[zk.dtype] = self._coefficients(t, zk.dtype, ops)
      y, new_ring = self._apply(zk, ring, coefs[zk.dtype])
      outputs.append(y)
      new_rings.append(new_ring)
    new_state = (t + 1, tuple(new_rings))
    if self.table is None:
      imp_ring, cum = state[2]
      c_hat, imp_ring = self._apply(ops.is_first_round(t, ops.float64), imp_ring, self.coefs)
      new_state += ((imp_ring, cum + c_hat * c_hat),)
    return outputs, new_state

  def row_norm(self, state, ops):
    t = state[0]
    if self.table is not None:
      return ops.gather(self.row_norm_table, t, ops.float64)
    imp_ring, cum = state[2]
    c_hat, _ = self._apply(ops.is_first_round(t, ops.float64), imp_ring, self.coefs)
    return ops.sqrt(cum + c_hat * c_hat)

  def host_kernel(self, specs):
    return BandedKernel(self, specs)


class BandedKernel(streaming.HostKernel):
  """`BandedStream.step` in numpy with the b̂ - 1 previous outputs of a tensor in one
  [b̂ - 1, size] array with a rotating head: the newest output overwrites the oldest row, so the
  state is the buffers alone (no shift, no copy) and a round reads each row once, chunk by chunk,
  with the definition's operations in its order (tests/mf/test_host_kernels.py). For BandMF at
  b̂ = 342 on the 4M-parameter LSTM that is 5.3 GiB held, 1.0x the buffers (BandMF §3, Scaling
  BandMF §3.3 on the memory limit).
  """

  def __init__(self, stream: BandedStream, specs):
    super().__init__(stream, specs)
    self._rings = []
    for spec in self.specs:
      ring = np.empty((stream.memory, int(np.prod(spec.shape))), spec.dtype)
      ring.fill(0)  # Commits the pages now: the memory is held from round 0, not on first write.
      self._rings.append(ring)
    self._head = 0  # Row of y_{t-1}; y_{t-r} is row (head + r - 1) % (b̂ - 1).

  def _coefficients(self, dtype):
    stream = self.stream
    if stream.table is not None:
      return np.asarray(stream.table[self.round], dtype)
    return np.asarray(stream.coefs, dtype)

  def step(self, z):
    stream, memory = self.stream, self.stream.memory
    rows = [(self._head + r - 1) % memory for r in range(1, stream.bands)] if memory else []
    outputs = []
    for zk, ring, spec in zip(z(0), self._rings, self.specs):
      coef = self._coefficients(ring.dtype)
      inverse = ring.dtype.type(1.0 / float(stream.coefs[0])) if stream.table is None else None
      zk = np.asarray(zk, ring.dtype).reshape(-1)
      y = np.empty_like(zk)
      tmp = np.empty(min(streaming.CHUNK, zk.size), ring.dtype)
      for lo, hi in streaming.chunks(zk.size):
        acc, t = y[lo:hi], tmp[: hi - lo]
        acc[...] = zk[lo:hi]
        for r, row in enumerate(rows, start=1):
          np.subtract(acc, np.multiply(coef[r], ring[row, lo:hi], out=t), out=acc)
        if inverse is None:
          np.divide(acc, coef[0], out=acc)
        else:
          np.multiply(acc, inverse, out=acc)
        if memory:
          ring[rows[-1], lo:hi] = acc  # The oldest row, read for the last time just above.
      outputs.append(y.reshape(spec.shape))
    if memory:
      self._head = rows[-1]
    self._advance_scalars()
    return outputs

  def buffers(self):
    return list(self._rings)

  def tensor_state(self, copy):
    memory = self.stream.memory
    wrap = np.array if copy else np.asarray
    out = []
    for ring, spec in zip(self._rings, self.specs):
      if not memory:
        out.append((np.zeros((), spec.dtype),))
        continue
      out.append(
        tuple(wrap(ring[(self._head + r) % memory]).reshape(spec.shape) for r in range(memory))
      )
    return tuple(out)

  def restore_tensors(self, tensors):
    memory = self.stream.memory
    for ring, value, spec in zip(self._rings, tensors, self.specs):
      if len(value) != max(memory, 1):
        raise ValueError(f'noise state has {len(value)} previous outputs, expected {memory}')
      for r in range(memory):
        ring[r] = streaming.check_shape(value[r], spec.shape, 'previous output').reshape(-1)
    self._head = 0


def inverse_row_sq_norms(theta: np.ndarray) -> np.ndarray:
  """‖row_t(C⁻¹)‖² for t < n of the banded C given by theta, without an n×n matrix.

  They are the diagonal of W = C⁻¹C⁻ᵀ. C W = C⁻ᵀ is upper triangular with diagonal 1/C_tt, so for
  j ≤ t
      W_tj = (δ_tj / C_tt - Σ_{r=1}^{b̂-1} C[t, t-r] W_{t-r, j}) / C_tt,
  which only reads the (b̂-1)×(b̂-1) window of W next to the diagonal (selected inversion,
  Takahashi, Fagan and Chin 1973): O(n·b̂²) time and O(b̂²) memory, kept as a ring indexed by
  round mod (b̂-1). When b̂ > n/4 the dense triangular inverse (LAPACK dtrtri, n³/3 BLAS-3 work) is
  faster and used instead. A singular or overflowing C gives inf (callers refuse it).
  """
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  if 4 * bands > n:
    c = banded_matrix(theta)
    with np.errstate(all='ignore'):
      c_inv, info = scipy.linalg.lapack.dtrtri(c, lower=1)
      if info != 0:
        return np.full(n, np.inf)
      return np.einsum('ij,ij->i', c_inv, c_inv)
  m = bands - 1
  out = np.empty(n)
  window = np.zeros((max(m, 1), max(m, 1)))  # window[k % m, j % m] = W_kj for k, j in [t-m, t)
  row = np.zeros(max(m, 1))
  lags = np.arange(1, m + 1)
  with np.errstate(all='ignore'):
    for t in range(n):
      d = theta[0, t]
      if not m:
        out[t] = 1.0 / (d * d)
        continue
      r = lags[lags <= t]
      row[:] = 0.0
      row[(t - r) % m] = theta[r, t - r]  # C[t, t-r] at the ring slot of round t - r.
      w = -(window @ row) / d  # W_{t,k} for the rounds k of the window.
      w_tt = (1.0 / d - row @ w) / d
      out[t] = w_tt
      slot = t % m  # Round t - m leaves the window, round t takes its slot.
      window[slot, :] = w
      window[:, slot] = w
      window[slot, slot] = w_tt
  return out


def banded_stream(theta: np.ndarray) -> BandedStream:
  """The C⁻¹ stream of the banded C given by theta (b̂ × n) over its horizon n."""
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  if np.any(theta[0] == 0.0):
    raise ValueError("banded C has a zero diagonal entry and is not invertible")
  table = np.zeros((n, bands))
  for r in range(bands):  # table[t, r] = C[t, t-r] = theta[r, t-r].
    table[r:, r] = theta[r, : n - r]
  return BandedStream(bands=bands, table=table, row_norm_table=np.sqrt(inverse_row_sq_norms(theta)))


def toeplitz_stream(coefs: Sequence[float], rounds: Optional[int] = None) -> BandedStream:
  """The C⁻¹ stream of the banded Toeplitz C = LtToep(coefs), with no horizon unless `rounds`."""
  coefs = tuple(float(c) for c in coefs)
  if coefs[0] == 0.0:
    raise ValueError("the diagonal coefficient coefs[0] must be non-zero")
  return BandedStream(bands=len(coefs), coefs=coefs, rounds=rounds)


# ---------------------------------------------------------------------------------------------
# Error of the decoder B = A C⁻¹.


def decoder_row_sq_norms(theta: np.ndarray, workload: np.ndarray | None = None) -> np.ndarray:
  """Squared row norms ‖row_i(A C⁻¹)‖² (per-round squared error, sensitivity excluded).

  Prefix workload (workload None or the ones matrix): Scaling BandMF Alg. 3 as corrected in docs/mechanisms.md. Row i of
  C⁻¹ comes from banded forward substitution, y_i = (e_i - Σ_{j=i-b̂+1}^{i-1} C_ij y_j) / C_ii, and
  row i of B is b_i = b_{i-1} + y_i. O(n²b̂) time, O(n b̂) memory.

  Other workloads: dense B = A C⁻¹ with `scipy.linalg.solve_triangular` (O(n³), O(n²) memory).

  Args:
    theta: (bands × n) banded C (not renormalized here).
    workload: dense n×n lower-triangular A, or None for prefix sum.

  Returns:
    float64 array of length n.
  """
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  if np.any(theta[0] == 0.0):
    raise ValueError('banded C has a zero diagonal entry and is not invertible')
  if not workloads_lib.is_prefix_sum(workload):
    a = np.asarray(workload, dtype=np.float64)
    if a.shape != (n, n):
      raise ValueError(f'workload has shape {a.shape}, expected ({n}, {n})')
    c = banded_matrix(theta)
    # B = A C⁻¹  ⇔  Bᵀ = C⁻ᵀ Aᵀ.
    b_t = scipy.linalg.solve_triangular(c, a.T, trans='T', lower=True, check_finite=False)
    return np.einsum('ij,ij->j', b_t, b_t)
  m = bands - 1
  rows = np.zeros((max(m, 1), n), dtype=np.float64)  # ring buffer of the last m rows of C⁻¹
  acc = np.zeros(n, dtype=np.float64)  # b_i, row i of B = A C⁻¹
  out = np.empty(n, dtype=np.float64)
  coef = np.zeros(max(m, 1), dtype=np.float64)
  for i in range(n):
    w = i + 1  # row i of C⁻¹ is zero beyond column i
    if m > 0 and i > 0:
      coef[:] = 0.0
      j = np.arange(max(0, i - m), i)
      coef[j % m] = theta[i - j, j]
      y = -(coef @ rows[:, :w])
    else:
      y = np.zeros(w)
    y[i] += 1.0
    y /= theta[0, i]
    if m > 0:
      rows[i % m, :w] = y
      rows[i % m, w:] = 0.0
    acc[:w] += y
    out[i] = acc[:w] @ acc[:w]
  return out


def loss_sq(theta: np.ndarray, workload: np.ndarray | None = None) -> float:
  """‖A C⁻¹‖²_F for the given banded C (squared; BandMF Eq. 3–4 without the sens² factor)."""
  return float(np.sum(decoder_row_sq_norms(theta, workload)))


def band_of_product(p: np.ndarray, q: np.ndarray, bands: int) -> np.ndarray:
  """Returns g with g[r, j] = (Pᵀ Q)[j + r, j] for r < bands, computed blockwise in O(n²·bands)."""
  n = q.shape[1]
  bands = min(bands, n)
  g = np.zeros((bands, n), dtype=np.float64)
  for s in range(0, n, bands):
    e, e2 = min(s + bands, n), min(s + 2 * bands - 1, n)
    _store_band(p[:, s:e2].T @ q[:, s:e], s, e, e2, g)
  return g


def _store_band(block: np.ndarray, s: int, e: int, e2: int, g: np.ndarray) -> None:
  # block[a, c] = (PᵀQ)[s + a, s + c] for rows s..e2-1 and columns s..e-1; g[r, j] = block[j+r-s, j-s].
  cols = np.arange(s, e)
  for r in range(g.shape[0]):
    c = cols[cols + r < e2]
    g[r, c] = block[c + r - s, c - s]


def loss_sq_and_grad(
  theta: np.ndarray, workload: np.ndarray | None = None, row_weights: np.ndarray | None = None
) -> tuple[float, np.ndarray]:
  """‖A C(Θ)⁻¹‖²_F and its gradient w.r.t. the raw parameters Θ of a column-normalized C.

  C(Θ) has column j equal to Θ[:, j] / ‖Θ[:, j]‖ (in-range entries; Scaling BandMF §3.1). With F = A C⁻¹ and
  M = F C⁻ᵀ = A X⁻¹, ∂‖F‖²/∂C = -2 Fᵀ M restricted to the band, and the normalization chain rule is
  ∂/∂θ_j = (g_j - c_j ⟨c_j, g_j⟩) / ‖θ_j‖. Dense O(n³) time in LAPACK/BLAS-3 (a triangular inverse
  plus ~n³/2 flops of blocked products), O(n²) memory. The workload must be lower triangular.

  Args:
    theta: (bands × n) raw parameters (normalized internally).
    workload: dense lower-triangular A, or None for prefix sum.
    row_weights: optional w ≥ 0; then the value is Σ_i w_i ‖row_i(A C⁻¹)‖² (= ‖diag(√w) A C⁻¹‖²_F).

  Returns:
    (value, grad) with grad of theta's shape (zero out of range).
  """

  def weights(row_sq):
    if row_weights is None:
      return float(np.sum(row_sq)), None
    w = np.asarray(row_weights, dtype=np.float64)
    return float(w @ row_sq), w

  value, grad, _ = loss_and_grad_with_row_weights(theta, workload, weights)
  return value, grad


def loss_and_grad_with_row_weights(
  theta: np.ndarray,
  workload: np.ndarray | None,
  weights: Callable[[np.ndarray], tuple[float, np.ndarray | None]],
) -> tuple[float, np.ndarray, np.ndarray]:
  """Gradient of any objective φ(r) of the squared row norms r_i = ‖row_i(A C(Θ)⁻¹)‖².

  `weights(r)` returns (φ(r), w) with w = ∂φ/∂r (None means all ones); the Θ-gradient is that of
  Σ_i w_i r_i at fixed w (see `loss_sq_and_grad`). Returns (φ(r), grad, r).
  """
  theta = _zero_out_of_range(np.array(theta, dtype=np.float64))
  bands, n = theta.shape
  norms = np.sqrt(np.sum(theta * theta, axis=0))
  c_theta = theta / norms
  c = banded_matrix(c_theta)
  c_inv, info = scipy.linalg.lapack.dtrtri(c, lower=1)
  if info != 0:
    raise ValueError('banded C is singular')
  f = apply_workload(workload, c_inv)
  row_sq = np.einsum('ij,ij->i', f, f)
  value, w = weights(row_sq)
  f_w = f if w is None else f * w[:, None]  # D F with D = diag(w): ∂(Σ w_i r_i)/∂C = -2 Fᵀ D F C⁻ᵀ
  # Band of Fᵀ M with M = (D F) C⁻ᵀ, one block of b̂ columns j ∈ [s, e) at a time. F and C⁻¹ are lower
  # triangular, so rows k < s of F vanish on the band and M[s:, s:e] = (DF)[s:, :e] C⁻¹[s:e, :e]ᵀ.
  g = np.zeros((bands, n), dtype=np.float64)
  for s in range(0, n, bands):
    e, e2 = min(s + bands, n), min(s + 2 * bands - 1, n)
    m_blk = f_w[s:, :e] @ c_inv[s:e, :e].T
    _store_band(f[s:, s:e2].T @ m_blk, s, e, e2, g)
  g = _zero_out_of_range(-2.0 * g)
  grad = (g - c_theta * np.sum(c_theta * g, axis=0)) / norms
  return value, grad, row_sq


def apply_workload(workload: np.ndarray | None, c_inv: np.ndarray) -> np.ndarray:
  """Dense A C⁻¹ given the dense lower-triangular C⁻¹ (workload None = prefix sum: a row cumsum)."""
  if workload is None:
    return np.cumsum(c_inv, axis=0)
  a = np.asarray(workload, dtype=np.float64)
  if a.shape != c_inv.shape:
    raise ValueError(f'workload has shape {a.shape}, expected {c_inv.shape}')
  if np.any(np.triu(a, 1) != 0):
    raise ValueError('workload must be lower triangular')
  return a @ c_inv


# ---------------------------------------------------------------------------------------------
# X = CᵀC and the banded reverse Cholesky (BandMF Prop 4.1).


def gram_band(theta: np.ndarray) -> np.ndarray:
  """Lower band of X = CᵀC: x_low[r, j] = X[j + r, j] for r < bands (X is b̂-banded, symmetric)."""
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  x_low = np.zeros_like(theta)
  # X[j+r, j] = Σ_s C[s, j+r] C[s, j] = Σ_t theta[t, j+r] theta[t + r, j].
  for r in range(bands):
    x_low[r, : n - r] = np.sum(theta[: bands - r, r:] * theta[r:, : n - r], axis=0)
  return x_low


def reverse_cholesky_banded(x_low: np.ndarray) -> np.ndarray:
  """The lower-triangular b̂-banded C with CᵀC = X, as theta (BandMF Prop 4.1).

  With J the exchange matrix, JXJ = L Lᵀ (ordinary banded Cholesky) and C = J Lᵀ J, i.e.
  C[j + r, j] = L[n-1-j, n-1-j-r]: both bands are the lower bands of L read backwards.

  Args:
    x_low: (bands × n) lower band of a symmetric positive definite b̂-banded X.

  Returns:
    theta of C (diagonal positive).

  Raises:
    numpy.linalg.LinAlgError: if X is not positive definite.
  """
  x_low = np.asarray(x_low, dtype=np.float64)
  flipped = _flip_band(x_low)
  l_low = scipy.linalg.cholesky_banded(flipped, lower=True, check_finite=False)
  return _flip_band(l_low)


def _flip_band(band: np.ndarray) -> np.ndarray:
  # (JYJ)[j + r, j] = Y[n-1-j, n-1-j-r]: reverse each diagonal's in-range entries.
  out = np.zeros_like(band)
  bands, n = band.shape
  for r in range(bands):
    out[r, : n - r] = band[r, : n - r][::-1]
  return out


def _zero_out_of_range(theta: np.ndarray) -> np.ndarray:
  bands, n = theta.shape
  for r in range(1, bands):
    theta[r, max(n - r, 0) :] = 0.0
  return theta


# ---------------------------------------------------------------------------------------------
# The BandMF strategy.


def banded_sensitivity_cost(schema, bands: int) -> Optional[resources.Cost]:
  """Cost of the exact banded sensitivity (b ≥ b̂; None otherwise): the band and VecSens."""
  n, b, k = schema.n, schema.min_sep, schema.effective_max_participations
  if b < min(bands, n):
    return None
  return resources.Cost.of(
    f"the {min(bands, n)}×{n} band and VecSens over its column norms",
    resources.FLOAT * (4.0 * min(bands, n) + 8.0) * float(n),
    float(n) * (min(bands, n) + k) / resources.VECTOR_RATE,
  )


def banded_error_cost(n: int, bands: int) -> resources.Cost:
  """Cost of `decoder_row_sq_norms` for the prefix sum: O(n²b̂) time, O(n b̂) memory."""
  bands = min(bands, n)
  return resources.Cost.of(
    f"the O(n²·b̂) banded recursion for the errors (n={n}, b̂={bands})",
    resources.FLOAT * (4.0 * bands * float(n) + 6.0 * n),
    # Row i costs (2(b̂-1) + 8)·i vector operations: the band product and the running sums.
    float(n) / resources.PYTHON_RATE + (bands + 3.0) * float(n) ** 2 / resources.VECTOR_RATE,
  )


@dataclasses.dataclass(frozen=True, eq=False)
class BandMF(strategy_lib.Strategy):
  """Column-normalized b̂-banded C over `n` rounds (Scaling BandMF §3.1).

  JSON: {"mechanism": "bandmf", "n": N, "bands": BH, "columns": [[...], ...]}, columns[j] = column
  j of C from the diagonal down, min(b̂, n-j) entries, possibly unnormalized. C is used
  column-normalized, so sens² = k_eff whenever b ≥ b̂. A file built for n serves any n' ≤ n through
  its leading n'×n' block, normalized at n'. `theta[r, j]` holds the raw C[j+r, j].
  """

  n: int
  bands: int
  theta: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "bandmf"
  conditioning_field: ClassVar[str] = "strategy field 'columns'"

  @property
  def columns(self) -> list[list[float]]:
    return [self.theta[: min(self.bands, self.n - j), j].tolist() for j in range(self.n)]

  @classmethod
  def from_dict(cls, obj):
    n = strategy_lib.positive_int(obj, "n")
    bands = strategy_lib.positive_int(obj, "bands")
    if bands > n:
      raise strategy_lib.StrategyError(
        f"strategy field 'bands' ({bands}) must not exceed 'n' ({n})"
      )
    columns = obj.get("columns")
    if columns is None:
      raise strategy_lib.StrategyError("strategy field 'columns' is missing")
    if isinstance(columns, np.ndarray):
      columns = list(columns)
    if not isinstance(columns, (list, tuple)) or len(columns) != n:
      got = len(columns) if isinstance(columns, (list, tuple)) else type(columns).__name__
      raise strategy_lib.StrategyError(
        f"strategy field 'columns' must be a list of n={n} columns, got {got}"
      )
    resources.check_memory(
      3.0 * resources.FLOAT * bands * n, f"its {bands}×{n} band", f"loading bandmf (n={n})"
    )
    theta = np.zeros((bands, n))
    for j, column in enumerate(columns):
      expected = min(bands, n - j)
      values = strategy_lib.float_array(column, f"strategy field 'columns[{j}]'", 1)
      if len(values) != expected:
        raise strategy_lib.StrategyError(
          f"strategy field 'columns[{j}]' must have min(bands, n-j) = {expected} entries, got {values.size}"
        )
      if values[0] == 0:
        raise strategy_lib.StrategyError(
          f"strategy field 'columns[{j}]': the diagonal entry must be non-zero"
        )
      theta[:expected, j] = values
    strategy = cls(
      n,
      bands,
      strategy_lib.readonly(theta),
      metadata=strategy_lib.extra_fields(obj, ("n", "bands", "columns")),
    )
    strategy.check_conditioning()
    return strategy

  def fields(self):
    return {"n": self.n, "bands": self.bands, "columns": self.columns}

  def describe(self) -> str:
    return f"bandmf (n={self.n}, {self.bands} band{'s' if self.bands != 1 else ''})"

  @property
  def horizon(self) -> int:
    return self.n

  def banded_theta(self, n: int) -> np.ndarray:
    """Columns truncated to the leading n×n block, then normalized (unit-norm columns of C)."""
    self.check_horizon(n)
    return normalize_columns(self.theta, n)

  def noise_stream(self, n: Optional[int] = None) -> BandedStream:
    return banded_stream(self.banded_theta(self.n if n is None else n))

  def conditioning(self, n: Optional[int] = None) -> strategy_lib.Conditioning:
    """Unit columns (s = 1) and the exact r over the horizon, in O(n·b̂²).

    Evaluating at n' < n renormalizes the truncated columns, which scales row t of C⁻¹ by
    ‖truncated column t‖ ≤ ‖column t‖, so r, and κ, at n' never exceed their value at n.
    """
    n = self.n if n is None else n
    theta = self.banded_theta(n)
    gain = float(np.sqrt(np.max(inverse_row_sq_norms(theta))))
    return strategy_lib.Conditioning(1.0, gain, float(np.max(np.abs(theta[0]))), n)

  def exact_sensitivity_cost(self, schema):
    return banded_sensitivity_cost(schema, self.bands)

  def error_cost(self, n, dense_workload=False):
    return super().error_cost(n, True) if dense_workload else banded_error_cost(n, self.bands)

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    n, nn = schema.n, float(schema.n) ** 2
    # loss_and_grad_with_row_weights holds C, C⁻¹, A C⁻¹, its weighted copy and block products.
    return resources.Cost.of(
      f"the dense {n}×{n} C, C⁻¹ and A C⁻¹ of every optimizer step", 8 * resources.FLOAT * nn
    ) + banded_error_cost(n, options.band_count(schema))

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):
    from fedmf.mf import banded_optimize  # pylint: disable=g-import-not-at-top

    bands = options.band_count(schema)
    theta, info = banded_optimize.optimize_bandmf(
      schema.n,
      bands,
      min_sep=schema.min_sep,
      max_participations=schema.max_participations,
      objective=options.objective or "rms",
      progress=options.progress,
      **options.max_iter_kwargs(),
    )
    columns = [list(theta[: min(bands, schema.n - j), j]) for j in range(schema.n)]
    strategy = cls.from_dict(
      {"mechanism": cls.mechanism, "n": schema.n, "bands": bands, "columns": columns}
    )
    return strategy, {"objective": options.objective or "rms", "bands": bands, **info}
