"""Column-normalized b̂-banded strategy matrices C (BandMF): representation and algebra.

Notation follows docs/architecture.md: n rounds, `bands` = b̂, workload A, strategy C, decoder
B = A C⁻¹, X = CᵀC. A b̂-banded lower-triangular C has C_ij ≠ 0 only for 0 ≤ i - j < b̂.

Internal representation: a (bands × n) float64 array `theta` with theta[r, j] = C[j + r, j]. Entries
with j + r ≥ n are out of range and always zero. Column j of C is theta[:, j] (the architecture's
`columns[j]`, padded with zeros). "Column-normalized" (Scaling BandMF §3.1) means every column has unit L2 norm,
so diag(X) = 1 and, under b-min-sep participation with b ≥ b̂, sens² = k_eff exactly (BandMF §4,
columns b̂ apart have disjoint support).

Implemented here (pure functions of theta; the noise stream is `fedmf.mf.banded_stream`, the
optimizer `fedmf.mf.banded_optimize`, the strategy `fedmf.mf.banded.BandMF`):
- conversion and normalization (`columns_to_theta`, `normalize_columns`, `banded_matrix`);
- ‖row_t(C⁻¹)‖² by selected inversion (`inverse_row_sq_norms`);
- the per-round squared error, i.e. squared row norms of B = A C⁻¹, for the prefix workload by
  the block recursion of `fedmf.mf.banded_blocks` (O(n·b̂²) time, O(n b̂) memory) and, as an
  independent check, by Scaling BandMF Alg. 3 (corrected in docs/mechanisms.md, O(n²b̂));
- ‖A C⁻¹‖²_F and its gradient in the column-normalized parametrization;
- X = CᵀC ↔ C by banded reverse Cholesky (BandMF Prop 4.1);
- the resource estimates of the banded sensitivity and errors.

Squared quantities say so in their names (architecture convention): `loss_sq` = ‖A C⁻¹‖²_F,
`decoder_row_sq_norms`, `sensitivity_sq`.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import scipy.linalg

from fedmf.mf import banded_blocks
from fedmf.mf import resources
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
  return banded_blocks.zero_out_of_range(theta)


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


def inverse_row_sq_norms(theta: np.ndarray) -> np.ndarray:
  """‖row_t(C⁻¹)‖² for t < n of the banded C given by theta, without an n×n matrix.

  They are the diagonal of W = C⁻¹C⁻ᵀ, by the block selected inversion of
  `fedmf.mf.banded_blocks` with G = C (Takahashi, Fagan and Chin 1973): O(n·s²) time with
  s = max(b̂ + 1, 64), O(n·b̂ + s²) memory. A singular or overflowing C gives inf (callers refuse it).
  """
  theta = np.asarray(theta, dtype=np.float64)
  n = theta.shape[1]
  with np.errstate(all='ignore'):
    try:
      # PrefixError zeroes the out-of-range entries of its own copy for this workload.
      out = banded_blocks.PrefixError(theta, keep=False, workload='identity').row_sq
    except ValueError:  # a zero pivot
      return np.full(n, np.inf)
  return np.where(np.isfinite(out), out, np.inf)


# ---------------------------------------------------------------------------------------------
# Error of the decoder B = A C⁻¹.


def decoder_row_sq_norms(theta: np.ndarray, workload: np.ndarray | None = None) -> np.ndarray:
  """Squared row norms ‖row_i(A C⁻¹)‖² (per-round squared error, sensitivity excluded).

  Prefix workload (workload None or the ones matrix): A C⁻¹ = (C D)⁻¹ with D = A⁻¹ bidiagonal,
  and the row norms are the diagonal of (CD)⁻¹(CD)⁻ᵀ, by block selected inversion
  (`fedmf.mf.banded_blocks`): O(n·s²) time with s = max(b̂ + 1, 64), O(n·b̂ + s²) memory. (Scaling
  BandMF Alg. 3 forms each row of A C⁻¹ instead, O(n²·b̂); tests/mf/test_banded.py checks both
  against the dense B.)

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
  return banded_blocks.row_sq_norms(banded_blocks.zero_out_of_range(theta.copy()))


def decoder_row_sq_norms_by_rows(theta: np.ndarray) -> np.ndarray:
  """The same for the prefix sum by Scaling BandMF Alg. 3 (corrected in docs/mechanisms.md): row
  i of C⁻¹ by banded forward substitution, y_i = (e_i - Σ_{j=i-b̂+1}^{i-1} C_ij y_j) / C_ii, and row
  i of B is b_i = b_{i-1} + y_i. O(n²b̂) time, O(n b̂) memory; an independent check of the block
  recursion (tests)."""
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
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
  ∂/∂θ_j = (g_j - c_j ⟨c_j, g_j⟩) / ‖θ_j‖. For the prefix sum the value and ∂/∂C come from the block
  recursion of `fedmf.mf.banded_blocks` (O(n·b̂²) time in BLAS-3, O(n·b̂) memory); other workloads
  take the dense route: O(n³) time in LAPACK/BLAS-3 (a triangular inverse plus ~n³/2 flops of
  blocked products), O(n²) memory. The workload must be lower triangular.

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


