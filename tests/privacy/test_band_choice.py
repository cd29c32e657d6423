"""Choosing b̂ under amplification: `fedmf strategy optimize --mechanism bandmf --bands auto`
(BandMF §5 "Optimizing the number of bands", App. G)."""

import json
import math

import pytest

from fedmf.cli import main as cli_main
from fedmf.mf import strategies as st
from fedmf.privacy import band_choice
from fedmf.privacy import gaussian_curve


def test_candidates_are_powers_of_two_and_the_cap():
  # cap = min(n, b, ⌊N/B⌋) (BandMF §5: b ∈ {1, 2, …, m/B}).
  assert band_choice.candidate_bands(1024, 1024, 1024, 1) == [1 << p for p in range(11)]
  assert band_choice.candidate_bands(100, 48, 10_000, 100) == [1, 2, 4, 8, 16, 32, 48]
  assert band_choice.candidate_bands(64, 16, 2000, 100) == [1, 2, 4, 8, 16]
  assert band_choice.candidate_bands(5, None, 10, 1) == [1, 2, 4, 5]


def _run(argv, capsys):
  code = cli_main.main(argv)
  captured = capsys.readouterr()
  return code, captured.out, captured.err


ARGS = [
  "strategy",
  "optimize",
  "--mechanism",
  "bandmf",
  "--bands",
  "auto",
  "--n",
  "32",
  "--min-sep",
  "8",
  "--max-participations",
  "4",
  "--target-epsilon",
  "2",
  "--delta",
  "1e-6",
  "--dataset-size",
  "800",
  "--batch-size",
  "100",
]


def test_bands_auto_contract(tmp_path, capsys, monkeypatch):
  import dp_accounting
  from dp_accounting.pld import pld_privacy_accountant

  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path / "cache"))
  out = tmp_path / "auto.json"
  code, text, _ = _run(ARGS + ["--out", str(out), "--json"], capsys)
  assert code == 0
  result = json.loads(text)
  rows = {row["bands"]: row for row in result["bands"]}
  assert sorted(rows) == [1, 2, 4, 8]  # cap = min(32, 8, 800/100)
  for row in result["bands"]:
    assert set(row) == {"bands", "rmse", "noise_multiplier"}
  best = min(result["bands"], key=lambda r: r["rmse"])
  assert result["best_bands"] == best["bands"]
  # b̂ = 1 is DP-SGD with Poisson sampling (C = I, ‖A‖²_F = n(n+1)/2): q = 100/800, 32 steps.
  sigma1 = rows[1]["noise_multiplier"]
  assert rows[1]["rmse"] == pytest.approx(sigma1 * math.sqrt(33 / 2), rel=1e-12)
  pld = pld_privacy_accountant.PLDAccountant()
  pld.compose(
    dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.125, dp_accounting.GaussianDpEvent(sigma1)), 32
    )
  )
  assert pld.get_epsilon(1e-6) == pytest.approx(2.0, abs=0.01)  # calibrated to within rtol
  # b̂ = 8 = N/B: q = 1, 4 Gaussian steps, i.e. μ = 2/σ on the exact curve (raised in steps of
  # rtol until the pessimistic PLD accountant, used for every candidate, agrees).
  exact = 2.0 / gaussian_curve.gaussian_mu_for_epsilon(2.0, 1e-6)
  assert exact <= rows[8]["noise_multiplier"] <= exact * 1.002
  # Amplification pays: fewer bands need less noise.
  sigmas = [rows[b]["noise_multiplier"] for b in (1, 2, 4, 8)]
  assert sigmas == sorted(sigmas)
  written = st.load_strategy(out)
  assert written.mechanism == "bandmf" and written.bands == result["best_bands"]
  saved = json.loads(out.read_text())
  assert saved["optimized_for"]["amplification"]["partitions"] == result["best_bands"]

  # Cached: a second run optimizes nothing new and gives the same answer.
  cached = sorted(p.name for p in (tmp_path / "cache" / "strategies").iterdir())
  assert len(cached) == 4
  code, text, _ = _run(ARGS + ["--out", str(out), "--json", "--force"], capsys)
  again = json.loads(text)
  assert code == 0 and again["bands"] == result["bands"]
  assert sorted(p.name for p in (tmp_path / "cache" / "strategies").iterdir()) == cached


@pytest.mark.parametrize(
  "change,message",
  [
    (["--mechanism", "band-toeplitz"], "--bands auto needs --mechanism bandmf"),
    (["--dataset-size", None], "--bands auto needs --dataset-size"),
    (["--bands", "4"], "only apply with --bands auto"),
    (["--batch-size", "1000"], "no band count fits"),
  ],
)
def test_bands_auto_bad_input(tmp_path, capsys, monkeypatch, change, message):
  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path / "cache"))
  argv = list(ARGS)
  flag, value = change
  i = argv.index(flag)
  if value is None:
    del argv[i : i + 2]
  else:
    argv[i + 1] = value
  out = tmp_path / "x.json"
  code, _, err = _run(argv + ["--out", str(out)], capsys)
  assert code == 2
  assert message in err and "Traceback" not in err
  assert not out.exists()
