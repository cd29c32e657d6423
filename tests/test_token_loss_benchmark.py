"""benchmarks/token_loss_benchmark.py still runs and prints every arm (tiny sizes; its measurements
live in docs/benchmarks.md §4)."""

import importlib.util
from pathlib import Path


def test_token_loss_benchmark_tiny(capsys):
  path = Path(__file__).resolve().parents[1] / "benchmarks" / "token_loss_benchmark.py"
  spec = importlib.util.spec_from_file_location("token_loss_benchmark", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  assert bench.main(["--classes", "50", "--seconds", "0.05", "--threads", "0"]) == 0
  out = capsys.readouterr().out
  for arm in ("matmuls", "softmax", "fused-forward", "fused", "token-loss"):
    assert f"  {arm} " in out
  assert "[96, 50]" in out
  assert "matmuls) " in out


def test_a_run_too_short_to_tick_the_cpu_clock_still_prints(capsys, monkeypatch):
  import os  # pylint: disable=import-outside-toplevel

  path = Path(__file__).resolve().parents[1] / "benchmarks" / "token_loss_benchmark.py"
  spec = importlib.util.spec_from_file_location("token_loss_benchmark", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  frozen = os.times()
  monkeypatch.setattr(bench.os, "times", lambda: frozen)  # 0 CPU seconds for every arm
  assert bench.main(["--classes", "50", "--seconds", "0.05", "--threads", "0"]) == 0
  assert "(x-)" in capsys.readouterr().out
