"""Amplified BandMF accounting by b̂-cyclic Poisson sampling (BandMF §5 Thm 4, App. F Cor. F.1)."""

import json
import math

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import accounting
from fedmf.privacy import amplification as amp
from fedmf.privacy import gaussian_curve


def _bandmf(n, bands, scale=1.0):
  rng = np.random.default_rng(0)
  columns = [list(scale * (1.0 + rng.random(min(bands, n - j)))) for j in range(n)]
  return st.load_strategy({"mechanism": "bandmf", "n": n, "bands": bands, "columns": columns})


def test_dpsgd_with_poisson_sampling_equals_dp_accountings_own_event():
  """b̂ = 1, C = I: ε is dp_accounting's PLD of SelfComposed(PoissonSampled(q, Gaussian(σ)), n)."""
  import dp_accounting
  from dp_accounting.pld import pld_privacy_accountant

  n, sigma, delta = 200, 0.9, 1e-6
  sampling = amp.CyclicPoissonSampling(dataset_size=60_000, batch_size=600, partitions=1)
  assert sampling.sampling_probability == pytest.approx(0.01, rel=1e-15)
  result = amp.account_amplified(
    st.load_strategy({"mechanism": "dpsgd"}), n, sampling, delta, noise_multiplier=sigma
  )
  pld = pld_privacy_accountant.PLDAccountant()  # dp_accounting's defaults
  pld.compose(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(sigma)), n
    )
  )
  assert result.epsilon == pytest.approx(pld.get_epsilon(delta), rel=1e-12)
  assert result.bands == 1 and result.max_column_norm == 1.0 and result.accountant == "pld"
  # Amplification helps: the same σ without sampling (n Gaussian steps) is far less private.
  assert result.epsilon < accounting.dpsgd_epsilon(sigma, n, delta) / 5


