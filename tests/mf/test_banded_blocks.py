"""The block recursion for the prefix-sum error of a banded C against the dense formulas.

The dense references are computed here from their definitions: F = A C⁻¹ with numpy's inverse,
r_i = ‖row_i(F)‖², and ∂(Σ w_i r_i)/∂C = -2 Fᵀ diag(w) F C⁻ᵀ (the gradient of ‖diag(√w) F‖²_F,
BandMF Eq. 3-4 differentiated), restricted to C's band.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmf.mf import banded, banded_blocks, banded_matrix, banded_optimize


def _random_theta(rng, n, bands):
  theta = rng.standard_normal((bands, n)) / np.sqrt(bands)
  theta[0] = 1.5 + np.abs(theta[0])  # diagonally dominant: C⁻¹ stays moderate at n = 200
  for r in range(1, bands):
    theta[r, n - r :] = 0.0
  return theta


def _dense(theta, weights, workload="prefix"):
  n = theta.shape[1]
  c = banded_matrix.banded_matrix(theta)
  c_inv = np.linalg.inv(c)
  f = (np.tril(np.ones((n, n))) if workload == "prefix" else np.eye(n)) @ c_inv
  row_sq = np.sum(f * f, axis=1)
  grad_c = -2.0 * f.T @ (weights[:, None] * f) @ c_inv.T
  return row_sq, banded_matrix.theta_from_matrix(np.tril(grad_c), theta.shape[0])


CASES = [(1, 1), (9, 3), (40, 1), (50, 7), (64, 63), (65, 64), (37, 37), (130, 20), (200, 70)]


@pytest.mark.parametrize("n,bands", CASES)
@pytest.mark.parametrize("min_block", [4, banded_blocks.MIN_BLOCK])
def test_row_norms_and_gradient_match_the_dense_formulas(n, bands, min_block, monkeypatch):
  monkeypatch.setattr(banded_blocks, "MIN_BLOCK", min_block)  # many blocks, and the default
  rng = np.random.default_rng(n * 1000 + bands)
  theta = _random_theta(rng, n, bands)
  weights = rng.random(n)
  want_rows, want_grad = _dense(theta, weights)
  got = banded_blocks.PrefixError(theta)
  np.testing.assert_allclose(got.row_sq, want_rows, rtol=1e-10)
  np.testing.assert_allclose(got.gradient(weights), want_grad, rtol=1e-8, atol=1e-10)
  np.testing.assert_allclose(
    banded_blocks.row_sq_norms(theta), banded_matrix.decoder_row_sq_norms_by_rows(theta), rtol=1e-10
  )


@pytest.mark.parametrize("n,bands", [(9, 3), (50, 7), (130, 20), (65, 64)])
def test_the_identity_workload_gives_the_rows_of_c_inverse(n, bands, monkeypatch):
  monkeypatch.setattr(banded_blocks, "MIN_BLOCK", 4)
  rng = np.random.default_rng(n + 7 * bands)
  theta = _random_theta(rng, n, bands)
  weights = rng.random(n)
  want_rows, want_grad = _dense(theta, weights, "identity")
  got = banded_blocks.PrefixError(theta, workload="identity")
  np.testing.assert_allclose(got.row_sq, want_rows, rtol=1e-10)
  np.testing.assert_allclose(got.gradient(weights), want_grad, rtol=1e-8, atol=1e-10)
  np.testing.assert_allclose(banded_matrix.inverse_row_sq_norms(theta), want_rows, rtol=1e-10)


def test_gradient_matches_finite_differences():
  rng = np.random.default_rng(7)
  n, bands = 30, 5
  theta = _random_theta(rng, n, bands)
  weights = rng.random(n)
  grad = banded_blocks.PrefixError(theta).gradient(weights)

  def phi(t):
    return float(weights @ banded_blocks.row_sq_norms(t))

  eps = 1e-6
  for r, j in [(0, 0), (0, 29), (1, 3), (4, 10), (4, 25), (2, 27)]:
    up, down = theta.copy(), theta.copy()
    up[r, j] += eps
    down[r, j] -= eps
    assert grad[r, j] == pytest.approx((phi(up) - phi(down)) / (2 * eps), rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("route", ["auto", "blocks"])
def test_the_column_normalized_loss_and_gradient_agree_with_the_dense_route(route):
  rng = np.random.default_rng(3)
  n, bands = 48, 6
  theta = _random_theta(rng, n, bands)
  w = rng.random(n)

  def weights(row_sq):
    return float(w @ row_sq), w

  value, grad, rows = banded_matrix.loss_and_grad_with_row_weights(theta, None, weights, route)
  dense = banded_matrix.loss_and_grad_with_row_weights(theta, None, weights, "dense")
  assert value == pytest.approx(dense[0], rel=1e-12)
  np.testing.assert_allclose(grad, dense[1], rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(rows, dense[2], rtol=1e-12)
  with pytest.raises(ValueError, match="prefix-sum"):
    banded_matrix.loss_and_grad_with_row_weights(theta, np.eye(n), weights, "blocks")
  with pytest.raises(ValueError, match="route"):
    banded_matrix.loss_and_grad_with_row_weights(theta, None, weights, "fast")


def test_a_singular_c_is_refused():
  theta = np.ones((2, 5))
  theta[0, 2] = 0.0
  with pytest.raises(ValueError, match="singular"):
    banded_blocks.PrefixError(theta)
  with pytest.raises(ValueError, match="no gradient"):
    banded_blocks.PrefixError(np.ones((2, 5)), keep=False).gradient()


def test_the_optimizer_estimate_follows_the_block_passes():
  from fedmf.mf import strategies
  from fedmf.mf.schema import ParticipationSchema

  bandmf = strategies.mechanism_class("bandmf")
  schema = ParticipationSchema(2052, 342, 6)
  full = bandmf.optimize_cost(schema, strategies.OptimizeOptions())
  short = bandmf.optimize_cost(schema, strategies.OptimizeOptions(max_iter=16))
  # 130 expected iterations of ~1.7e9 multiply-adds at the nominal 5e9/s after the nested coarse
  # start's levels: under a minute, under the default limit of 120 s (the paper-scale command is
  # not refused by default).
  assert 20 < full.seconds < 120
  # Each level of the nested start (n, b̂ halved, rounded up, while `uses_coarse_start`) costs its
  # expected iterations (--max-iter caps each) of one forward and reverse pass at its size.
  levels = [(2052, 342)]
  while banded_optimize.uses_coarse_start(*levels[-1]):
    levels.append(((levels[-1][0] + 1) // 2, (levels[-1][1] + 1) // 2))
  assert len(levels) >= 2

  def expected(iterations):
    return (
      sum(
        (1.05 * iterations(i) + 1.0) * banded_matrix.banded_gradient_cost(n, b).seconds
        for i, (n, b) in enumerate(levels)
      )
      + banded_matrix.banded_error_cost(2052, 342).seconds
    )

  finest = banded.EXPECTED_ITERATIONS_AFTER_COARSE
  assert full.seconds == pytest.approx(
    expected(lambda i: finest if i < len(levels) - 1 else banded.EXPECTED_ITERATIONS)
  )
  assert short.seconds == pytest.approx(expected(lambda i: 16))
  # Objective 'max' starts from the square-root Toeplitz strategy: one level.
  maximum = bandmf.optimize_cost(schema, strategies.OptimizeOptions(objective="max"))
  assert maximum.seconds == pytest.approx(
    (1.05 * banded.EXPECTED_ITERATIONS + 1.0)
    * banded_matrix.banded_gradient_cost(2052, 342).seconds
    + banded_matrix.banded_error_cost(2052, 342).seconds
  )
  # No n×n matrix: the L-BFGS history (112 MB) and the block passes, below the dense route's
  # 8·n² floats (270 MB) alone.
  assert full.memory_bytes < 8 * 8 * 2052**2
  assert "L-BFGS iterations" in full.largest("seconds").what


def test_a_near_singular_trial_point_has_an_infinite_loss_and_no_warning():
  import warnings

  n, bands = 200, 3
  theta = np.zeros((bands, n))
  theta[0] = 1e-3  # C⁻¹ grows like 1e3^t: overflows float64 long before round 200
  theta[1, : n - 1] = 1.0
  theta[2, : n - 2] = 1.0
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    value, grad = banded_matrix.loss_sq_and_grad(theta)
  assert value == np.inf and not np.any(grad)


@pytest.mark.parametrize(
  "rows,width,depth", [(343, 343, 343), (686, 343, 343), (2, 2, 8), (5, 3, 9)]
)
def test_a_column_blocks_band_view_reaches_each_entry_once(rows, width, depth):
  """The band view of `_column_block` maps (r, q) to block[q + r, q] inside the block and to
  distinct memory everywhere, also when the band is deeper than a short last block."""
  block, band = banded_blocks._column_block(rows, width, depth)
  values = np.arange(1.0, depth * width + 1).reshape(depth, width)
  np.copyto(band, values)
  for q in range(width):
    for r in range(depth):
      if q + r < rows:
        assert block[q + r, q] == values[r, q]
  np.testing.assert_array_equal(band, values)  # no entry overwrote another
