"""The end of a participation log and its first bytes (issue 26 A.2), through `fedmf audit`.

A writer killed mid-line leaves a last line without its line end, whose client id may be a piece of
another client's: it is reported with its row number and fails `--strict`; a quote never closed is
an error naming the row. A UTF-8 byte-order mark and CRLF line ends are read as the text they
carry; a round that is not a number names its row.
"""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedmf.cli import main as cli_main
from tests.helpers import one_line_error

DPSGD = {"mechanism": "dpsgd"}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
  path = tmp_path / name
  path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
  (tmp_path / "dpsgd.json").write_text(json.dumps(DPSGD))
  return path


def _audit(capsys, log: Path, *flags: str):
  code = cli_main.main(
    ["audit", str(log), "--strategy", str(log.parent / "dpsgd.json"), "--noise-multiplier", "2"]
    + ["--delta", "1e-6", "--rounds", "10", *flags]
  )
  out, err = capsys.readouterr()
  return code, out, err


def _one_line_error(code: int, out: str, err: str, *needles: str) -> str:
  return one_line_error(code, out, err, *needles, command="audit")


@pytest.mark.parametrize("name", ["log.csv", "log.csv.gz"])
def test_an_open_quote_on_a_cut_off_last_line_is_an_error_naming_the_row(tmp_path, capsys, name):
  log = _write(tmp_path, name, b'round,client_id\n0,a\n1,b\n3,"cli')
  code, out, err = _audit(capsys, log)
  _one_line_error(code, out, err, name, "row 3", "unterminated quote")


def test_a_quote_never_closed_that_swallows_the_lines_after_it_is_an_error(tmp_path, capsys):
  # Without the check, rows 2 and 3 would become part of row 1's client id, silently.
  log = _write(tmp_path, "log.csv", b'round,client_id\n0,"a\n1,b\n2,c\n')
  code, out, err = _audit(capsys, log)
  _one_line_error(code, out, err, "row 1", "unterminated quote")


@pytest.mark.parametrize("name", ["log.csv", "log.csv.gz"])
def test_a_last_line_without_its_line_end_is_reported_and_fails_strict(tmp_path, capsys, name):
  log = _write(tmp_path, name, b"round,client_id\n0,a\n1,b\n3,cli")
  code, out, err = _audit(capsys, log, "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["cut_off_row"] == 3
  assert result["log_rows"] == 3  # The row is read as it is...
  assert result["claim_covers_all_clients"] is False  # ...but the claim may not cover its client.
  assert any("row 3" in w and "no line end" in w for w in result["warnings"])
  assert not result["strict"]["passed"]
  code, out, err = _audit(capsys, log, "--strict")
  assert code == 1
  assert "strict: FAILED" in err and "row 3" in err and "cut off" in err
  assert "row 3" in out  # The text summary says it too (as a warning).


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
def test_a_log_whose_last_line_is_complete_passes_strict(tmp_path, capsys, ending):
  log = _write(tmp_path, "log.csv", ending.join([b"round,client_id", b"0,a", b"3,b"]) + ending)
  code, out, err = _audit(capsys, log, "--strict", "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["cut_off_row"] is None and result["claim_covers_all_clients"] is True
  assert "strict: passed" in err


@pytest.mark.parametrize("name", ["log.csv", "log.csv.gz"])
def test_a_byte_order_mark_and_crlf_line_ends_are_read_as_the_text(tmp_path, capsys, name):
  log = _write(tmp_path, name, b"\xef\xbb\xbfround,client_id\r\n0,a\r\n3,b\r\n3,a\r\n")
  code, out, err = _audit(capsys, log, "--json", "--strict")
  assert code == 0, err
  result = json.loads(out)
  # a in rounds 0 and 3, b in 3: ids without a stray '\r', so a joined twice with gap 3.
  assert result["clients"] == 2 and result["log_rows"] == 3
  assert result["observed_min_sep"] == 3 and result["observed_max_participations"] == 2


@pytest.mark.parametrize("name", ["log.csv", "log.csv.gz"])
def test_a_round_that_is_not_a_number_names_its_row(tmp_path, capsys, name):
  log = _write(tmp_path, name, b"round,client_id\n0,a\n1,b\nx,c\n")
  code, out, err = _audit(capsys, log)
  line = _one_line_error(code, out, err, name, "row 3", "'x'", "not an integer")
  assert "conversion error" not in line


def test_a_round_that_is_not_a_number_after_a_fractional_one_names_the_first(tmp_path, capsys):
  # The float re-read ("1.5") comes first: it is named, as the first bad row.
  log = _write(tmp_path, "log.csv", b"round,client_id\n0,a\n1.5,b\nx,c\n")
  code, out, err = _audit(capsys, log)
  _one_line_error(code, out, err, "row 2")


def test_the_command_line_exit_codes_end_to_end(tmp_path):
  """As a user runs it: the installed interpreter, a new process, exit codes 2, 1 and 0."""
  cut = _write(tmp_path, "cut.csv", b'round,client_id\n0,a\n3,"cli')
  open_line = _write(tmp_path, "open.csv", b"round,client_id\n0,a\n3,cli")
  bom = _write(tmp_path, "bom.csv", b"\xef\xbb\xbfround,client_id\r\n0,a\r\n3,b\r\n")
  common = ["--strategy", str(tmp_path / "dpsgd.json"), "--noise-multiplier", "2"]
  common += ["--delta", "1e-6", "--rounds", "10", "--strict"]

  def run(log):
    return subprocess.run(
      [sys.executable, "-m", "fedmf.cli.main", "audit", str(log), *common],
      capture_output=True,
      text=True,
      timeout=120,
    )

  done = run(cut)
  assert done.returncode == 2 and "row 2: unterminated quote" in done.stderr
  assert "Traceback" not in done.stderr
  done = run(open_line)
  assert done.returncode == 1 and "row 2" in done.stderr
  done = run(bom)
  assert done.returncode == 0, done.stderr


def test_a_byte_order_mark_before_a_jsonl_log_is_accepted(tmp_path, capsys):
  log = _write(
    tmp_path,
    "log.jsonl",
    b'\xef\xbb\xbf{"round": 0, "client_id": "a"}\r\n{"round": 4, "client_id": "a"}\r\n',
  )
  code, out, err = _audit(capsys, log, "--json")
  assert code == 0, err
  result = json.loads(out)
  assert result["clients"] == 1 and result["observed_min_sep"] == 4