@pytest.mark.parametrize("accountant", ["analytic", "pld"])
@pytest.mark.parametrize("n,bands", [(24, 4), (25, 4), (12, 1)])
def test_sampling_probability_one_equals_the_non_amplified_k_b_accounting(n, bands, accountant):
  """q = 1 (partition size = batch size): ⌈n/b̂⌉ composed Gaussians of σ/Δ, i.e. μ = √k·Δ/σ, the
  (k, b) = (⌈n/b̂⌉, b̂) accounting with the exact banded sensitivity √k (BandMF Thm 2)."""
  strategy = _bandmf(n, bands)
  sampling = amp.CyclicPoissonSampling(dataset_size=bands * 50, batch_size=50, partitions=bands)
  assert sampling.sampling_probability == 1.0
  sigma, delta = 3.0, 1e-6
  amplified = amp.account_amplified(
    strategy, n, sampling, delta, noise_multiplier=sigma, accountant=accountant
  )
  k = -(-n // bands)
  plain = accounting.account(
    strategy, ParticipationSchema(n, bands, k), sigma, delta, accountant=accountant
  )
  assert plain.sensitivity_method == "exact"
  assert plain.sensitivity == pytest.approx(math.sqrt(k), rel=1e-12)
  assert amplified.epsilon == pytest.approx(plain.epsilon, rel=1e-9)
  assert amplified.max_column_norm == pytest.approx(1.0, rel=1e-12)  # column-normalized C


def test_event_and_column_norm_of_a_banded_toeplitz():
  # C = LtToep(1, 0.5, 0.25), not normalized: Δ = ‖(1, .5, .25)‖, 3 bands (BandMF Thm 4's Δ).
  s = st.load_strategy({"mechanism": "band-toeplitz", "coefficients": [1.0, 0.5, 0.25]})
  bands, norm = amp.band_and_column_norm(s, 10)
  assert bands == 3
  assert norm == pytest.approx(math.sqrt(1 + 0.25 + 0.0625), rel=1e-15)
  sampling = amp.CyclicPoissonSampling(1000, 10, 5)  # q = 5·10/1000 = 0.05
  eps, used = amp.epsilon_for(2.0, 103, sampling, 1e-5, max_column_norm=2.0)
  # The corrected App. F event: ⌈103/5⌉ = 21 steps at q = 0.05 and σ/Δ = 1.
  assert eps == pytest.approx(accounting.dpsgd_epsilon(1.0, 21, 1e-5, 0.05), rel=1e-12)
  assert used == "pld"


def test_calibration_inverts_epsilon():
  strategy = _bandmf(64, 8)
  sampling = amp.CyclicPoissonSampling(dataset_size=8000, batch_size=100, partitions=8)  # q = 0.1
  result = amp.account_amplified(strategy, 64, sampling, 1e-6, target_epsilon=2.0)
  assert result.epsilon <= 2.0
  lower = amp.epsilon_for(result.noise_multiplier * (1 - 2e-3), 64, sampling, 1e-6)[0]
  assert lower > 2.0  # σ is the smallest to about rtol.
  # q = 1: the exact inverse of the Gaussian curve.
  full = amp.CyclicPoissonSampling(dataset_size=800, batch_size=100, partitions=8)
  exact = amp.account_amplified(strategy, 64, full, 1e-6, target_epsilon=2.0, accountant="analytic")
  mu = gaussian_curve.gaussian_mu_for_epsilon(2.0, 1e-6)
  assert exact.noise_multiplier == pytest.approx(math.sqrt(8) / mu, rel=1e-9)


def test_bad_input_is_one_line():
  with pytest.raises(FedmfUserError, match="at most 10 partitions"):
    amp.CyclicPoissonSampling(dataset_size=1000, batch_size=100, partitions=11)
  with pytest.raises(FedmfUserError, match="batch size"):
    amp.CyclicPoissonSampling(dataset_size=1000, batch_size=0.0, partitions=1)
  sampling = amp.CyclicPoissonSampling(dataset_size=1000, batch_size=10, partitions=2)
  with pytest.raises(FedmfUserError, match="bands <= partitions"):
    amp.account_amplified(_bandmf(16, 4), 16, sampling, 1e-6, noise_multiplier=1.0)
  tree = st.load_strategy({"mechanism": "tree"})
  with pytest.raises(FedmfUserError, match="not banded"):
    amp.account_amplified(tree, 16, sampling, 1e-6, noise_multiplier=1.0)


def test_a_sampling_probability_the_accountant_cannot_resolve_is_refused_in_fedmf_words():
  """Issue 38 item 14: a dataset of 1e21 examples gave dp_accounting's internal 'deltas are not in
  non-increasing order'; a batch above the dataset gave 'use at most 0 partitions'."""
  with pytest.raises(FedmfUserError, match=r"q = .* = 1e-19 is below 1e-12.*smaller dataset size"):
    amp.CyclicPoissonSampling(dataset_size=10**21, batch_size=100, partitions=1)
  with pytest.raises(FedmfUserError, match="the batch size 100 exceeds the dataset size 10"):
    amp.CyclicPoissonSampling(dataset_size=10, batch_size=100, partitions=1)
  # At the floor the PLD accountant still works (measured down to q = 1e-15), and ε only
  # grows with q: the floor's ε bounds any smaller q's.
  at_floor = amp.CyclicPoissonSampling(dataset_size=10**14, batch_size=100, partitions=1)
  assert at_floor.sampling_probability == pytest.approx(1e-12)
  eps, _ = amp.epsilon_for(0.5, 100, at_floor, 1e-6)
  larger, _ = amp.epsilon_for(0.5, 100, amp.CyclicPoissonSampling(10**6, 100, 1), 1e-6)
  assert 0 <= eps <= larger


def test_bands_auto_refuses_an_unaccountable_sampling_before_optimizing(
  tmp_path, capsys, monkeypatch
):
  def never(*args, **kwargs):
    raise AssertionError("optimized before refusing")

  monkeypatch.setattr(st.mechanism_class("bandmf"), "optimize", never)
  code = cli_main.main(
    ["strategy", "optimize", "--mechanism", "bandmf", "--bands", "auto", "--n", "100"]
    + ["--min-sep", "10", "--max-participations", "10", "--target-epsilon", "8"]
    + ["--delta", "1e-6", "--dataset-size", str(10**21), "--batch-size", "100"]
    + ["--out", str(tmp_path / "s.json")]
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "is below 1e-12" in err[0], err


def _cli(argv, capsys):
  code = cli_main.main(argv)
  out = capsys.readouterr()
  return code, out.out, out.err


def test_cli_account_with_and_without_amplification(tmp_path, capsys):
  path = tmp_path / "s.json"
  st.save_strategy(_bandmf(32, 4), path)
  base = ["account", str(path), "--n", "32", "--min-sep", "4", "--delta", "1e-6", "--json"]
  code, out, _ = _cli(base + ["--noise-multiplier", "1.5"], capsys)
  plain = json.loads(out)
  assert code == 0 and "amplified" not in plain
  flags = ["--dataset-size", "4000", "--batch-size", "50"]  # q = 4·50/4000 = 0.05
  code, out, _ = _cli(base + ["--noise-multiplier", "1.5"] + flags, capsys)
  amplified = json.loads(out)
  assert code == 0 and amplified["amplified"] is True
  assert amplified["partitions"] == 4 and amplified["steps"] == 8
  assert amplified["sampling_probability"] == pytest.approx(0.05)
  assert amplified["epsilon"] == pytest.approx(
    accounting.dpsgd_epsilon(1.5, 8, 1e-6, 0.05), rel=1e-12
  )
  assert amplified["epsilon"] < plain["epsilon"]
  code, out, _ = _cli(base + ["--target-epsilon", "1.0"] + flags, capsys)
  calibrated = json.loads(out)
  assert calibrated["calibrated"] and calibrated["epsilon"] <= 1.0
  code, _, err = _cli(base + ["--noise-multiplier", "1.5", "--dataset-size", "4000"], capsys)
  assert code == 2 and "both --dataset-size and --batch-size" in err
  assert "Traceback" not in err
