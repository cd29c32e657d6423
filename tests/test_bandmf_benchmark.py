"""benchmarks/bandmf_benchmark.py still runs and prints both routes and both starts (tiny sizes; its measurements
live in docs/benchmarks.md, no timing is checked)."""

import json

from tests.helpers import load_script


def test_bandmf_benchmark_tiny(capsys, tmp_path):
  bench = load_script("benchmarks/bandmf_benchmark.py")
  out_file = tmp_path / "bench.json"
  args = ["--n", "40", "--bands", "8", "--repeats", "1", "--skip-cli", "--json", str(out_file)]
  assert bench.main(args) == 0
  out = capsys.readouterr().out
  assert "dense route" in out and "block recursion" in out
  result = json.loads(out_file.read_text())
  rows = result["optimize"]
  dense, blocks = rows["dense, sqrt-toeplitz start"], rows["blocks, sqrt-toeplitz start"]
  assert blocks["iterations"] == dense["iterations"]  # the same optimizer, the same path
  assert abs(blocks["loss_sq"] - dense["loss_sq"]) <= 1e-9 * dense["loss_sq"]
  # At this size the default ('auto') start is the square-root Toeplitz one: the same run again.
  assert rows["blocks, auto start"]["start_used"] == "sqrt-toeplitz"
  assert rows["blocks, auto start"]["loss_sq"] == blocks["loss_sq"]
  assert "one BLAS thread" in out
  assert result["evaluation"]["relative_gradient_difference"] < 1e-10
