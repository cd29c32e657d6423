"""The strategy-level dispatch: sensitivity methods, structured errors and streaming noise.

Every structured number is compared with a dense recomputation (B = A C⁻¹ by a linear solve) or a
brute force over participation patterns and signs.
"""

import itertools

import numpy as np
import pytest

from fedmf.mf import evaluation, streaming, workloads
from fedmf.mf import strategies as st
from tests.mf.brute_force import brute_force_sensitivity


def _random_strategies(rng, n):
  bands = int(rng.integers(1, n + 1))
  columns = [list(rng.normal(size=min(bands, n - j))) for j in range(n)]
  for col in columns:
    col[0] = abs(col[0]) + 0.5  # keep C invertible
  theta = np.sort(rng.uniform(0.05, 0.95, size=2))[::-1]
  yield st.load_strategy({"mechanism": "bandmf", "n": n, "bands": bands, "columns": columns})
  coefs = list(rng.uniform(-0.5, 1.0, size=bands))
  coefs[0] = 1.0
  yield st.load_strategy(
    {
      "mechanism": "band-toeplitz",
      "coefficients": coefs,
      "column_normalized": bool(rng.integers(2)),
    }
  )
  yield st.load_strategy(
    {"mechanism": "band-toeplitz", "coefficients": sorted(rng.uniform(0.1, 1, bands), reverse=True)}
  )
  yield st.load_strategy(
    {"mechanism": "blt", "buf_decay": list(theta), "output_scale": list(rng.uniform(0, 0.6, 2))}
  )
  yield st.load_strategy({"mechanism": "dpsgd"})
  dense = np.tril(rng.normal(size=(n, n)))
  dense[np.diag_indices(n)] = np.abs(np.diag(dense)) + 0.5  # keep C invertible
  yield st.load_strategy({"mechanism": "dense", "matrix": dense.tolist()})


def _dense_sq_errors(strategy, n, a):
  c = strategy.matrix(n)
  b = a @ np.linalg.inv(c)
  return np.sum(b * b, axis=1)


def test_sensitivity_is_never_below_brute_force_and_exact_matches():
  rng = np.random.default_rng(0)
  checked_exact = 0
  for _ in range(25):
    n = int(rng.integers(2, 8))
    for strategy in _random_strategies(rng, n):
      c = strategy.matrix(n)
      for b, k in itertools.product(range(1, n + 1), (1, 2, None)):
        truth = brute_force_sensitivity(c, b, k)
        auto = evaluation.sensitivity(strategy, n, b, k)
        upper = evaluation.sensitivity(strategy, n, b, k, method="upper-bound")
        lower = evaluation.sensitivity(strategy, n, b, k, method="lower-bound")
        assert auto.value >= truth - 1e-9, (strategy, b, k)
        assert upper.value >= truth - 1e-9
        assert upper.method == "upper-bound" and lower.method == "lower-bound"
        assert lower.value <= truth + 1e-9
        if auto.method == "exact":
          checked_exact += 1
          assert auto.value == pytest.approx(truth, rel=1e-9, abs=1e-12), (strategy, b, k, auto)
        else:
          assert auto.method == "upper-bound"
  assert checked_exact > 100


def test_single_participation_is_max_column_norm():
  strategy = st.load_strategy({"mechanism": "band-toeplitz", "coefficients": [1.0, -2.0, 0.5]})
  c = strategy.matrix(6)
  result = evaluation.sensitivity(strategy, 6, None)
  assert result.method == "exact"
  assert result.value == pytest.approx(np.max(np.linalg.norm(c, axis=0)))


def test_blt_outside_theorem_falls_back_to_upper_bound():
  # Σω > 1: the coefficients still decrease from c_1 on, but c_1 > c_0 = 1 breaks Thm 3.1.
  strategy = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.8, 0.6]}
  )
  result = evaluation.sensitivity(strategy, 10, 3, 3)
  assert result.method == "upper-bound"
  assert result.value >= brute_force_sensitivity(strategy.matrix(10), 3, 3) - 1e-9
  inside = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}
  )
  assert evaluation.sensitivity(inside, 10, 3, 3).method == "exact"


