"""The auditor's benchmarks still run and agree with the auditor (tiny sizes; the measurements live
in docs/benchmarks.md §2)."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, str(BENCHMARKS / script), "--rows", "20000", "--clients", "2000"]
    + ["--rounds", "100", *args],
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_audit_benchmark_runs_and_reports_the_audit():
  done = _run("audit_benchmark.py")
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(done.stdout.split("result: ", 1)[1].splitlines()[0])
  # 20000 rows over 100 rounds: 200 a round from a permutation of 2000 clients (a new one every 10
  # rounds), so each client joins once in every 10 rounds, 10 times, with gaps below 20: the
  # declared min-sep 150 is violated by all of them.
  assert result["rows"] == 20000 and result["clients"] == 2000 and result["k"] == 10
  assert result["violations"]["min-sep"] == 2000
  assert result["accountant"] == "analytic"
  assert "accounting and the rest" in done.stdout


def test_audit_engines_checks_each_engine_against_fedmf():
  # Only the engines installed here (polars, DuckDB and numba are not fedmf dependencies).
  done = _run("audit_engines.py")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "fedmf: import" in done.stdout and "NUMBERS DIFFER" not in done.stdout
  fedmf = json.loads(done.stdout.strip().splitlines()[-1])
  assert fedmf["rows"] == 20000 and fedmf["max_participations"] == 10 and fedmf["min_sep"] == 1
