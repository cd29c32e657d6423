"""The simulation benchmark still runs (tiny sizes; the measurements live in docs/benchmarks.md)."""

import pytest

from tests.helpers import load_script


@pytest.mark.slow
def test_simulation_benchmark_tiny(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path))
  bench = load_script("benchmarks/simulation_benchmark.py")
  assert bench.main(["--tiny"]) == 0
  out = capsys.readouterr().out
  assert "so-round" in out and "| tff-fedavg |" in out and "| bandmf |" in out
