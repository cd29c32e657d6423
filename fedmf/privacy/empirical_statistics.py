"""The canaries' test statistics: what each threat model sees of a canary, one number per canary.

One concept: turn a run's canary projections into statistics whose null distribution is known
(docs/empirical-privacy.md, notation of docs/architecture.md). A canary c with unit direction u_c
joins the rounds π_c and adds ζ_t·u_c to those rounds' clipped sums. Projecting every released
noised sum on u_c and dividing by ζ_t gives, per round,

    p_c = 1_πc + σ·P w_c + (the real clients' projections, about ζ/√N each)

with P the per-round noise matrix (`Strategy.per_round_noise_matrix`: C⁻¹ for a square C, the
tree's per-round decoder) and w_c i.i.d. N(0, 1): directions are orthonormal and the noise is
isotropic, so different canaries' noises are independent. The releases' noise covariance is
σ²·Σ with Σ = P Pᵀ; a whitening W with W Σ Wᵀ = I (W = C for a square C) decorrelates it:

    T_c = ⟨W 1_πc, W p_c⟩ / (σ ‖W 1_πc‖)  ~  N(‖W 1_πc‖/σ, 1) if inserted, N(0, 1) if not,

the most powerful test of the two (Neyman–Pearson). Its mean μ_c = ‖W 1_πc‖/σ is, for a square C,
‖C 1_πc‖/σ, the pattern's sensitivity over σ: exactly the μ of the Gaussian-DP claim. For the
tree the per-round releases are a post-processing of the node releases the analysis charges for:
‖W 1_π‖² = 1_πᵀ Σ⁻¹ 1_π = min {‖v‖² : P v = 1_π} ≤ ‖C 1_π‖² (P C = I), so what the releases show
is at most the analytic μ.

The final model's statistic is Andrew et al.'s: the cosine of the final model's change
Δ = w_final − w_initial with u_c (Andrew et al. 2024, §3).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from fedmf.mf import resources


def whitening_cost(strategy, n: int) -> resources.Cost:
  rows, cols = strategy.matrix_shape(n)
  if rows == cols:
    return strategy.dense_cost(n, "the dense C that decorrelates the canaries' releases", 2.0)
  return resources.Cost.of(
    f"the per-round noise covariance P Pᵀ ({n}×{n}) of {strategy.describe()} and its Cholesky",
    resources.FLOAT * (float(n) * rows + 3.0 * float(n) * n),
    (2.0 * float(n) * n * rows + 2.0 * float(n) ** 3) / resources.DENSE_RATE,
  )


def release_whitening(strategy, n: int) -> np.ndarray:
  """W (n×n, float64) with W Σ Wᵀ = I for the per-round releases' unit noise covariance Σ = P Pᵀ.

  A square C gives W = C itself (P = C⁻¹). Otherwise (the tree) W = L⁻¹ with L Lᵀ = P Pᵀ.
  """
  resources.check(whitening_cost(strategy, n), f"decorrelating {n} rounds of canary releases")
  rows, cols = strategy.matrix_shape(n)
  if rows == cols:
    return np.asarray(strategy.matrix(n), np.float64)
  p = strategy.per_round_noise_matrix(n)
  chol = np.linalg.cholesky(p @ p.T)
  return scipy.linalg.solve_triangular(chol, np.eye(n), lower=True)


def unique_patterns(patterns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(U, inverse): the distinct columns of the (n, M) bool `patterns` as U (n × distinct) and the
  index of each canary's column in it (a hash of the packed bits: np.unique(axis=...) sorts slowly)."""
  patterns = np.asarray(patterns, bool)
  packed = np.ascontiguousarray(np.packbits(patterns, axis=0).T)
  first: dict[bytes, int] = {}
  inverse = np.empty(patterns.shape[1], np.int64)
  for c, row in enumerate(packed):
    inverse[c] = first.setdefault(row.tobytes(), len(first))
  columns = np.empty(len(first), np.int64)
  columns[inverse[::-1]] = np.arange(patterns.shape[1])[::-1]  # a canary of each pattern
  return patterns[:, columns], inverse


def check_patterns(patterns: np.ndarray, rounds: int, canaries: int) -> np.ndarray:
  patterns = np.asarray(patterns)
  if patterns.shape != (rounds, canaries):
    raise ValueError(f"patterns must have shape {(rounds, canaries)}, got {patterns.shape}")
  return patterns.astype(bool)


def all_releases_statistics(
  projections: np.ndarray, patterns: np.ndarray, whitening: np.ndarray, noise_multiplier: float
) -> tuple[np.ndarray, np.ndarray]:
  """(T, μ): every canary's decorrelated statistic T_c and its mean μ_c = ‖W 1_πc‖/σ if inserted.

  Args:
    projections: (n, M) p[t, c] = ⟨released noised sum of round t, u_c⟩ / ζ_t.
    patterns: (n, M) bool, canary c's rounds (those it joined, or would have joined if held out).
    whitening: W of `release_whitening`.
    noise_multiplier: σ of the noise added in training (the noise per coordinate of C x is ζ·σ).

  Canaries with no round have no statistic: NaN in both. Canaries sharing a pattern share its
  work: O(U·n² + n·M) for U distinct patterns (one under the worst-case pattern).
  """
  n, m = np.shape(projections)
  patterns = check_patterns(patterns, n, m)
  if not noise_multiplier > 0:
    raise ValueError(f"the canary statistics need noise: noise_multiplier is {noise_multiplier}")
  w = np.asarray(whitening, np.float64)
  unique, inverse = unique_patterns(patterns)
  a = w @ unique.astype(np.float64)  # W 1_π for each distinct π
  norms = np.linalg.norm(a, axis=0)
  g = w.T @ a  # Wᵀ W 1_π: T_c = ⟨g_π, p_c⟩ / (σ ‖W 1_π‖)
  inner = np.einsum("tc,tc->c", g[:, inverse], np.asarray(projections, np.float64))
  with np.errstate(invalid="ignore", divide="ignore"):
    stat = inner / (noise_multiplier * norms[inverse])
    mu = norms[inverse] / noise_multiplier
  empty = norms[inverse] == 0
  stat[empty] = np.nan
  mu[empty] = np.nan
  return stat, mu


def pattern_norms(matrix: np.ndarray, patterns: np.ndarray) -> np.ndarray:
  """‖M 1_πc‖ for every canary (M = C: the pattern's sensitivity; M = W: what the releases show)."""
  unique, inverse = unique_patterns(patterns)
  return np.linalg.norm(np.asarray(matrix) @ unique.astype(np.float64), axis=0)[inverse]


def final_model_cosines(delta_projections: np.ndarray, delta_norm: float) -> np.ndarray:
  """cos(Δ, u_c) = ⟨Δ, u_c⟩ / ‖Δ‖ for the final model's change Δ (Andrew et al. 2024, §3)."""
  if not delta_norm > 0:
    raise ValueError("the final model did not change: no cosine with any canary")
  return np.asarray(delta_projections, np.float64) / float(delta_norm)
