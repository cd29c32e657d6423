"""`fedmf audit` of a cyclic Poisson run (issue 25 §3): the log is checked against the declared
partitions; a complying log is credited the amplified ε (BandMF Thm 4), a violating one is
reported and falls back to the non-amplified claim, and `--strict` fails on it."""

import csv
import hashlib
import json
import shutil

import pytest

from fedmf.cli import main as cli_main
from fedmf.mf import strategies as st
from fedmf.privacy import amplification

from tests.program.test_simulate_cyclic_poisson import SETTINGS

N, P, NUM_CLIENTS, Q, SIGMA, DELTA = 9, 3, 60, 0.2, 1.5, 1e-6


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("cyclic")
  mp = pytest.MonkeyPatch()
  mp.setenv("FEDMF_CACHE_DIR", str(tmp / "cache"))
  out = tmp / "run"
  args = ["simulate", "--out", str(out), "--no-progress", "--json"]
  for item in SETTINGS:
    args += ["--set", item]
  try:
    assert cli_main.main(args) == 0
  finally:
    mp.undo()
  return out


def _expected(out):
  strategy = st.load_strategy(out / "strategy.json")
  sampling = amplification.CyclicPoissonSampling.from_probability(NUM_CLIENTS, P, Q)
  return amplification.account_amplified(strategy, N, sampling, DELTA, noise_multiplier=SIGMA)


def _audit(capsys, *args):
  code = cli_main.main(["audit", *map(str, args)])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def test_dp_accounting_gives_the_same_amplified_epsilon(run_dir):
  # BandMF Thm 4 / App. F: SelfComposed(PoissonSampled(q, Gaussian(σ/Δ)), ⌈n/P⌉), Δ = 1 for the
  # column-normalized BandMF C; accounted here with dp_accounting directly.
  from dp_accounting import dp_event, pld

  expected = _expected(run_dir)
  assert expected.max_column_norm == pytest.approx(1.0, rel=1e-9)
  accountant = pld.PLDAccountant()
  accountant.compose(
    dp_event.SelfComposedDpEvent(
      dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(SIGMA)), -(-N // P)
    )
  )
  assert expected.epsilon == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-3)


def test_simulate_and_audit_report_the_amplified_epsilon(run_dir, capsys):
  expected = _expected(run_dir).epsilon
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["audit"]["epsilon"] == pytest.approx(expected, rel=1e-12)
  assert summary["audit"]["epsilon_amplified"] is True
  assert summary["audit"]["partition_violations"] == 0
  audit_json = json.loads((run_dir / "audit.json").read_text())
  assert audit_json["epsilon"] == pytest.approx(expected, rel=1e-12)
  assert audit_json["amplification"]["complies"] is True
  assert audit_json["amplification"]["amplified"]["partitions"] == P
  assert "amplified epsilon" in (run_dir / "report.md").read_text()
  assert not any("credits no amplification" in n for n in audit_json["notes"])
  from fedmf.cli import simulate as simulate_cli

  privacy = next(x for x in simulate_cli.summary_lines(summary, str(run_dir)) if "(audit)" in x)
  assert f"epsilon {expected:.4g}" in privacy or "amplified: the log complies" in privacy
  assert "amplified: the log complies" in privacy

  code, out, err = _audit(capsys, run_dir, "--json", "--strict")
  assert code == 0, err
  result = json.loads(out)
  assert result["epsilon"] == pytest.approx(expected, rel=1e-12)
  assert result["epsilon_amplified"] is True
  assert result["amplification"]["amplified"]["sampling_probability"] == pytest.approx(Q)
  assert result["amplification"]["amplified"]["dataset_size"] == NUM_CLIENTS
  assert "AMPLIFICATION" in result["statement"]
  assert not any("credits no amplification" in n for n in result["notes"])

  code, out, _ = _audit(capsys, run_dir)
  assert code == 0
  assert f"{expected:.4g}" in out and "amplified claim: epsilon" in out


def test_a_device_outside_its_partition_is_a_violation_without_amplification(
  run_dir, tmp_path, capsys
):
  edited = tmp_path / "edited"
  shutil.copytree(run_dir, edited)
  with open(edited / "participation.csv", newline="") as f:
    reader = csv.DictReader(f)
    fields, rows = reader.fieldnames, list(reader)
  # A device's partition is the residue of its first round (the log has no assignment): move the
  # last participation of a device seen twice to the next round, another partition's.
  ids = [r["client_id"] for r in rows]
  moved = next(r for r in reversed(rows) if ids.count(r["client_id"]) >= 2)
  target = int(moved["round"]) + 1 if int(moved["round"]) + 1 < N else int(moved["round"]) - 1
  moved["round"] = str(target)
  rows.sort(key=lambda r: int(r["round"]))
  with open(edited / "participation.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
  # As if the run itself had written this log (its manifest names the log's hash; an edited file
  # would be refused as changed since the run, which tests/program/test_run_trust.py covers).
  manifest = json.loads((edited / "run.json").read_text())
  manifest["files"]["participation.csv"] = hashlib.sha256(
    (edited / "participation.csv").read_bytes()
  ).hexdigest()
  (edited / "run.json").write_text(json.dumps(manifest))
  expected = _expected(run_dir).epsilon

  code, out, _ = _audit(capsys, edited, "--json")
  assert code == 0
  result = json.loads(out)
  assert result["amplification"]["complies"] is False
  assert result["amplification"]["violating_clients"] == 1
  assert result["amplification"]["amplified"] is None
  assert result["epsilon_amplified"] is False
  assert result["epsilon"] == result["unamplified_epsilon"]
  assert result["epsilon"] >= expected
  assert "VIOLATES the declared 3-cyclic Poisson partitions" in result["statement"]
  assert any(
    f"device {moved['client_id']}" in n and f"round {target}" in n for n in result["notes"]
  )

  code, _, err = _audit(capsys, edited, "--strict")
  assert code == 1
  assert "outside their cyclic Poisson partition" in err
