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

each restricted to G's band, and C̄_ij = Ḡ_ij - Ḡ_{i,j-1}. Cost: about 5.9 s³ multiply-adds per block,
5.9·n·s² in all (n = 2052, b̂ = 342: 1.4·10⁹, against ~4·10⁹ for the dense triangular inverse and
products it replaces), memory 2·n·s floats (K_i and W_i kept for the reverse pass).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
from scipy.linalg import blas, lapack

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
  for r in range(1, bands + 1):  # Out of range (j + r ≥ n): zero.
    gb[r, max(n - r, 0) :] = 0.0
  return gb


class _BandIndex:
  """Where the entries of a dense block G[lo:lo+h, c0:c0+w] sit in the flattened band of G
  (gb[r, j] = G[j + r, j] at r·n + j): computed once per block shape and offset, reused by every
  block and evaluation (fancy indexing in place of a Python loop over diagonals)."""

  def __init__(self, n: int, depth: int):
    self.n, self.depth = n, depth
    self._cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}

  def _positions(self, h: int, w: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    key = (h, w, offset)  # offset = first row - first column
    if key not in self._cache:
      lag = np.arange(h)[:, None] - np.arange(w)[None, :] + offset
      inside = (lag >= 0) & (lag < self.depth)
      pos = np.flatnonzero(inside)
      cols = np.broadcast_to(np.arange(w)[None, :], lag.shape)
      self._cache[key] = (pos, lag[inside] * self.n + cols[inside])
    return self._cache[key]

  def gather(self, gb: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """Dense G[rows, cols] from its band."""
    h, w = rows.stop - rows.start, cols.stop - cols.start
    pos, base = self._positions(h, w, rows.start - cols.start)
    out = np.zeros(h * w)
    out[pos] = gb.ravel()[base + cols.start]
    return out.reshape(h, w)

  def add(self, gbar: np.ndarray, block: np.ndarray, rows: slice, cols: slice) -> None:
    """gbar's band += block's entries on G's band (each band entry once per block)."""
    h, w = rows.stop - rows.start, cols.stop - cols.start
    pos, base = self._positions(h, w, rows.start - cols.start)
    gbar.ravel()[base + cols.start] += np.ravel(block)[pos]


@functools.lru_cache(maxsize=4)
def _band_index(n: int, depth: int) -> _BandIndex:
  return _BandIndex(n, depth)  # One optimizer evaluates the same shapes hundreds of times.


def _tri(a: np.ndarray, b: np.ndarray, lower: bool, trans: bool = False, right: bool = False):
  """op(a) @ b (or b @ op(a) when `right`) for triangular a: BLAS dtrmm, half a product's work.
  A non-square a (the last, shorter block's U) takes a plain product."""
  if a.shape[0] != a.shape[1]:
    op = a.T if trans else a
    return np.asfortranarray(b @ op if right else op @ b)
  return blas.dtrmm(1.0, a, b, side=int(right), lower=int(lower), trans_a=int(trans))


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
    self.gb = difference_band(c) if self.difference else c
    self.index = _band_index(n, self.gb.shape[0])
    s = block_size(bands, n)
    self.edges = list(range(0, n, s)) + [n]
    self.k, self.w, self.u = [], [], []
    row_sq = np.empty(n)
    prev = None
    for i, (lo, hi) in enumerate(zip(self.edges[:-1], self.edges[1:])):
      diagonal = np.asfortranarray(self.index.gather(self.gb, slice(lo, hi), slice(lo, hi)))
      k, info = lapack.dtrtri(diagonal, lower=1, overwrite_c=1)
      if info != 0:
        raise ValueError("banded C is singular")
      if i == 0:
        u, p = None, np.eye(hi - lo, order="F")
      else:
        u = np.asfortranarray(
          self.index.gather(self.gb, slice(lo, hi), slice(self.edges[i - 1], lo))
        )  # strictly upper triangular
        p = _tri(u, _tri(u, prev, lower=False), lower=False, trans=True, right=True)
        p[np.diag_indices_from(p)] += 1.0
      w = _symmetric(_tri(k, _tri(k, p, lower=True), lower=True, trans=True, right=True))
      if keep:
        self.k.append(k)
        self.u.append(u)
        self.w.append(w)
      row_sq[lo:hi] = np.diagonal(w)
      prev = w
    self.row_sq = row_sq

  def gradient(self, weights: Optional[np.ndarray] = None) -> np.ndarray:
    """∂(Σ_i w_i r_i)/∂C on C's band, as a (bands × n) array (w = 1 when None)."""
    if len(self.k) != len(self.edges) - 1:
      raise ValueError("PrefixError(keep=False) has no gradient")
    n = self.n
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    gbar = np.zeros_like(self.gb)
    carry = None
    for i in range(len(self.k) - 1, -1, -1):
      lo, hi = self.edges[i], self.edges[i + 1]
      wbar = np.zeros((hi - lo, hi - lo), order="F") if carry is None else carry
      wbar[np.diag_indices_from(wbar)] += w[lo:hi]
      k = self.k[i]
      kt_wbar = _tri(k, wbar, lower=True, trans=True)  # Kᵀ W̄, shared by L̄ and P̄
      # G's band in block (i, i) is within the lower triangle, in block (i, i-1) within the
      # strictly upper one (s ≥ b̂ + 1): only those parts of L̄ and Ū are computed.
      self.index.add(gbar, -2.0 * _lower_product(kt_wbar, self.w[i]), slice(lo, hi), slice(lo, hi))
      if i > 0:
        pbar = _tri(k, kt_wbar, lower=True, right=True)
        u = self.u[i]
        pu = _tri(u, pbar, lower=False, right=True)
        self.index.add(
          gbar,
          2.0 * _lower_product(pu, self.w[i - 1], upper=True),
          slice(lo, hi),
          slice(self.edges[i - 1], lo),
        )
        carry = _symmetric(_tri(u, pu, lower=False, trans=True))
    if not self.difference:
      return gbar
    # G[i, j] = C[i, j] - C[i, j+1]: C[j+r, j] enters gb[r, j] (+1) and gb[r+1, j-1] (-1).
    grad = gbar[: self.bands].copy()
    grad[:, 1:] -= gbar[1:, : n - 1]
    for r in range(1, self.bands):
      grad[r, max(n - r, 0) :] = 0.0
    return grad


def row_sq_norms(c: np.ndarray) -> np.ndarray:
  """r_i = ‖row_i(A C⁻¹)‖² for the prefix sum A and the banded C given as (bands × n) theta."""
  return PrefixError(c, keep=False).row_sq


def pass_cost(n: int, bands: int, gradient: bool) -> tuple[float, float]:
  """(multiply-adds, peak float64 count) of the forward pass, and of the reverse pass if
  `gradient` (forward: dtrtri s³/3 and four triangular products s³/2 per block; reverse: four
  triangular products and two products of which a triangle is computed, 3/4 of a full one)."""
  s = block_size(bands, n)
  blocks = math.ceil(n / s)
  band = (bands + 2.0) * n  # theta and G's band
  if gradient:
    return blocks * (2.4 + 3.5) * s**3, band * 2.0 + 2.0 * n * s + 6.0 * s * s
  return blocks * 2.4 * s**3, band + 6.0 * s * s
