"""Brute-force sensitivity over participation patterns, for tests only.

Notation as in docs/architecture.md: `min_sep` = b (gap |i-j| ≥ b),
`max_participations` = k. Enumerates every pattern, so keep n ≤ 12.
"""

from __future__ import annotations

import functools
from typing import Iterator, Optional, Tuple

import numpy as np


def brute_force_patterns(
  n: int, min_sep: int, max_participations: Optional[int] = None
) -> Iterator[Tuple[int, ...]]:
  """Yields every non-empty π ⊆ [n] with pairwise gaps ≥ b and |π| ≤ k."""
  k = n if max_participations is None else max_participations

  def extend(prefix: Tuple[int, ...], start: int):
    for i in range(start, n):
      pattern = prefix + (i,)
      yield pattern
      if len(pattern) < k:
        yield from extend(pattern, i + min_sep)

  yield from extend((), 0)


def feasible_vectors(
  n: int, min_sep: int, max_participations: Optional[int] = None, signs: bool = True
) -> np.ndarray:
  """Returns all u ∈ {-1,0,1}^n (or {0,1}^n) whose support is a valid π.

  Rows are the vectors; the all-zero vector is included (it changes no max).
  """
  return _feasible_vectors(n, min_sep, max_participations, signs).copy()


@functools.lru_cache(maxsize=64)
def _feasible_vectors(
  n: int, min_sep: int, max_participations: Optional[int], signs: bool
) -> np.ndarray:
  k = n if max_participations is None else max_participations
  base = 3 if signs else 2
  # Row r holds the base-3 (or base-2) digits of r, shifted to {-1, 0, 1}.
  digits = (np.arange(base**n)[:, None] // base ** np.arange(n)) % base
  u = (digits - 1 if signs else digits).astype(np.float64)
  nz = u != 0
  keep = nz.sum(axis=1) <= k
  for gap in range(1, min(min_sep, n)):
    keep &= ~np.any(nz[:, :-gap] & nz[:, gap:], axis=1)
  return u[keep]


def brute_force_sensitivity(
  C: np.ndarray, min_sep: int, max_participations: Optional[int] = None, signs: bool = True
) -> float:
  """Returns max ‖C u‖ over valid patterns and, if `signs`, all sign choices.

  With signs this is the exact sensitivity for scalar contributions (d = 1)
  and a lower bound of the truth for d ≥ 2; where X = CᵀC ≥ 0 or C is
  banded with b ≥ b̂ it equals the truth. Unsquared.
  """
  C = np.asarray(C, dtype=np.float64)
  u = _feasible_vectors(C.shape[1], min_sep, max_participations, signs)
  return float(np.sqrt(np.max(np.sum((u @ C.T) ** 2, axis=1))))