ROUTES = ('auto', 'blocks', 'dense')


def loss_and_grad_with_row_weights(
  theta: np.ndarray,
  workload: np.ndarray | None,
  weights: Callable[[np.ndarray], tuple[float, np.ndarray | None]],
  route: str = 'auto',
) -> tuple[float, np.ndarray, np.ndarray]:
  """Gradient of any objective φ(r) of the squared row norms r_i = ‖row_i(A C(Θ)⁻¹)‖².

  `weights(r)` returns (φ(r), w) with w = ∂φ/∂r (None means all ones); the Θ-gradient is that of
  Σ_i w_i r_i at fixed w (see `loss_sq_and_grad`). Returns (φ(r), grad, r). `route` 'auto' takes
  the block recursion for the prefix sum and the dense route otherwise; 'dense' forces the dense
  route (the same-run baseline of benchmarks/bandmf_benchmark.py, and a cross-check in tests).
  """
  if route not in ROUTES:
    raise ValueError(f'route must be one of {ROUTES}, got {route!r}')
  theta = banded_blocks.zero_out_of_range(np.array(theta, dtype=np.float64))
  bands, n = theta.shape
  norms = np.sqrt(np.einsum('ij,ij->j', theta, theta))  # no (bands × n) temporary
  c_theta = theta / norms
  prefix_sum = workloads_lib.is_prefix_sum(workload)
  if route == 'blocks' and not prefix_sum:
    raise ValueError("route 'blocks' needs the prefix-sum workload")
  if prefix_sum and route != 'dense':
    # The block recursion (`fedmf.mf.banded_blocks`): O(n·b̂²) in BLAS-3, no n×n matrix. A trial
    # point of the optimizer may be near-singular: its loss overflows to inf (the line search then
    # shortens the step), without warnings.
    with np.errstate(over='ignore', invalid='ignore'):
      prefix = banded_blocks.PrefixError(c_theta)
    row_sq = prefix.row_sq
    if not np.all(np.isfinite(row_sq)):
      return math.inf, np.zeros_like(theta), row_sq
    value, w = weights(row_sq)
    g = prefix.gradient(w)
    return value, _normalization_chain_rule(g, c_theta, norms), row_sq
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
  g = banded_blocks.zero_out_of_range(-2.0 * g)
  return value, _normalization_chain_rule(g, c_theta, norms), row_sq


def _normalization_chain_rule(g: np.ndarray, c_theta: np.ndarray, norms: np.ndarray) -> np.ndarray:
  """∂/∂Θ from g = ∂/∂C through C[:, j] = Θ[:, j]/‖Θ[:, j]‖: (g - C·(Cᵀg)_jj)/‖Θ[:, j]‖, per
  column (Scaling BandMF §3.1); overwrites g (in place: two temporaries fewer per evaluation)."""
  g -= c_theta * np.einsum('ij,ij->j', c_theta, g)
  g /= norms
  return g


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


# ---------------------------------------------------------------------------------------------
# Resource estimates.


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
  """Cost of `decoder_row_sq_norms` for the prefix sum: the block recursion's forward pass."""
  bands = min(bands, n)
  macs, floats = banded_blocks.pass_cost(n, bands, gradient=False)
  return resources.Cost.of(
    f"the O(n·b̂²) block recursion for the errors (n={n}, b̂={bands})",
    resources.FLOAT * (floats + bands * float(n)) + _block_index_bytes(n, bands),
    macs / resources.DENSE_RATE + _block_python_seconds(n, bands),
  )


def banded_gradient_cost(n: int, bands: int) -> resources.Cost:
  """Cost of one `loss_and_grad_with_row_weights` for the prefix sum (forward and reverse pass,
  the normalization and its chain rule)."""
  bands = min(bands, n)
  macs, floats = banded_blocks.pass_cost(n, bands, gradient=True)
  return resources.Cost.of(
    f"the O(n·b̂²) block recursion and its reverse pass (n={n}, b̂={bands})",
    resources.FLOAT * (floats + 4.0 * bands * float(n)) + _block_index_bytes(n, bands),
    macs / resources.DENSE_RATE + 2.0 * _block_python_seconds(n, bands),
  )


def _block_index_bytes(n: int, bands: int) -> float:
  # `banded_blocks._BandIndex`: per block shape an s×s index pass (int64 lags, mask, positions).
  s = banded_blocks.block_size(bands, n)
  return 3.0 * 40.0 * s * s


def _block_python_seconds(n: int, bands: int) -> float:
  # About 40 Python-level operations per block (slicing, BLAS calls, band gathers).
  return 40.0 * math.ceil(n / banded_blocks.block_size(bands, n)) / resources.PYTHON_RATE
