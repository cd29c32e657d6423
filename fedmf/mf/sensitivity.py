"""Sensitivity of a strategy matrix C under multi-participation schemas.

One concept: sens_Π(C), the largest ‖C u‖_F over participation patterns π ∈ Π
and per-round contributions u_i of norm ≤ 1 (docs/architecture.md notation:
`n` rounds, `min_sep` = b with gap |i-j| ≥ b, `max_participations` = k,
X = CᵀC). Every returned sensitivity is unsquared, except `vec_sens`, which
returns max ⟨v, u⟩ in the units of v (so VecSens of squared column norms is
sens²).

Each routine returns a `Sensitivity` whose `method` says whether a theorem
makes the value exact or whether it is only an upper or lower bound. Exact
routines raise `AssumptionError` when their theorem does not apply; callers
that want "the best valid number" catch it and fall back to
`gram_upper_bound`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

_EXACT = 'exact'
_UPPER = 'upper-bound'
_LOWER = 'lower-bound'
_METHODS = (_EXACT, _UPPER, _LOWER)

# Relative tolerance for the structural checks of exact routines (monotone
# Toeplitz coefficients, non-negative Gram matrix).
_TOL = 1e-12


@dataclasses.dataclass(frozen=True)
class Sensitivity:
  """An unsquared sensitivity and how it was obtained.

  Attributes:
    value: The sensitivity (unsquared, float).
    method: 'exact', 'upper-bound' or 'lower-bound'.
    algorithm: Short name of the routine, e.g. 'banded-orthogonal'.
  """

  value: float
  method: str
  algorithm: str

  def __post_init__(self):
    if self.method not in _METHODS:
      raise ValueError(f'method must be one of {_METHODS}, got {self.method!r}')


class AssumptionError(ValueError):
  """An exact routine was called where its theorem does not apply."""


def _check_min_sep(min_sep: int) -> int:
  if int(min_sep) != min_sep or min_sep < 1:
    raise ValueError(f'min_sep must be an integer >= 1, got {min_sep!r}')
  return int(min_sep)


def effective_max_participations(
  n: int, min_sep: int, max_participations: Optional[int] = None
) -> int:
  """Returns min(k, ceil(n / b)), the most rounds one user can really join.

  Args:
    n: Number of rounds.
    min_sep: b, the minimum gap |i - j| between two participations.
    max_participations: k; None means unbounded.
  """
  b = _check_min_sep(min_sep)
  if int(n) != n or n < 0:
    raise ValueError(f'n must be a non-negative integer, got {n!r}')
  most = -(-int(n) // b)
  if max_participations is None:
    return most
  if int(max_participations) != max_participations or max_participations < 1:
    raise ValueError(
      f'max_participations must be an integer >= 1 or None, got {max_participations!r}'
    )
  return min(int(max_participations), most)


def _vec_sens_rows(v: np.ndarray, b: int, k: int) -> np.ndarray:
  """VecSens applied independently to every row of the 2-D array `v`.

  Source: BandMF App., VecSens; BandMF supp. Alg. 2 (without its final sqrt,
  see the errata in docs/mechanisms.md). The recurrence
  F[i, κ] = max(v_i + F[i+b, κ-1], F[i+1, κ]) with F[≥n, ·] = F[·, 0] = 0
  runs on reversed rows (r = n-1-i) so that every step is a forward,
  contiguous operation over all rows at once.

  Args:
    v: (rows, n) array.
    b: min_sep ≥ 1.
    k: effective max participations, min(k, ceil(n / b)).
  """
  rows, n = v.shape
  if n == 0 or k == 0:
    return np.zeros(rows)
  if b == 1:
    # Every subset is allowed: take the k largest positive entries. This
    # avoids k = n layers of the DP when the separation is trivial.
    top = -np.sort(-v, axis=1)[:, :k]
    return np.sum(np.maximum(top, 0.0), axis=1)
  v_rev = np.ascontiguousarray(v[:, ::-1])
  if k == -(-n // b) and k > 16:
    # The count constraint is vacuous, so the κ axis disappears:
    # F[i] = max(v_i + F[i+b], F[i+1], 0), one sequential pass over i
    # instead of k full layers.
    vt = np.ascontiguousarray(v_rev.T)
    ft = np.zeros((n, rows))
    for r in range(n):
      cur = ft[r]
      np.copyto(cur, vt[r])
      if r >= b:
        cur += ft[r - b]
      if r >= 1:
        np.maximum(cur, ft[r - 1], out=cur)
      np.maximum(cur, 0.0, out=cur)
    return ft[n - 1].copy()
  # For fixed κ, F[:, κ] is a running maximum of G = v + F[:, κ-1] shifted
  # by b (and of 0, the empty pattern): one cumulative max per layer.
  f = np.zeros((rows, n))
  g = np.empty((rows, n))
  for _ in range(k):
    np.copyto(g, v_rev)
    if b < n:
      g[:, b:] += f[:, : n - b]
    np.maximum.accumulate(g, axis=1, out=f)
    np.maximum(f, 0.0, out=f)
  return f[:, n - 1].copy()


def vec_sens(v: np.ndarray, min_sep: int, max_participations: Optional[int] = None) -> float:
  """Returns max ⟨v, u⟩ over 0/1 vectors u with ≤ k ones, pairwise ≥ b apart.

  Negative entries are never chosen, so an all-negative v gives 0. Cost
  O(n · k_eff) with k_eff = min(k, ceil(n / b)); O(n log n) when b = 1.

  Args:
    v: Vector of length n (any real values).
    min_sep: b ≥ 1.
    max_participations: k, or None for unbounded.

  Returns:
    The maximum, in the units of v (not square-rooted).
  """
  v = np.asarray(v, dtype=np.float64)
  if v.ndim != 1:
    raise ValueError(f'v must be 1-D, got shape {v.shape}')
  b = _check_min_sep(min_sep)
  k = effective_max_participations(v.shape[0], b, max_participations)
  return float(_vec_sens_rows(v[None, :], b, k)[0])


def vec_sens_rows(
  v: np.ndarray, min_sep: int, max_participations: Optional[int] = None
) -> np.ndarray:
  """`vec_sens` of every row of the 2-D `v` at once (rows of length n, k capped at ⌈n/b⌉)."""
  v = np.asarray(v, dtype=np.float64)
  if v.ndim != 2:
    raise ValueError(f'v must be 2-D, got shape {v.shape}')
  b = _check_min_sep(min_sep)
  return _vec_sens_rows(v, b, effective_max_participations(v.shape[1], b, max_participations))


def _matrix_and_schema(
  C: np.ndarray, min_sep: int, max_participations: Optional[int]
) -> tuple[np.ndarray, int, int]:
  """(C as float64, b, k_eff) after checking C is a matrix and b a valid separation."""
  C = np.asarray(C, dtype=np.float64)
  if C.ndim != 2:
    raise ValueError(f'C must be 2-D, got shape {C.shape}')
  b = _check_min_sep(min_sep)
  return C, b, effective_max_participations(C.shape[1], b, max_participations)


def single_participation_sensitivity(C: np.ndarray) -> Sensitivity:
  """Returns the maximum column norm of C, the exact k = 1 sensitivity."""
  C = np.asarray(C, dtype=np.float64)
  if C.ndim != 2 or C.shape[1] == 0:
    raise ValueError(f'C must be a non-empty 2-D matrix, got shape {C.shape}')
  value = float(np.max(np.linalg.norm(C, axis=0)))
  return Sensitivity(value, _EXACT, 'max-column-norm')


def matrix_bandwidth(C: np.ndarray) -> int:
  """Returns b̂ such that columns ≥ b̂ apart have disjoint supports.

  For a lower-triangular C this is 1 + the largest i - j with C_ij ≠ 0, the
  usual band count. Entries above the diagonal are counted too, so the
  guarantee holds for any square or tall C.
  """
  C = np.asarray(C)
  rows, cols = np.nonzero(C)
  if rows.size == 0:
    return 1
  lower = max(int(np.max(rows - cols)), 0)
  upper = max(int(np.max(cols - rows)), 0)
  return lower + upper + 1


def banded_sensitivity_exact_from_norms(
  col_sq_norms: np.ndarray, bands: int, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Exact sensitivity of a b̂-banded C from its squared column norms.

  Source: BandMF Thm. 2 / BandMF supp. Alg. 4: columns at least b̂ apart have
  disjoint support, so for b ≥ b̂ the cross terms of ‖C u‖² vanish and
  sens² = VecSens(b, diag(X), k).

  Args:
    col_sq_norms: diag(X) = squared column norms of C, length n.
    bands: b̂, the number of bands of C (the caller vouches for it).
    min_sep: b.
    max_participations: k, or None for unbounded.

  Raises:
    AssumptionError: if min_sep < bands.
  """
  b = _check_min_sep(min_sep)
  if int(bands) != bands or bands < 1:
    raise ValueError(f'bands must be an integer >= 1, got {bands!r}')
  if b < bands:
    raise AssumptionError(
      f'banded exact sensitivity needs min_sep >= bands, got min_sep={b} < '
      f'bands={bands}: columns closer than the band are not orthogonal'
    )
  diag = np.asarray(col_sq_norms, dtype=np.float64)
  if diag.ndim != 1 or np.any(diag < 0):
    raise ValueError('col_sq_norms must be a 1-D vector of non-negative values')
  sens_sq = vec_sens(diag, b, max_participations)
  return Sensitivity(math.sqrt(sens_sq), _EXACT, 'banded-orthogonal')


