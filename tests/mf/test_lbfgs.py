"""Tests for fedmf.mf.lbfgs: the compact L-BFGS direction against the dense BFGS inverse update, and the
backtracking driver on a problem with a known minimum."""

import numpy as np
import pytest

from fedmf.mf import lbfgs


def _dense_inverse_hessian(s_hist, y_hist):
  """H from H₀ = γI, γ = sᵀy/yᵀy of the newest pair, then H ← (I - ρsyᵀ) H (I - ρysᵀ) + ρssᵀ for
  each pair, oldest first (Nocedal & Wright Eq. 7.19 and 6.17), as a dense matrix."""
  dim = s_hist[0].size
  s_last, y_last = s_hist[-1], y_hist[-1]
  h = (s_last @ y_last) / (y_last @ y_last) * np.eye(dim)
  for s, y in zip(s_hist, y_hist):
    rho = 1.0 / (y @ s)
    left = np.eye(dim) - rho * np.outer(s, y)
    h = left @ h @ left.T + rho * np.outer(s, s)
  return h


def _history(s_hist, y_hist, memory):
  pairs = lbfgs.CompactHistory(s_hist[0].size, memory)
  for s, y in zip(s_hist, y_hist):
    pairs.add(s, y)
  return pairs


def test_compact_direction_matches_the_dense_bfgs_update_and_the_secant_condition():
  rng = np.random.default_rng(3)
  dim = 9
  m = rng.standard_normal((dim, dim))
  hessian = m @ m.T + dim * np.eye(dim)  # y = ∇²f s for a quadratic: sᵀy > 0
  s_hist = [rng.standard_normal(dim) for _ in range(7)]
  y_hist = [hessian @ s for s in s_hist]
  g = rng.standard_normal(dim)
  # Memory 4: the newest 4 of 7 pairs, added one at a time with a direction taken in between (the
  # driver's order), so the ring buffer wraps and the Gram entries are updated lazily.
  pairs = lbfgs.CompactHistory(dim, 4)
  for count, (s, y) in enumerate(zip(s_hist, y_hist), start=1):
    pairs.add(s, y)
    if count % 2:
      kept = max(0, count - 4)
      h = _dense_inverse_hessian(s_hist[kept:count], y_hist[kept:count])
      np.testing.assert_allclose(pairs.direction(g), -h @ g, rtol=1e-10, atol=1e-12)
  assert pairs.order == [3, 0, 1, 2]  # slots of pairs 4..7, oldest first
  h = _dense_inverse_hessian(s_hist[3:], y_hist[3:])
  np.testing.assert_allclose(pairs.direction(g), -h @ g, rtol=1e-10, atol=1e-12)
  # H y = s for the newest pair, and g itself is left untouched.
  g_copy = g.copy()
  np.testing.assert_allclose(pairs.direction(y_hist[-1]), -s_hist[-1], rtol=1e-10)
  pairs.direction(g)
  np.testing.assert_array_equal(g, g_copy)
  # A pair without curvature (sᵀy ≤ 0) is not kept; without history: steepest descent.
  pairs.add(s_hist[0], -y_hist[0])
  assert pairs.count == 4
  pairs.clear()
  np.testing.assert_array_equal(pairs.direction(g), -g)
  np.testing.assert_array_equal(_history(s_hist[:1], [-y_hist[0]], 3).direction(g), -g)


def test_backtracking_minimizes_a_quadratic_and_refuses_an_infeasible_start():
  rng = np.random.default_rng(4)
  m = rng.standard_normal((12, 12))
  a = m @ m.T + np.eye(12)
  b = rng.standard_normal(12)
  xstar = np.linalg.solve(a, b)

  def fun(x):
    return float(0.5 * x @ a @ x - b @ x), a @ x - b

  res = lbfgs.minimize(fun, np.zeros(12), max_iter=500, memory=5, rtol=1e-15)
  np.testing.assert_allclose(res.x, xstar, rtol=1e-6, atol=1e-8)
  assert res.evaluations >= res.iterations > 0
  with pytest.raises(ValueError, match='infeasible'):
    lbfgs.minimize(lambda x: (np.inf, None), np.zeros(3), max_iter=5, memory=3)
