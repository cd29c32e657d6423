"""The public-features benchmarks still run (tiny sizes; the measurements: docs/public-features.md
and docs/benchmarks.md §5)."""

import csv
import json

import pytest

from tests.helpers import load_script


def _load(name):
  return load_script(f"benchmarks/{name}.py")


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


def test_the_table_tunes_am_dpsgd_over_its_word_axis_and_says_when_a_cell_failed(tmp_path, capsys):
  """AM-DPSGD's real grid has a word axis (dpsgd_optimizer: adam): the tuning log and the table's
  edge names handle it. A cell the CLI refuses makes the script exit 1 and shows in the table."""
  config = tmp_path / "tiny.yaml"
  config.write_text(
    "data: synthetic\nnum_users: 150\nnum_items: 15\nnum_people: 30\nouter_steps: 1\n"
    "dpsgd_steps: 2\ndim: 2\n"
  )
  table = _load("public_features_table")
  out = tmp_path / "table"
  args = ["--config", str(config), "--out", str(out), "--seeds", "1", "--methods", "am-dpsgd"]
  assert table.main([*args, "--epsilons", "5"]) == 0
  summary = json.loads((out / "am-dpsgd-eps-5" / "summary.json").read_text())
  assert summary["chosen"]["dpsgd_optimizer"] == "adam"
  assert summary["hyperparameters"]["dpsgd_optimizer"] == "adam"
  line = next(x for x in (out / "results.md").read_text().splitlines() if "am-dpsgd, ε = 5" in x)
  assert line.count("dpsgd_optimizer") == 1  # in the choice, not named as an edge: no order
  config.write_text(config.read_text() + "federated: true\n")  # am-dpsgd is not federated: refused
  assert table.main([*args, "--epsilons", "1"]) == 1
  assert "| am-dpsgd | not run |" in (out / "results.md").read_text()
  assert "failed: am-dpsgd ε = 1" in capsys.readouterr().err


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