def banded_sensitivity_exact(
  C: np.ndarray, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Exact sensitivity of a banded matrix C under b-min-sep participation.

  The band count b̂ is read off C's non-zero structure (`matrix_bandwidth`),
  so any C qualifies as long as min_sep ≥ b̂. Use
  `banded_sensitivity_exact_from_norms` when only diag(X) and b̂ are at hand.

  Raises:
    AssumptionError: if min_sep is smaller than C's bandwidth.
  """
  C = np.asarray(C, dtype=np.float64)
  if C.ndim != 2:
    raise ValueError(f'C must be 2-D, got shape {C.shape}')
  bands = matrix_bandwidth(C)
  return banded_sensitivity_exact_from_norms(
    np.sum(C * C, axis=0), bands, min_sep, max_participations
  )


def gram_upper_bound(
  C: np.ndarray, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Upper bound on sensitivity for any C under b-min-sep participation.

  Source: BandMF supp. Alg. 3 (BandMF Thm. 3): sens² ≤ max_π Σ_{i,j∈π} |X_ij|
  (BandMF Eq. 5) ≤ VecSens(b, r, k) with r_i = VecSens(b, |X_i,:|, k). One
  square root at the end (BandMF supp. Alg. 2 returns √F; erratum). Stage one runs on
  all rows at once; cost O(n² k_eff) plus forming X (≈0.5 s at n = 2052,
  b = 342, k = 6). b = 1 and unbounded k take O(n²) shortcuts; a bounded
  but large k with small b (e.g. b = 2, k = 1000 at n = 2052) costs tens of
  seconds.
  """
  C, b, k = _matrix_and_schema(C, min_sep, max_participations)
  abs_x = np.abs(C.T @ C)
  row_bounds = _vec_sens_rows(abs_x, b, k)
  sens_sq = float(_vec_sens_rows(row_bounds[None, :], b, k)[0])
  return Sensitivity(math.sqrt(sens_sq), _UPPER, 'vecsens-abs-gram')


def _check_toeplitz_coefs(coefs: np.ndarray, n: int) -> np.ndarray:
  """Returns the first n coefficients (zero-padded) after Thm 3.1's checks."""
  c = np.asarray(coefs, dtype=np.float64)
  if c.ndim != 1 or c.shape[0] == 0:
    raise ValueError('coefs must be a non-empty 1-D vector')
  if c.shape[0] < n:
    # A banded Toeplitz C has zero coefficients past its bands.
    c = np.concatenate([c, np.zeros(n - c.shape[0])])
  c = c[:n]
  tol = _TOL * max(float(np.max(np.abs(c))), 1.0)
  if np.any(c < -tol):
    raise AssumptionError(
      'Toeplitz exact sensitivity needs non-negative coefficients; '
      f'min coefficient is {float(np.min(c))!r}'
    )
  if np.any(np.diff(c) > tol):
    i = int(np.argmax(np.diff(c)))
    raise AssumptionError(
      'Toeplitz exact sensitivity needs non-increasing coefficients; '
      f'coefs[{i}]={c[i]!r} < coefs[{i + 1}]={c[i + 1]!r}'
    )
  return c


def _worst_pattern(b: int, k: int) -> np.ndarray:
  """π* = (0, b, 2b, …) truncated to rounds < n and to k participations."""
  return np.arange(k) * b


def worst_pattern_offsets(
  n: int, min_sep: int, max_participations: Optional[int] = None
) -> list[int]:
  """The rounds of π* = (0, b, 2b, …) < n, at most k of them (BLT Thm 3.1)."""
  b = _check_min_sep(min_sep)
  return [int(i) for i in _worst_pattern(b, effective_max_participations(n, b, max_participations))]


def worst_pattern_response(coefs: np.ndarray, offsets: list[int]) -> np.ndarray:
  """c̄ = C u(π*) = Σ_{s∈π*} shift(c, s) for C = LtToep(coefs) (n = len(coefs)), in O(n·|π*|).

  Source: BLT Thm 3.1 / Alg. 4. No assumption is checked here: ‖c̄‖ is the exact sensitivity only
  for non-negative, non-increasing coefs, and a lower bound otherwise (BLT Remark 3.2).
  """
  c = np.asarray(coefs, dtype=np.float64)
  n = c.shape[0]
  c_bar = np.zeros(n)
  for start in offsets:
    c_bar[start:] += c[: n - start]
  return c_bar


def toeplitz_sensitivity_exact(
  coefs: np.ndarray, n: int, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Exact sensitivity of C = LtToep(coefs) (n×n) under b-min-sep.

  Source: BLT Thm 3.1: for non-negative, non-increasing coefficients
  the worst pattern is π* = (0, b, …, (k_eff-1) b), so sens = ‖C u(π*)‖.
  C u(π*) = c̄ = Σ_{i<k_eff} shift(c, i·b) is formed in O(n k) without C.

  Args:
    coefs: Toeplitz coefficients, coefs[0] on the diagonal. Shorter than n
      means zeros afterwards (banded Toeplitz); longer is truncated.
    n: Number of rounds.
    min_sep: b.
    max_participations: k, or None for unbounded.

  Raises:
    AssumptionError: if a coefficient is negative or coefs increase.
  """
  if int(n) != n or n < 1:
    raise ValueError(f'n must be an integer >= 1, got {n!r}')
  n = int(n)
  b = _check_min_sep(min_sep)
  c = _check_toeplitz_coefs(coefs, n)
  c_bar = worst_pattern_response(c, worst_pattern_offsets(n, b, max_participations))
  return Sensitivity(float(np.linalg.norm(c_bar)), _EXACT, 'toeplitz-thm3.1')


def toeplitz_lower_bound(
  C: np.ndarray, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Lower bound ‖C u(π*)‖ for any C, π* = (0, b, 2b, …).

  Source: BLT Remark 3.2. π* is a feasible pattern, so this never
  exceeds the truth; it equals it only where Thm 3.1 applies.
  """
  C, b, k = _matrix_and_schema(C, min_sep, max_participations)
  value = float(np.linalg.norm(C[:, _worst_pattern(b, k)].sum(axis=1)))
  return Sensitivity(value, _LOWER, 'remark3.2-lower-bound')


def fixed_epoch_sensitivity(
  C: np.ndarray, min_sep: int, max_participations: Optional[int] = None
) -> Sensitivity:
  """Sensitivity under (k, b) fixed-epoch participation.

  A user joins exactly every b rounds: the b patterns π_o = (o, o+b, …)
  truncated to < n and to k rounds (k = number of epochs; None = all).
  Source: BandMF §2 fixed-epoch schema; docs/mechanisms.md "(k,b)
  fixed-epoch". With X ≥ 0 elementwise the maximum of ‖C u(π_o)‖ over
  offsets is exact (vector contributions cannot beat 0/1 ones, BandMF Eq. 5
  being tight). Otherwise the sign-aware bound max_o √(Σ_{i,j∈π_o} |X_ij|)
  is returned as an upper bound.
  """
  C, b, k = _matrix_and_schema(C, min_sep, max_participations)
  x = C.T @ C
  nonneg = bool(np.all(x >= -_TOL * max(float(np.max(np.abs(x))), 1.0)))
  abs_x = x if nonneg else np.abs(x)
  best = 0.0
  n = C.shape[1]
  for offset in range(min(b, n)):
    pattern = np.arange(offset, n, b)[:k]
    best = max(best, float(abs_x[np.ix_(pattern, pattern)].sum()))
  method = _EXACT if nonneg else _UPPER
  return Sensitivity(math.sqrt(max(best, 0.0)), method, 'fixed-epoch-brute')
