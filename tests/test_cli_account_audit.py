"""`fedmf account` and `fedmf audit` end to end (exit codes, JSON, one-line errors)."""

import json
import os
import subprocess
import sys

import pytest

from fedmf.privacy import participation_log
from fedmf.cli import main as cli_main

BLT400 = {
  "mechanism": "blt",
  "buf_decay": [0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778],
  "output_scale": [
    0.0070314825502323835,
    0.10613806907600574,
    0.1898159060327625,
    0.1966594748073734,
  ],
}


@pytest.fixture
def files(tmp_path):
  s = tmp_path / "blt.json"
  s.write_text(json.dumps(BLT400))
  log = tmp_path / "log.csv"
  participation_log.write_participation_log(log, [0, 0, 3, 5, 5, 9], ["a", "b", "a", "b", "b", "a"])
  return s, log


def test_account_json_and_calibrate(files, capsys):
  s, _ = files
  assert (
    cli_main.main(
      [
        "account",
        str(s),
        "--n",
        "1280",
        "--min-sep",
        "300",
        "--max-participations",
        "4",
        "--noise-multiplier",
        "7.379",
        "--delta",
        "1e-10",
        "--json",
      ]
    )
    == 0
  )
  out = json.loads(capsys.readouterr().out)
  assert round(out["epsilon"], 2) == 3.46 and 0.15 < out["rho"] <= 0.16
  assert out["sensitivity_method"] == "exact"
  assert (
    cli_main.main(
      [
        "account",
        str(s),
        "--n",
        "1280",
        "--min-sep",
        "300",
        "--max-participations",
        "4",
        "--target-epsilon",
        "3.46",
        "--delta",
        "1e-10",
        "--json",
      ]
    )
    == 0
  )
  out = json.loads(capsys.readouterr().out)
  assert out["noise_multiplier"] == pytest.approx(7.379, abs=0.01) and out["epsilon"] <= 3.46
  assert (
    cli_main.main(["account", str(s), "--n", "100", "--noise-multiplier", "5", "--delta", "1e-6"])
    == 0
  )
  assert "epsilon" in capsys.readouterr().out


def test_audit_json_and_report(files, capsys, tmp_path):
  s, log = files
  assert (
    cli_main.main(
      [
        "audit",
        str(log),
        "--strategy",
        str(s),
        "--noise-multiplier",
        "7.379",
        "--delta",
        "1e-10",
        "--min-sep",
        "4",
        "--max-participations",
        "2",
        "--json",
        "--report",
        str(tmp_path / "rep"),
      ]
    )
    == 0
  )
  cap = capsys.readouterr()
  out = json.loads(cap.out)
  assert out["observed_min_sep"] == 3 and out["declared"]["min_sep"] == 4
  assert "warning" in cap.err
  assert (tmp_path / "rep" / "report.md").exists()
  assert (
    cli_main.main(
      [
        "audit",
        str(log),
        "--strategy",
        str(s),
        "--noise-multiplier",
        "7.379",
        "--delta",
        "1e-10",
        "--rounds",
        "10",
      ]
    )
    == 0
  )
  assert "realized participation: min-sep b = 3," in capsys.readouterr().out


@pytest.mark.parametrize(
  "argv_tail,match",
  [
    (["--noise-multiplier", "-1", "--delta", "1e-6"], ">= 0"),
    (["--noise-multiplier", "nan", "--delta", "1e-6"], ">= 0"),
    (["--noise-multiplier", "1", "--delta", "1.5"], "(0, 1)"),
    (["--noise-multiplier", "1", "--delta", "0"], "(0, 1)"),
  ],
)
def test_audit_bad_values_exit_2(files, capsys, argv_tail, match):
  s, log = files
  with pytest.raises(SystemExit) as e:
    cli_main.main(["audit", str(log), "--strategy", str(s)] + argv_tail)
  assert e.value.code == 2
  assert match in capsys.readouterr().err


def test_audit_user_errors_one_line(files, capsys, tmp_path):
  s, log = files
  bad = tmp_path / "bad.json"
  bad.write_text('{"mechanism": "blt", "buf_decay": [1.5], "output_scale": [0.1]}')
  empty = tmp_path / "empty.csv"
  empty.write_text("round,client_id\n")
  horizon = tmp_path / "band.json"
  horizon.write_text(
    json.dumps({"mechanism": "bandmf", "n": 4, "bands": 1, "columns": [[1.0]] * 4})
  )
  cases = [
    ([str(tmp_path / "missing.csv"), "--strategy", str(s)], "no such participation log"),
    ([str(empty), "--strategy", str(s)], "empty log"),
    ([str(log), "--strategy", str(bad)], "buf_decay"),
    ([str(log), "--strategy", str(horizon)], "n=4"),
    ([str(log), "--strategy", str(tmp_path / "nostrategy.json")], ""),
  ]
  for args, match in cases:
    rc = cli_main.main(["audit"] + args + ["--noise-multiplier", "1", "--delta", "1e-6"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("fedmf audit: error:") and match in err[0]


def test_console_script_help():
  exe = os.path.join(os.path.dirname(sys.executable), "fedmf")
  cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "fedmf.cli.main"]
  out = subprocess.run(cmd + ["audit", "--help"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "--noise-multiplier" in out.stdout
