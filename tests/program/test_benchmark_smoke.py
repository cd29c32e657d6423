"""The simulation benchmark still runs (tiny sizes; the measurements live in docs/benchmarks.md)."""

import importlib.util
from pathlib import Path

import pytest


@pytest.mark.slow
def test_simulation_benchmark_tiny(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path))
  path = Path(__file__).resolve().parents[2] / "benchmarks" / "simulation_benchmark.py"
  spec = importlib.util.spec_from_file_location("simulation_benchmark", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert bench.main(["--tiny"]) == 0
  out = capsys.readouterr().out
  assert "so-round" in out and "| tff-fedavg |" in out and "| bandmf |" in out
