"""The prefix-sum error of a banded C by a block recursion: O(n·b̂²) time in BLAS-3, no n×n matrix.

One concept: the squared row norms r_i = ‖row_i(A C⁻¹)‖² of the decoder of a b̂-banded
lower-triangular C for the prefix-sum workload A, and the gradient of Σ_i w_i r_i with respect to
C's band, without forming A C⁻¹.

Derivation (notation of docs/mechanisms.md). A = D⁻¹ with D the bidiagonal difference matrix
(D_jj = 1, D_{j+1,j} = -1), so A C⁻¹ = (C D)⁻¹ = G⁻¹ with G = C D, G_ij = C_ij - C_{i,j+1}: G is
lower triangular with b̂ + 1 diagonals. The r_i are the diagonal of W = G⁻¹G⁻ᵀ. Cut the rounds
into blocks of s ≥ b̂ + 1 rounds; then G is block lower bidiagonal, with lower-triangular diagonal
blocks L_i and blocks U_i below them, and block row i of G⁻¹ is L_i⁻¹ (E_i - U_i · block row i-1).
Hence the diagonal blocks of W obey (block selected inversion, Takahashi, Fagan and Chin 1973)

    W_0 = K_0 K_0ᵀ,   W_i = K_i (I + U_i W_{i-1} U_iᵀ) K_iᵀ,   K_i = L_i⁻¹,

and r is their diagonal. The gradient of φ = Σ_i tr(Ω_i W_i), Ω_i = diag(w) on block i, is the
reverse of that recursion (derived by hand; tests/mf/test_banded_blocks.py checks it against the
dense formula ∂‖A C⁻¹‖²_F/∂C = -2 Fᵀ A X⁻¹ and finite differences). With W̄_i = Ω_i + Uᵢ₊₁ᵀ P̄ᵢ₊₁ Uᵢ₊₁
(the last block without the second term) and P_i = I + U_i W_{i-1} U_iᵀ:

    P̄_i = K_iᵀ W̄_i K_i,   L̄_i = -2 K_iᵀ W̄_i W_i,   Ū_i = 2 P̄_i U_i W_{i-1},

each restricted to G's band, and C̄_ij = Ḡ_ij - Ḡ_{i,j-1}. Cost: about 5.5 s³ multiply-adds per block,
5.5·n·s² in all (n = 2052, b̂ = 342: 1.3·10⁹, against ~4·10⁹ for the dense triangular inverse and
products it replaces), memory 2·n·s floats (L_i and W_i kept for the reverse pass; K_i is applied by
triangular solves, never formed).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided
from scipy.linalg import blas

# Blocks of at least this many rounds, so that small b̂ do not pay Python overhead per round.
MIN_BLOCK = 64


def block_size(bands: int, n: int) -> int:
  """s = max(b̂ + 1, MIN_BLOCK), capped at n: G is then block lower bidiagonal."""
  return min(max(bands + 1, MIN_BLOCK), n)


def difference_band(c: np.ndarray) -> np.ndarray:
  """The band of G = C D: gb[r, j] = G[j + r, j] = C[j+r, j] - C[j+r, j+1], r = 0..b̂."""
  bands, n = c.shape
  gb = np.zeros((bands + 1, n))
  gb[:bands] = c
  gb[1:, : n - 1] -= c[:, 1:]
  return zero_out_of_range(gb)  # Out of range (j + r ≥ n): zero.


def _column_block(rows: int, width: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
  """A zeroed (rows × width) column-major block G[lo:lo+rows, lo:lo+width] (its first row and
  column the same round) and a (depth × width) view of its band: view[r, q] = block[q + r, q].

  Why not fancy indexing: in column-major order the band of column q is the contiguous run that
  starts at q·(ld + 1) (ld the leading dimension), so the view is one stride pattern and moving a
  column block's band in or out is one strided copy (0.12 ms at s = 343), where gathering each
  s×s block through an index array cost 0.4-0.6 ms and a copy to column-major order, four times
  per block. ld = max(rows, depth - 1): no two band entries share memory (a short last block
  under a deeper band would otherwise alias them, and which write survived would depend on
  numpy's copy order). Band entries below the block (q + r ≥ rows: rounds ≥ n in the last
  blocks) fall on the rows below it, the block's strictly upper triangle or the padding after
  it: callers keep them zero (`difference_band`), and zero what they read back there."""
  ld = max(rows, depth - 1)
  flat = np.zeros(ld * width + depth)
  block = flat[: ld * width].reshape((ld, width), order="F")[:rows]
  band = as_strided(flat, shape=(depth, width), strides=(flat.itemsize, (ld + 1) * flat.itemsize))
  return block, band


def zero_out_of_range(band: np.ndarray) -> np.ndarray:
  """band[r, j] = 0 where j + r ≥ n (no such entry of C or G: past round n); in place."""
  n = band.shape[1]
  for r in range(1, band.shape[0]):
    band[r, max(n - r, 0) :] = 0.0
  return band


def _tri(a: np.ndarray, b: np.ndarray, lower: bool, trans: bool = False, right: bool = False):
  """op(a) @ b (or b @ op(a) when `right`) for triangular a: BLAS dtrmm, half a product's work.
  A non-square a (the last, shorter block's U) takes a plain product."""
  if a.shape[0] != a.shape[1]:
    op = a.T if trans else a
    return np.asfortranarray(b @ op if right else op @ b)
  return blas.dtrmm(1.0, a, b, side=int(right), lower=int(lower), trans_a=int(trans))


def _solve(l: np.ndarray, b: np.ndarray, trans: bool = False, right: bool = False) -> np.ndarray:
  """op(l)⁻¹ b (or b op(l)⁻¹ when `right`) for lower-triangular l: BLAS dtrsm, the cost of a
  triangular product. K_i = L_i⁻¹ is only ever applied, so it is never formed (dtrtri would add
  s³/3 per block, 5% of an evaluation at n = 2052, b̂ = 342)."""
  return blas.dtrsm(1.0, l, b, side=int(right), lower=1, trans_a=int(trans))


def _product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return blas.dgemm(1.0, a, b)  # Column-major in and out: f2py copies nothing.


def _lower_product(a: np.ndarray, b: np.ndarray, upper: bool = False) -> np.ndarray:
  """a @ b where only its lower triangle (diagonal included; `upper`: its strictly upper
  triangle) is read, zero elsewhere beyond what is computed: the rows are split in two halves
  and the half-rows' quarter outside the triangle is skipped, 3/4 of the product's work. (BLAS
  has no such product (xGEMMT is an extension scipy does not wrap).)"""
  h, w = a.shape[0], b.shape[1]
  m = h // 2
  out = np.zeros((h, w), order="F")
  if upper:  # Rows below m need columns > m only.
    out[:m] = _product(a[:m], b)
    out[m:, m:] = _product(a[m:], b[:, m:])
  else:  # Rows above m need columns < m only.
    out[:m, :m] = _product(a[:m], b[:, :m])
    out[m:] = _product(a[m:], b)
  return out


def _symmetric(x: np.ndarray) -> np.ndarray:
  """(x + xᵀ)/2: symmetric up to rounding, kept exactly symmetric for the recursion. Written into
  a column-major result directly: the same numbers as `np.asfortranarray(0.5 * (x + x.T))` in
  1/6 of its time (0.2 against 1.3 ms at s = 343, 12 calls per evaluation)."""
  out = np.add(x, x.T, order="F")
  out *= 0.5
  return out


class PrefixError:
  """The forward pass for a (normalized or not) banded C: r_i = ‖row_i(A C⁻¹)‖², and the state
  the gradient needs (`gradient`)."""

  def __init__(self, c: np.ndarray, keep: bool = True, workload: str = "prefix"):
    """`keep=False` keeps only the row norms (memory O(s²) beyond the band; no `gradient`).
    `workload` 'identity' takes G = C itself: then r_i = ‖row_i(C⁻¹)‖², the noise's per-round
    gain (`banded_matrix.inverse_row_sq_norms`)."""
    c = np.asarray(c, dtype=np.float64)
    bands, n = c.shape
    self.n, self.bands = n, bands
    if workload not in ("prefix", "identity"):
      raise ValueError(f"workload must be 'prefix' or 'identity', got {workload!r}")
    self.difference = workload == "prefix"
    # Band entries beyond round n would land inside the blocks (`_column_block`): zero them.
    self.gb = difference_band(c) if self.difference else zero_out_of_range(c.copy())
    depth = self.gb.shape[0]
    s = block_size(bands, n)
    self.edges = list(range(0, n, s)) + [n]
    self.l, self.w, self.u = [], [], []  # L_i, W_i, U_i
    row_sq = np.empty(n)
    prev = u = None
    for i, (lo, hi) in enumerate(zip(self.edges[:-1], self.edges[1:])):
      # Column block i of G holds L_i (its rows lo..hi) and U_{i+1} (the next block's rows).
      block, band = _column_block(self._block_end(i) - lo, hi - lo, depth)
      np.copyto(band, self.gb[:, lo:hi])
      diagonal = np.asfortranarray(block[: hi - lo])  # L_i; its strictly upper part is not read
      if not np.all(np.diagonal(diagonal)):
        raise ValueError("banded C is singular")
      if i == 0:
        p = np.eye(hi - lo, order="F")
      else:  # u = U_i, strictly upper triangular, from column block i - 1
        p = _tri(u, _tri(u, prev, lower=False), lower=False, trans=True, right=True)
        p[np.diag_indices_from(p)] += 1.0
      w = _symmetric(_solve(diagonal, _solve(diagonal, p), trans=True, right=True))  # K P Kᵀ
      if keep:
        self.l.append(diagonal)
        self.u.append(u)
        self.w.append(w)
      row_sq[lo:hi] = np.diagonal(w)
      prev = w
      u = np.asfortranarray(block[hi - lo :])  # U_{i+1} (empty after the last block)
    self.row_sq = row_sq

  def _block_end(self, i: int) -> int:
    """The last row (exclusive) of column block i: the end of block row i + 1, or n."""
    return self.edges[min(i + 2, len(self.edges) - 1)]

  def gradient(self, weights: Optional[np.ndarray] = None) -> np.ndarray:
    """∂(Σ_i w_i r_i)/∂C on C's band, as a (bands × n) array (w = 1 when None)."""
    if len(self.l) != len(self.edges) - 1:
      raise ValueError("PrefixError(keep=False) has no gradient")
    n = self.n
    depth = self.gb.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    gbar = np.empty_like(self.gb)  # every column is written once, by its column block
    carry = ubar = None
    for i in range(len(self.l) - 1, -1, -1):
      lo, hi = self.edges[i], self.edges[i + 1]
      wbar = np.zeros((hi - lo, hi - lo), order="F") if carry is None else carry
      wbar[np.diag_indices_from(wbar)] += w[lo:hi]
      kt_wbar = _solve(self.l[i], wbar, trans=True)  # Kᵀ W̄, shared by L̄ and P̄
      # Column block i of Ḡ: L̄_i above Ū_{i+1} (from the step before). G's band in block (i, i)
      # is within the lower triangle, in block (i+1, i) within the strictly upper one
      # (s ≥ b̂ + 1): only those parts of L̄ and Ū are computed.
      block, band = _column_block(self._block_end(i) - lo, hi - lo, depth)
      block[: hi - lo] = _lower_product(kt_wbar, self.w[i])
      block[: hi - lo] *= -2.0
      if ubar is not None:
        block[hi - lo :] = ubar
      np.copyto(gbar[:, lo:hi], band)
      if i > 0:
        pbar = _solve(self.l[i], kt_wbar, right=True)  # Kᵀ W̄ K
        u = self.u[i]
        pu = _tri(u, pbar, lower=False, right=True)
        ubar = _lower_product(pu, self.w[i - 1], upper=True)
        ubar *= 2.0
        carry = _symmetric(_tri(u, pu, lower=False, trans=True))
    zero_out_of_range(gbar)
    if not self.difference:
      return gbar
    # G[i, j] = C[i, j] - C[i, j+1]: C[j+r, j] enters gb[r, j] (+1) and gb[r+1, j-1] (-1).
    # Out of range (j + r ≥ n) both terms are zero already, so grad is too.
    grad = gbar[: self.bands].copy()
    grad[:, 1:] -= gbar[1:, : n - 1]
    return grad


def row_sq_norms(c: np.ndarray) -> np.ndarray:
  """r_i = ‖row_i(A C⁻¹)‖² for the prefix sum A and the banded C given as (bands × n) theta."""
  return PrefixError(c, keep=False).row_sq


def pass_cost(n: int, bands: int, gradient: bool) -> tuple[float, float]:
  """(multiply-adds, peak float64 count) of the forward pass, and of the reverse pass if
  `gradient` (forward: four triangular products or solves, s³/2 each, per block; reverse: four
  triangular products or solves and two products of which a triangle is computed, 3/4 of a full
  one)."""
  s = block_size(bands, n)
  blocks = math.ceil(n / s)
  band = (bands + 2.0) * n  # theta and G's band
  if gradient:
    return blocks * (2.0 + 3.5) * s**3, band * 2.0 + 2.0 * n * s + 6.0 * s * s
  return blocks * 2.0 * s**3, band + 6.0 * s * s
