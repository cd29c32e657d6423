"""Conditioning of C at load (docs/mechanisms.md, Conditioning): every optimized strategy passes with
a wide margin, near-singular and overflowing ones are refused naming the field, the numbers and the
limit, and the numbers themselves agree with dense linear algebra."""

import json

import numpy as np
import pytest
import scipy.linalg

from fedmf.mf import blt_math
from fedmf.mf import toeplitz_math
from fedmf.mf import banded_matrix
from fedmf.mf import strategies as st
from fedmf.mf import strategy as strategy_lib
from fedmf.mf.schema import ParticipationSchema

LIMIT = strategy_lib.MAX_NOISE_AMPLIFICATION


def _dense_numbers(c):
  """(s, r, max|C_tt|) of a dense lower-triangular C, by brute force."""
  c_inv = scipy.linalg.solve_triangular(c, np.eye(len(c)), lower=True)
  return (
    np.max(np.linalg.norm(c, axis=0)),
    np.max(np.linalg.norm(c_inv, axis=1)),
    np.max(np.abs(np.diag(c))),
  )


# --- the numbers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "obj",
  [
    {"mechanism": "bandmf", "n": 7, "bands": 3, "columns": [[2, 1, 0.5]] * 5 + [[1, 0.5], [3]]},
    {"mechanism": "dense", "matrix": [[2, 0, 0], [0.5, 1, 0], [-1, 0.25, 0.5]]},
  ],
)
def test_horizon_numbers_equal_dense_linear_algebra(obj):
  strategy = st.load_strategy(obj)
  n = strategy.horizon
  got = strategy.conditioning()
  s, r, d = _dense_numbers(strategy.matrix(n))
  assert got.rounds == n
  np.testing.assert_allclose([got.column_norm, got.noise_gain, got.diagonal], [s, r, d], rtol=1e-12)
  # A smaller horizon (the leading block, renormalized for BandMF) is never worse.
  for m in range(1, n):
    assert strategy.conditioning(m).amplification <= got.amplification * (1 + 1e-12)


@pytest.mark.parametrize(
  "obj",
  [
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]},
    {"mechanism": "blt", "buf_decay": [0.5], "output_scale": [1.4]},  # θ̂ < 0, still stable
    {"mechanism": "band-toeplitz", "coefficients": [1.0, -0.9, 0.3]},
    {"mechanism": "band-toeplitz", "coefficients": [2.0, 1.0, 0.5], "column_normalized": True},
  ],
)
def test_horizon_free_numbers_are_the_supremum_over_all_rounds(obj):
  strategy = st.load_strategy(obj)
  sup = strategy.conditioning()
  assert sup.rounds is None
  values = []
  for n in (5, 50, 400):
    values.append(_dense_numbers(strategy.matrix(n)))
    s, r, d = values[-1]
    assert s <= sup.column_norm * (1 + 1e-9) and r <= sup.noise_gain * (1 + 1e-9)
    assert d * r <= sup.amplification * (1 + 1e-9)
  # ...and attained in the limit (these decay fast: 400 rounds reach it to ~1e-9).
  s, r, _ = values[-1]
  np.testing.assert_allclose([s, r], [sup.column_norm, sup.noise_gain], rtol=1e-8)


def test_inverse_energy_is_the_impulse_response_energy_and_detects_instability():
  for coefs in ([1.0, 0.5], [1.0, -0.9], list(toeplitz_math.sqrt_coefs(60)), [2.0, 1.0, 0.9, -0.3]):
    energy, reason = toeplitz_math.inverse_energy(coefs)
    assert reason is None
    chat = toeplitz_math.inverse_coefs(coefs, 50_000)
    np.testing.assert_allclose(energy, np.sum(chat**2), rtol=1e-5)
  for coefs, modulus in (([1.0, 2.0], "2"), ([1.0, 1.0], "1"), ([1.0, 0.0, 1.5], "1.22474")):
    energy, reason = toeplitz_math.inverse_energy(coefs)
    assert energy == np.inf and f"pole of modulus {modulus}" in reason
    assert np.max(np.abs(np.roots(coefs))) >= 1.0 - 1e-12


