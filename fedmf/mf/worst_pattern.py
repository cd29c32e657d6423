"""The worst-case participation pattern: the rounds a canary joins to show a strategy's sensitivity.

One concept: the 0/1 pattern π (rounds pairwise ≥ b apart, at most k of them) maximizing
‖C 1_π‖, the sensitivity of a user who contributes the same full-norm update ζ·u in each of its
rounds (notation of docs/architecture.md: n rounds, b = min_sep as a gap, k = max
participations, X = CᵀC). A canary inserted with this pattern is the user the accountant charges
for, so its measured privacy can be compared with the analytic ε (docs/empirical-privacy.md).

Where the strategy's sensitivity is exact and attained by a 0/1 pattern, the pattern found here
attains it (`method` 'exact'): BLT Thm 3.1 (Toeplitz, π* = (0, b, 2b, …)), BandMF Thm 2 (banded
with b ≥ b̂: VecSens over the squared column norms; the pattern is its argmax), DP-SGD and k = 1
(the largest column). Otherwise (the tree, whose sensitivity is the general upper bound) it is the
best lower bound found, and says so (`method` 'lower-bound'): the shifted patterns (o, o+b, …), the
VecSens argmax and a greedy pattern, then local search from the best few, moving one round at a
time while ‖C 1_π‖ grows. A pattern above
a sensitivity that claims to be exact or an upper bound would mean that claim is wrong: it raises.

0/1 patterns attain the sensitivity whenever X ≥ 0 elementwise (BandMF Eq. 5 is then tight), as
for every strategy fedmf optimizes; a C with negative X entries can be worse for signed
contributions, which a 0/1 canary does not show (the pattern is then labelled a lower bound).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from fedmf.mf import resources
from fedmf.mf import sensitivity as sens_lib
from fedmf.mf.schema import ParticipationSchema

# Above this relative excess a pattern's ‖C 1_π‖ contradicts a sensitivity that claims to be exact
# or an upper bound (float64 rounding of a sum of n² terms stays far below it).
_TOLERANCE = 1e-9
# Sweeps of the local search (each moves every round of the pattern to its best feasible place).
_MAX_SWEEPS = 50
# Starts of the local search: the best shifted patterns, the VecSens argmax and the greedy one.
_STARTS = 8


@dataclasses.dataclass(frozen=True)
class WorstPattern:
  """A participation pattern and what it shows.

  Attributes:
    rounds: the rounds (0-based, increasing, pairwise ≥ b apart, at most k).
    value: ‖C 1_π‖, the pattern's own sensitivity (clip norm 1).
    method: 'exact' when `value` equals the strategy's exact sensitivity, else 'lower-bound'.
    sensitivity: the strategy's sensitivity under the schema (`Strategy.sensitivity`, 'auto').
    algorithm: how the pattern was found.
  """

  rounds: tuple[int, ...]
  value: float
  method: str
  sensitivity: sens_lib.Sensitivity
  algorithm: str

  def describe(self) -> str:
    shown = ", ".join(map(str, self.rounds[:8])) + (", …" if len(self.rounds) > 8 else "")
    how = (
      "attains the exact sensitivity"
      if self.method == "exact"
      else f"the best lower bound found ({self.algorithm}); the sensitivity "
      f"{self.sensitivity.value:.6g} is an {self.sensitivity.method}"
    )
    return f"rounds ({shown}): ‖C 1_π‖ = {self.value:.6g}, {how}"


def pattern_cost(strategy: Any, schema: ParticipationSchema) -> resources.Cost:
  """The dense C and X = CᵀC the search holds."""
  rows, n = strategy.matrix_shape(schema.n)
  return strategy.dense_cost(schema.n, "the dense C for the worst-case canary pattern", 1.0) + (
    resources.Cost.of(
      f"X = CᵀC ({n}×{n}) for the worst-case canary pattern",
      resources.FLOAT * 2.0 * float(n) * n,
      2.0 * float(rows) * n * n / resources.DENSE_RATE,
    )
  )


def pattern_value_sq(x: np.ndarray, rounds) -> float:
  """‖C 1_π‖² = Σ_{i,j∈π} X_ij."""
  idx = np.asarray(rounds, dtype=np.int64)
  return float(x[np.ix_(idx, idx)].sum())


def _feasible(rounds: np.ndarray, n: int, b: int) -> np.ndarray:
  """The rounds t < n at least b away from every round of `rounds`."""
  ok = np.ones(n, dtype=bool)
  for r in rounds:
    ok[max(0, r - b + 1) : min(n, r + b)] = False
  return ok


def vec_sens_argmax(v: np.ndarray, b: int, k: int) -> tuple[int, ...]:
  """The 0/1 pattern attaining VecSens(v, b, k) = max ⟨v, 1_π⟩ (BandMF supp. Alg. 2), by the same
  recurrence F[i, κ] = max(v_i + F[i+b, κ-1], F[i+1, κ]) with the choices kept for backtracking."""
  n = v.shape[0]
  f = np.zeros((n + b + 1, k + 1))
  take = np.zeros((n, k + 1), dtype=bool)
  for i in range(n - 1, -1, -1):
    with_i = v[i] + f[min(i + b, n), :k]
    without = f[i + 1, 1:]
    take[i, 1:] = with_i > without
    f[i, 1:] = np.maximum(np.maximum(with_i, without), 0.0)
  rounds, i, kappa = [], 0, k
  while i < n and kappa > 0:
    if take[i, kappa] and v[i] + f[min(i + b, n), kappa - 1] > 0:
      rounds.append(i)
      i += b
      kappa -= 1
    else:
      i += 1
  return tuple(rounds)


def _local_search(x: np.ndarray, rounds: tuple[int, ...], b: int, k: int) -> tuple[int, ...]:
  """Moves one round at a time (or adds one, below k) to the feasible place that raises
  Σ_{i,j∈π} X_ij most, until no move helps."""
  n = x.shape[0]
  diag = np.diag(x)
  pi = list(rounds)
  value = pattern_value_sq(x, pi) if pi else 0.0
  for _ in range(_MAX_SWEEPS):
    improved = False
    for pos in range(len(pi) + (1 if len(pi) < k else 0)):
      others = np.asarray([r for j, r in enumerate(pi) if j != pos], dtype=np.int64)
      g = x[:, others].sum(axis=1) if others.size else np.zeros(n)
      base = pattern_value_sq(x, others) if others.size else 0.0
      gain = base + 2.0 * g + diag  # Σ over others ∪ {t}, for every t
      gain[~_feasible(others, n, b)] = -np.inf
      t = int(np.argmax(gain))
      if gain[t] > value * (1 + 1e-12) + 1e-300:
        if pos < len(pi):
          pi[pos] = t
        else:
          pi.append(t)
        value = float(gain[t])
        improved = True
    if not improved:
      break
  return tuple(sorted(pi))


def worst_case_pattern(strategy: Any, schema: ParticipationSchema) -> WorstPattern:
  """The pattern attaining `strategy`'s sensitivity under `schema`, or its best lower bound.

  Raises AssertionError if a feasible pattern exceeds a sensitivity that claims to be exact or an
  upper bound (a defect in that sensitivity, never to be hidden).
  """
  n, b, k = schema.n, schema.min_sep, schema.effective_max_participations
  resources.check(pattern_cost(strategy, schema), f"the worst-case canary pattern at n={n}")
  sens = strategy.sensitivity(schema)
  c = strategy.matrix(n)
  x = c.T @ c
  candidates: dict[tuple[int, ...], str] = {}
  for offset in range(min(b, n)):
    candidates.setdefault(tuple(range(offset, n, b))[:k], "shifted (o, o+b, …)")
  if float(n) * (k + 1) <= 2e7:  # the backtracking table
    candidates.setdefault(vec_sens_argmax(np.diag(x).copy(), b, k), "VecSens argmax")
  candidates.setdefault(_local_search(x, (), b, k), "greedy")
  scored = sorted(((pattern_value_sq(x, p), p, how) for p, how in candidates.items()), reverse=True)
  best_sq, best, algorithm = scored[0]
  for _, start, how in scored[:_STARTS]:  # local search from the best few starts
    searched = _local_search(x, start, b, k)
    value_sq = pattern_value_sq(x, searched)
    if value_sq > best_sq * (1 + 1e-12):
      best, best_sq, algorithm = searched, value_sq, how + " + local search"
  value = math.sqrt(max(best_sq, 0.0))
  if sens.method in ("exact", "upper-bound") and value > sens.value * (1 + _TOLERANCE):
    raise AssertionError(
      f"the participation pattern {best[:8]} has ‖C 1_π‖ = {value!r}, above the {sens.method} "
      f"sensitivity {sens.value!r} of {strategy.describe()} under {schema.describe()}"
    )
  exact = sens.method == "exact" and value >= sens.value * (1 - _TOLERANCE)
  return WorstPattern(best, value, "exact" if exact else "lower-bound", sens, algorithm)
