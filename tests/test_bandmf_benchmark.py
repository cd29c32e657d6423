"""benchmarks/bandmf_benchmark.py still runs and prints both routes (tiny sizes; its measurements
live in docs/benchmarks.md, no timing is checked)."""

import importlib.util
import json
from pathlib import Path


def test_bandmf_benchmark_tiny(capsys, tmp_path):
  path = Path(__file__).resolve().parents[1] / "benchmarks" / "bandmf_benchmark.py"
  spec = importlib.util.spec_from_file_location("bandmf_benchmark", path)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  out_file = tmp_path / "bench.json"
  args = ["--n", "40", "--bands", "8", "--repeats", "1", "--skip-cli", "--json", str(out_file)]
  assert bench.main(args) == 0
  out = capsys.readouterr().out
  assert "dense route" in out and "block recursion" in out
  result = json.loads(out_file.read_text())
  dense, blocks = result["optimize"]["dense"], result["optimize"]["blocks"]
  assert blocks["iterations"] == dense["iterations"]  # the same optimizer, the same path
  assert abs(blocks["loss_sq"] - dense["loss_sq"]) <= 1e-9 * dense["loss_sq"]
  assert result["evaluation"]["relative_gradient_difference"] < 1e-10