def test_bandmf_narrow_separation_falls_back():
  strategy = st.load_strategy(
    {"mechanism": "bandmf", "n": 6, "bands": 3, "columns": [[1, -1, 1]] * 4 + [[1, -1], [1]]}
  )
  assert evaluation.sensitivity(strategy, 6, 3, 2).method == "exact"
  assert evaluation.sensitivity(strategy, 6, 3, 2).value == pytest.approx(np.sqrt(2))
  assert evaluation.sensitivity(strategy, 6, 2, 2).method == "upper-bound"


@pytest.mark.parametrize("workload", ["prefix", "momentum"])
def test_structured_errors_equal_dense(workload):
  rng = np.random.default_rng(1)
  n = 9
  a = workloads.by_name(workload, n)
  for strategy in _random_strategies(rng, n):
    got = evaluation.decoder_row_sq_norms(strategy, n, workload)
    np.testing.assert_allclose(got, _dense_sq_errors(strategy, n, a), rtol=1e-9, atol=1e-12)


def test_tree_errors_are_the_decoder_variances():
  n = 8
  for variant, expected_last in (("vanilla", 1.0), ("online-honaker", 8 / 15)):
    sq = evaluation.decoder_row_sq_norms({"mechanism": "tree", "variant": variant}, n)
    assert sq[-1] == pytest.approx(expected_last)
  vanilla = evaluation.decoder_row_sq_norms({"mechanism": "tree", "variant": "vanilla"}, n)
  np.testing.assert_allclose(vanilla, [bin(t).count("1") for t in range(1, n + 1)])
  full = evaluation.decoder_row_sq_norms({"mechanism": "tree", "variant": "full-honaker"}, n)
  assert np.all(full <= vanilla + 1e-12)


def test_evaluate_losses_are_sensitivity_times_errors():
  strategy = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}
  )
  result = evaluation.evaluate(strategy, 12, 4, 2)
  sq = _dense_sq_errors(strategy, 12, workloads.prefix_sum(12))
  assert result.max_error == pytest.approx(np.sqrt(sq.max()))
  assert result.rms_error == pytest.approx(np.sqrt(sq.mean()))
  assert result.max_loss == pytest.approx(result.sensitivity * result.max_error)
  assert result.rms_loss == pytest.approx(result.sensitivity * result.rms_error)
  assert result.effective_max_participations == 2
  assert result.rmse(2.0) == pytest.approx(2.0 * result.rms_error)
  # Reference value: min-sep sens² of this BLT at n = 12, (b, k) = (4, 2) is 3.778520088 by brute force.
  assert result.sensitivity**2 == pytest.approx(3.778520088, rel=1e-9)


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
def test_streams_equal_dense_inverse(shape):
  rng = np.random.default_rng(2)
  n = 10
  for strategy in _random_strategies(rng, n):
    c = strategy.matrix(n)
    z = rng.normal(size=(n,) + shape)
    out = streaming.inverse_noise(strategy.noise_stream(n), z)
    expected = np.linalg.solve(c, z.reshape(n, -1)).reshape(z.shape)
    np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(
      strategy.noise_row_norms(n), np.linalg.norm(np.linalg.inv(c), axis=1)
    )


def test_bandmf_stream_refuses_to_run_past_its_horizon():
  strategy = st.load_strategy(
    {"mechanism": "bandmf", "n": 2, "bands": 1, "columns": [[1.0], [1.0]]}
  )
  stream = strategy.noise_stream()
  assert stream.horizon == 2
  streaming.inverse_noise(stream, np.zeros((2, 1)))
  with pytest.raises(st.StrategyError, match="n=2"):
    streaming.inverse_noise(stream, np.zeros((3, 1)))
