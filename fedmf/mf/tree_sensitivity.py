"""TreeAgg's sensitivity at every prefix of a run, in one pass: the audit's per-round ε curve.

One concept. The report's ε curve (`fedmf.privacy.curve`) needs, for r = 1..n, the sensitivity of
the first r rounds' tree C_r (the nodes completed by round r) under that prefix's realized
(b_r, k_r). One r at a time (`Strategy.sensitivity`) each costs the dense Gram X_r = C_rᵀC_r
(O(r³)) and VecSens over its r rows (O(r²k)): 6.5-12 minutes at n = 2,052. The same values, here
in O(n²k log n) while (b_r, k_r) stay (seconds):

* X_r[i, j] counts the completed nodes that hold both rounds i and j, so X_r is X_{r-1} with a
  zero row and column appended, plus one all-ones block per node completed at round r: the
  blocks [r - 2^h, r) for every 2^h dividing r.
* Stage one of the Gram bound (BandMF supp. Alg. 3: sens² ≤ VecSens of the rows' VecSens of
  |X|) changes only for the rows of those blocks while (b, k) stay: another row only gains a
  trailing zero, which no pattern profits from (a pattern with one more participation than fits
  in r - 1 rounds must use it). So round r recomputes the rows of its largest block, and every
  row when (b_r, k_r) changes.
* Stage two is VecSens over the r row bounds, O(r·k).

With k_r = 1 the sensitivity is the largest column norm √max_j X_r[j, j], exact (as
`sensitivity.single_participation_sensitivity`). The values are those of `Strategy.sensitivity`
(method 'auto') at each (r, b_r, k_r), up to rounding (tests/mf/test_tree_sensitivity.py).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from fedmf.mf import resources
from fedmf.mf import sensitivity as sens_lib
from fedmf.mf.sensitivity import Sensitivity


def prefix_cost(n: int, max_participations: int = 1, schemas: int = 1) -> resources.Cost:
  """Memory and time of `prefix_sensitivities` over n rounds with k_r ≤ `max_participations` and
  `schemas` changes of (b_r, k_r): two n×n arrays; VecSens (k layers, ~3 passes each) over the
  rows of each round's largest new block (about n·log₂(n)/2 rows in all) and over every row at
  each change."""
  rows = float(n) * max(int(n).bit_length(), 1) / 2.0 + float(schemas) * float(n)
  return resources.Cost.of(
    f"the tree's {n}×{n} Gram matrix for the per-round sensitivities",
    resources.FLOAT * 2.0 * float(n) * float(n),
    3.0 * rows * float(n) * max(int(max_participations), 1) / resources.VECTOR_RATE,
  )


def prefix_sensitivities(
  min_seps: Sequence[int] | np.ndarray, max_participations: Sequence[int] | np.ndarray
) -> list[Optional[Sensitivity]]:
  """The tree's sensitivity after r rounds, r = 1..n, at each prefix's own (b_r, k_r).

  Args:
    min_seps: b_r ≥ 1 where k_r ≥ 2 (ignored where k_r ≤ 1).
    max_participations: k_r ≥ 0; 0 before anyone took part (then None: no sensitivity).

  Returns:
    One entry per r: None where k_r = 0, else what `Tree.sensitivity(ParticipationSchema(r,
    b_r, k_r))` returns (the exact max column norm for k_r = 1, the Gram upper bound otherwise).
  """
  b = np.asarray(min_seps, dtype=np.int64)
  k = np.asarray(max_participations, dtype=np.int64)
  n = int(b.shape[0])
  if k.shape != (n,):
    raise ValueError("min_seps and max_participations must have the same length")
  schemas = 1 + int(np.count_nonzero((b[1:] != b[:-1]) | (k[1:] != k[:-1]))) if n else 0
  resources.check(
    prefix_cost(n, int(k.max(initial=1)), schemas),
    f"the per-round sensitivities of the tree over {n:,} rounds",
  )
  gram = np.zeros((n, n))
  row_bounds = np.zeros(n)
  bounds_for = None  # The (b, k) `row_bounds` hold the stage-one values of, up to the last round.
  out: list[Optional[Sensitivity]] = []
  for r in range(1, n + 1):
    block = 1  # Nodes completed at round r: sizes 1, 2, 4, ... while they divide r.
    while r % block == 0:
      gram[r - block : r, r - block : r] += 1.0
      largest = block
      block *= 2
    kr = int(k[r - 1])
    if kr <= 0:
      out.append(None)
      bounds_for = None
      continue
    br = int(b[r - 1]) if kr > 1 else r
    if sens_lib.effective_max_participations(r, br, kr) == 1:  # b ≥ r: one participation.
      # The k = 1 sensitivity: the largest column norm, exact.
      column_sq_norms = np.diagonal(gram)[:r]
      out.append(Sensitivity(math.sqrt(float(np.max(column_sq_norms))), "exact", "max-column-norm"))
      bounds_for = None
      continue
    first = 0 if bounds_for != (br, kr) else r - largest
    row_bounds[first:r] = sens_lib.vec_sens_rows(gram[first:r, :r], br, kr)
    bounds_for = (br, kr)
    sens_sq = float(sens_lib.vec_sens_rows(row_bounds[None, :r], br, kr)[0])
    out.append(Sensitivity(math.sqrt(sens_sq), "upper-bound", "vecsens-abs-gram"))
    resources.check_time()
  return out