@pytest.mark.parametrize("n, bands", [(12, 3), (40, 5), (9, 9), (30, 1)])
def test_inverse_row_norms_without_the_dense_inverse(n, bands):
  rng = np.random.default_rng(n + bands)
  theta = rng.uniform(0.3, 1.0, (bands, n))
  theta[0] += 1.0  # A dominant diagonal keeps the dense reference itself accurate.
  theta = banded_matrix.normalize_columns(theta)
  c = banded_matrix.banded_matrix(theta)
  expected = np.sum(scipy.linalg.solve_triangular(c, np.eye(n), lower=True) ** 2, axis=1)
  np.testing.assert_allclose(banded_matrix.inverse_row_sq_norms(theta), expected, rtol=1e-11)


def test_normalize_columns_is_scale_safe_and_unchanged_for_ordinary_columns():
  theta = np.array([[1e-300, 1e200, 3.0, 5.0], [0.0, 1e200, 4.0, 0.0]])
  got = banded_matrix.normalize_columns(theta)
  np.testing.assert_allclose(got, [[1.0, 2**-0.5, 0.6, 1.0], [0.0, 2**-0.5, 0.8, 0.0]], rtol=1e-15)
  ordinary = banded_matrix.columns_to_theta(np.random.default_rng(0).uniform(0.1, 2.0, (3, 8)))
  plain = ordinary / np.sqrt(np.sum(ordinary * ordinary, axis=0))
  assert np.array_equal(banded_matrix.normalize_columns(ordinary), plain)


# --- legitimate strategies pass with a wide margin ---------------------------------------------


@pytest.mark.parametrize(
  "n, b, k, bands",
  [(60, 15, 4, 15), (60, 1, 60, 60), (256, 32, 8, 32), (2052, 342, 6, 342), (2052, 342, 6, 64)],
)
@pytest.mark.parametrize("normalize", [False, True])
def test_optimized_band_toeplitz_is_well_conditioned(n, b, k, bands, normalize):
  schema = ParticipationSchema(n, b, k)
  options = st.OptimizeOptions(bands=bands, column_normalize=normalize, max_iter=300)
  strategy, _ = st.BandToeplitz.optimize(schema, options)
  assert strategy.conditioning(n).amplification < 10
  st.load_strategy(strategy.to_dict())  # Through the loader, checked again.


@pytest.mark.parametrize("n, b, k, buffers", [(60, 15, 4, 2), (256, 1, 256, 3), (2052, 342, 6, 4)])
def test_optimized_blt_is_well_conditioned(n, b, k, buffers):
  strategy, _ = st.Blt.optimize(ParticipationSchema(n, b, k), st.OptimizeOptions(buffers=buffers))
  conditioning = strategy.conditioning()
  assert conditioning.amplification < 10 and conditioning.column_norm < 1e3
  theta_hat, _ = blt_math.inverse_blt(strategy.buf_decay, strategy.output_scale)
  assert np.max(np.abs(theta_hat)) < 1


@pytest.mark.parametrize("n, b, k, bands", [(60, 15, 4, 15), (128, 16, 8, 16)])
def test_optimized_bandmf_is_well_conditioned(n, b, k, bands):
  schema = ParticipationSchema(n, b, k)
  strategy, _ = st.BandMF.optimize(schema, st.OptimizeOptions(bands=bands, max_iter=50))
  assert strategy.conditioning().amplification < 10


@pytest.mark.slow
@pytest.mark.parametrize("bands", [64, 342])
def test_paper_scale_bandmf_is_well_conditioned(bands):
  schema = ParticipationSchema(2052, 342, 6)
  strategy, _ = st.BandMF.optimize(schema, st.OptimizeOptions(bands=bands))
  assert strategy.conditioning().amplification < 10  # 4.2 and 3.4 measured


