"""benchmarks/token_loss_benchmark.py still runs and prints every arm (tiny sizes; its measurements
live in docs/benchmarks.md §4)."""

from tests.helpers import load_script


def test_token_loss_benchmark_tiny(capsys):
  bench = load_script("benchmarks/token_loss_benchmark.py")
  assert bench.main(["--classes", "50", "--seconds", "0.05", "--threads", "0"]) == 0
  out = capsys.readouterr().out
  for arm in ("matmuls", "softmax", "fused-forward", "fused", "token-loss"):
    assert f"  {arm} " in out
  assert "[96, 50]" in out
  assert "matmuls) " in out


def test_a_run_too_short_to_tick_the_cpu_clock_still_prints(capsys, monkeypatch):
  import os  # pylint: disable=import-outside-toplevel

  bench = load_script("benchmarks/token_loss_benchmark.py")
  frozen = os.times()
  monkeypatch.setattr(bench.os, "times", lambda: frozen)  # 0 CPU seconds for every arm
  assert bench.main(["--classes", "50", "--seconds", "0.05", "--threads", "0"]) == 0
  assert "(x-)" in capsys.readouterr().out
