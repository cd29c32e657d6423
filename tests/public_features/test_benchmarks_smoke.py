"""The public-features benchmarks still run (tiny sizes; the measurements: docs/public-features.md
and docs/benchmarks.md §5)."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
  spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_results_table_runs_the_cli_and_tabulates(tmp_path, capsys):
  config = tmp_path / "tiny.yaml"
  config.write_text(
    "data: synthetic\nnum_users: 150\nnum_items: 15\nnum_people: 30\nouter_steps: 1\n"
    "item_steps: 3\ndim: 2\n"
  )
  table = _load("public_features_table")
  out = tmp_path / "table"
  args = ["--config", str(config), "--out", str(out), "--epsilons", "5,inf"]
  assert table.main([*args, "--methods", "dp-bias", "--seeds", "2"]) == 0
  text = (out / "results.md").read_text()
  assert "| dp-bias | " in text and "per-item mean (non-private)" in text and "±" in text
  assert "diverged" not in text
  assert (out / "commands.sh").read_text().count("--tune") == 2
  summary = json.loads((out / "dp-bias-eps-5" / "summary.json").read_text())
  with open(out / "dp-bias-eps-5" / "tuning.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  edges = [  # recomputed from the run's own tuning.csv
    axis
    for axis, value in summary["chosen"].items()
    if value in (min(float(r[axis]) for r in rows), max(float(r[axis]) for r in rows))
    and not (axis == "outer_steps" and value == 1)  # a floor, not an edge
  ]
  line = next(x for x in text.splitlines() if x.startswith("- dp-bias, ε = 5:"))
  assert ("at the grid's edge" in line) == bool(edges)
  assert all(f"{axis} " in line.split("at the grid's edge")[-1] for axis in edges)
  # --no-run tabulates what OUT holds: a method never run is "not run", and is not run now.
  assert table.main([*args, "--methods", "dp-bias,am-ssp", "--seeds", "2", "--no-run"]) == 0
  text = (out / "results.md").read_text()
  assert "| am-ssp | not run | not run |" in text and not (out / "am-ssp-eps-5").exists()
  capsys.readouterr()


@pytest.mark.slow
def test_the_federated_benchmark_runs(tmp_path, capsys):
  bench = _load("public_features_federated")
  args = [
    "--out",
    str(tmp_path),
    "--num-users",
    "40",
    "--clients-per-call",
    "16",
    "--outer-steps",
    "1",
  ]
  assert bench.main(args) == 0
  assert "| 16 | 3 |" in (tmp_path / "results.md").read_text()
  capsys.readouterr()
