"""Malformed and hostile participation logs (issue 14): one line naming the file and the problem,
before any per-round work, and no temporary file left behind by the writer, SIGTERM included."""

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedmf.cli import main as cli_main
from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.privacy import audit, participation_log
from tests.helpers import one_line_error

ROOT = Path(__file__).resolve().parents[2]
DPSGD = {"mechanism": "dpsgd"}


def _audit_cli(capsys, log, *flags):
  code = cli_main.main(
    ["audit", str(log), "--strategy", str(_strategy(log)), "--noise-multiplier", "1"]
    + ["--delta", "1e-6", *flags]
  )
  out, err = capsys.readouterr()
  return code, out, err


def _strategy(log) -> Path:
  path = Path(log).parent / "dpsgd.json"
  path.write_text(json.dumps(DPSGD))
  return path


def _one_line_error(code, out, err, *needles):
  return one_line_error(code, out, err, *needles, command="audit")


@pytest.mark.parametrize("name", ["log.jsonl.gz", "log.csv.gz"])
def test_a_truncated_gzip_log_is_one_line(tmp_path, capsys, name):
  header = b"round,client_id\n" if name.startswith("log.csv") else b""
  row = (
    (lambda i: b"%d,c%d\n" % (i, i % 7))
    if header
    else (lambda i: b'{"round": %d, "client_id": "c%d"}\n' % (i, i % 7))
  )
  data = gzip.compress(header + b"".join(row(i) for i in range(5000)))
  (tmp_path / name).write_bytes(data[: len(data) // 2])
  code, out, err = _audit_cli(capsys, tmp_path / name)
  _one_line_error(code, out, err, name)


def test_true_false_ids_are_refused_not_read_as_text(tmp_path, capsys):
  log = tmp_path / "log.jsonl"
  log.write_text('{"round": 0, "client_id": true}\n{"round": 1, "client_id": false}\n')
  _one_line_error(*_audit_cli(capsys, log), "client_id", "true/false")
  mixed = tmp_path / "mixed.jsonl"  # mixed types take the line parser: it names the line
  mixed.write_text('{"round": 0, "client_id": "a"}\n{"round": 1, "client_id": true}\n')
  _one_line_error(*_audit_cli(capsys, mixed), "line 2", "client_id")
  floats = tmp_path / "floats.jsonl"
  floats.write_text('{"round": 0, "client_id": 1.5}\n')
  _one_line_error(*_audit_cli(capsys, floats), "client_id")


def test_integer_ids_beyond_int64_are_read_exactly_as_strings(tmp_path):
  big = 123456789012345678901234567890
  log = tmp_path / "log.jsonl"
  log.write_text(
    "".join(
      json.dumps({"round": r, "client_id": c}) + "\n"
      for r, c in [(0, big), (1, big + 1), (5, big), (6, 7)]
    )
  )
  table = participation_log.read_participation_log(log)
  assert table.column("client_id").to_pylist() == [str(big), str(big + 1), str(big), "7"]
  result = audit.audit_log(log, DPSGD, 1.0, 1e-6, progress=False)
  # big and big + 1 are two clients (a double would have merged them): b is 5, not 1.
  assert result.stats.clients == 3 and result.stats.observed_min_sep == 5


@pytest.mark.parametrize("text", ["99999999999999999999", "1e20", "-99999999999999999999"])
def test_a_round_beyond_2_53_is_out_of_range_not_negative(tmp_path, capsys, text):
  log = tmp_path / "log.csv"
  log.write_text(f"round,client_id\n0,a\n{text},a\n")
  code, out, err = _audit_cli(capsys, log)
  _one_line_error(code, out, err, "row 2", "out of range")
  assert "-9223372036854775808" not in err


def test_a_round_of_a_trillion_is_refused_with_the_estimate_before_allocating(tmp_path, capsys):
  log = tmp_path / "log.csv"
  log.write_text("round,client_id\n0,a\n1000000000000,a\n")
  start = time.perf_counter()
  code, out, err = _audit_cli(capsys, log)
  _one_line_error(code, out, err, "1,000,000,000,000", "TiB", "--max-memory")
  assert time.perf_counter() - start < 10
  # The same log in JSONL, out of round order: the sorted path checks too.
  shuffled = tmp_path / "log.jsonl"
  shuffled.write_text(
    '{"round": 1000000000000, "client_id": "a"}\n{"round": 0, "client_id": "a"}\n'
  )
  _one_line_error(*_audit_cli(capsys, shuffled), "--max-memory")


def test_a_round_within_the_limit_but_beyond_the_scan_is_audited(tmp_path):
  log = tmp_path / "log.csv"  # 2^22 + 5 rounds: the sorted path, about 200 MB of per-round arrays
  log.write_text("round,client_id\n0,a\n4194309,a\n")
  result = audit.audit_log(log, DPSGD, 1.0, 1e-6, curve=False)
  assert result.stats.observed_min_sep == 4194309 and result.rounds == 4194310


def test_rounds_1e9_with_a_report_is_refused_before_reading(tmp_path, capsys):
  log = tmp_path / "log.csv"
  log.write_text("round,client_id\n0,a\n3,a\n")
  start = time.perf_counter()
  code, out, err = _audit_cli(
    capsys, log, "--rounds", "1000000000", "--report", str(tmp_path / "r")
  )
  _one_line_error(code, out, err, "epsilon curve", "1,000,000,000 rounds")
  assert time.perf_counter() - start < 10
  assert not (tmp_path / "r").exists()
  # Without the curve nothing is allocated per round: the audit runs.
  code, out, _ = _audit_cli(capsys, log, "--rounds", "1000000000")
  assert code == 0 and "rounds released n: 1000000000 (given)" in out


def test_the_curve_estimate_is_checked_against_the_limits():
  with resources.limits(max_memory_bytes=1e6):
    with pytest.raises(resources.ResourceLimitError, match="epsilon curve"):
      audit._check_curve(100_000)  # pylint: disable=protected-access
  audit._check_curve(100_000)  # pylint: disable=protected-access  (16 MB: within the default)


def test_a_directory_is_a_directory(tmp_path, capsys):
  (tmp_path / "logs.csv").mkdir()
  with pytest.raises(FedmfUserError, match="is a directory"):
    participation_log.read_participation_log(tmp_path / "logs.csv")
  code, out, err = _audit_cli(capsys, tmp_path / "logs.csv")
  _one_line_error(code, out, err, "directory without a participation log")


_WRITER = textwrap.dedent(
  """
  import sys, time
  from fedmf.privacy.participation_log import ParticipationLogWriter
  if sys.argv[1] == "with":
    with ParticipationLogWriter(sys.argv[2]) as w:
      w.write_round(0, ["a", "b"]); w.flush()
      print("ready", flush=True)
      time.sleep(60)
  else:  # A writer that is never closed: the SIGTERM handler still removes its file.
    w = ParticipationLogWriter(sys.argv[2])
    w.write_round(0, ["a", "b"]); w.flush()
    print("ready", flush=True)
    time.sleep(60)
  """
)


@pytest.mark.parametrize("style", ["with", "open"])
@pytest.mark.parametrize("name", ["participation.csv", "participation.jsonl.gz"])
def test_sigterm_leaves_no_partial_log(tmp_path, style, name):
  proc = subprocess.Popen(
    [sys.executable, "-c", _WRITER, style, str(tmp_path / name)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=dict(os.environ, PYTHONPATH=str(ROOT)),
  )
  try:
    assert proc.stdout.readline().strip() == "ready"
    assert any(p.name.startswith(f".{name}.partial-") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == -signal.SIGTERM  # the default action, after the cleanup
  assert "Traceback" not in proc.stderr.read()
  assert list(tmp_path.iterdir()) == []


def test_the_writer_restores_the_default_sigterm_action():
  before = signal.getsignal(signal.SIGTERM)
  import tempfile  # pylint: disable=import-outside-toplevel

  with tempfile.TemporaryDirectory() as tmp:
    with participation_log.ParticipationLogWriter(Path(tmp) / "p.csv") as w:
      w.write_round(0, ["a"])
      if before is signal.SIG_DFL:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert sorted(os.listdir(tmp)) == ["p.csv"]
  assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("name", ["log.csv", "log.csv.gz"])
def test_a_10_mb_line_names_its_row_in_fedmf_words(tmp_path, capsys, name):
  """Issue 38 item 15: pyarrow's 'straddling object straddles two block boundaries (try to
  increase block size?)' named neither the row nor what is wrong."""
  text = b"round,client_id\n0,a\n1,b\n2," + b"x" * (10 * 2**20) + b"\n3,c\n"
  (tmp_path / name).write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
  code, out, err = _audit_cli(capsys, tmp_path / name, "--rounds", "4", "--no-progress")
  _one_line_error(code, out, err, name, "row 3 (line 4) is 10.0 MiB long", "participation log?")
  assert "straddl" not in err