def test_unstable_optimizer_output_is_checked_at_each_use():
  """The band-toeplitz optimizer can leave a pole just outside the unit circle when b̂ ≈ n:
  harmless over its n rounds, so it loads, is usable for them, and is refused where it blows up."""
  schema = ParticipationSchema(128, 1, 100)
  strategy, _ = st.BandToeplitz.optimize(schema, st.OptimizeOptions(bands=128))
  assert not strategy.stable
  assert strategy.conditioning(128).amplification < 10
  st.load_strategy(strategy.to_dict()).check_horizon(128)
  with pytest.raises(st.StrategyError, match="horizon n"):
    strategy.noise_stream()
  assert strategy.noise_stream(128).horizon == 128
  blow_up = next(
    n for n in 2 ** np.arange(8, 30) if strategy.conditioning(int(n)).noise_gain > 1e12
  )
  with pytest.raises(st.StrategyError, match=r"pole of modulus 1\.000"):
    strategy.check_horizon(int(blow_up))


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "obj, field, numbers",
  [
    (  # BandMF with a diagonal of 1e-300 next to an ordinary entry.
      {"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1e-300, 1], [1, 0.5], [1]]},
      "'columns'",
      "limit 1e+12",
    ),
    (  # ...and of 1e-8: finite noise, but 1e8 times what its diagonal accounts for.
      {"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1e-8, 1], [1, 0.5], [1]]},
      "'columns'",
      "= 1.12e+08, above the limit 1e+06",
    ),
    (
      {"mechanism": "band-toeplitz", "coefficients": [1e-300, 1.0]},
      "'coefficients'",
      "is 1e+300, above the limit 1e+12",
    ),
    ({"mechanism": "band-toeplitz", "coefficients": [1e-300]}, "'coefficients'", "1e+300"),
    (
      {"mechanism": "blt", "buf_decay": [0.5], "output_scale": [1e308]},
      "'buf_decay' and 'output_scale'",
      "column norm over all rounds is inf, above the limit 1e+12",
    ),
    (  # Large but finite: C⁻¹ has θ̂ = -2.5, its noise grows as 2.5^t.
      {"mechanism": "blt", "buf_decay": [0.5], "output_scale": [3.0]},
      "'buf_decay' and 'output_scale'",
      "θ̂ = -2.5 with |θ̂| ≥ 1",
    ),
    ({"mechanism": "dense", "matrix": [[1e-300, 0], [1, 1]]}, "'matrix'", "inf, above"),
    ({"mechanism": "dense", "matrix": [[1e-9, 0], [1, 1]]}, "'matrix'", "1e+09, above the limit"),
    ({"mechanism": "dense", "matrix": [[1e200, 0], [1, 1]]}, "'matrix'", "column norm"),
  ],
)
def test_near_singular_or_overflowing_c_is_refused_at_load(tmp_path, obj, field, numbers):
  path = tmp_path / "c.json"
  path.write_text(json.dumps(obj))
  with pytest.raises(st.StrategyError) as info:
    st.load_strategy(str(path))
  message = str(info.value)
  assert message.startswith(str(path)) and field in message and numbers in message, message
  assert "\n" not in message


def test_scale_alone_is_not_conditioning():
  """A lone tiny column normalizes to 1: BandMF and column-normalized Toeplitz C are fine."""
  bandmf = st.load_strategy({"mechanism": "bandmf", "n": 2, "bands": 1, "columns": [[1e-300], [1]]})
  np.testing.assert_array_equal(bandmf.matrix(2), np.eye(2))
  tiny = {"mechanism": "band-toeplitz", "coefficients": [1e-300], "column_normalized": True}
  assert st.load_strategy(tiny).conditioning().amplification == 1.0


def test_unstable_band_toeplitz_is_refused_where_its_noise_overflows():
  strategy = st.load_strategy({"mechanism": "band-toeplitz", "coefficients": [1.0, 2.0]})
  strategy.check_horizon(10)  # 2^9 · ... : large, but inside the limits.
  with pytest.raises(st.StrategyError, match=r"n=100 rounds, is 7.32e\+29.*pole of modulus 2"):
    strategy.check_horizon(100)
