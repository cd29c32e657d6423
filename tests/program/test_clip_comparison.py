"""simulations/clip_comparison.py reads compare_mechanisms.py's results.json (format 2) and the
adaptive runs' metrics.csv: the table's numbers, worked out by hand here."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.helpers import load_script


def _script():
  return load_script("simulations/clip_comparison.py")


def _run(arm, seed, accuracy, finished=True, label="default"):
  return {
    "label": label,
    "arm": arm,
    "seed": seed,
    "finished": finished,
    "final_accuracy": accuracy if finished else None,
    "end_accuracy": accuracy - 0.01 if finished else None,
    "noise_multiplier": 1.13,
    "audited_epsilon": 7.999,
  }


def _out(tmp_path: Path, name: str, runs: list[dict]) -> Path:
  out = tmp_path / name
  out.mkdir()
  (out / "results.json").write_text(json.dumps({"format": 2, "runs": runs}))
  return out


def _metrics(run_dir: Path, rows: list[tuple[int, int, int, float, float]]) -> None:
  """rows: (clients, clipped, zeroed, clip_norm, unclipped_fraction) per round."""
  run_dir.mkdir(parents=True)
  with open(run_dir / "metrics.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["round", "clients", "clipped", "zeroed", "clip_norm", "unclipped_fraction"])
    for i, row in enumerate(rows):
      writer.writerow([i, *row])


def test_table_from_two_arms(tmp_path, capsys):
  fixed = _out(
    tmp_path, "fixed", [_run("dpsgd", 0, 0.20), _run("dpsgd", 1, 0.30), _run("blt", 0, 0.1, False)]
  )
  for seed in (0, 1):  # A fixed clip's metrics.csv has no clip_norm column.
    run_dir = fixed / "runs" / "default" / f"dpsgd-seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.csv").write_text("round,clients,clipped,zeroed\n0,20,3,0\n")
  adaptive = _out(tmp_path, "adaptive", [_run("dpsgd", 0, 0.25)])
  # Four rounds: the last half is rounds 2 and 3.
  _metrics(
    adaptive / "runs" / "default" / "dpsgd-seed0",
    [(20, 20, 0, 0.1, 0.0), (20, 20, 0, 0.2, 0.0), (20, 10, 0, 0.4, 0.45), (20, 8, 2, 0.6, 0.55)],
  )
  assert _script().main([f"ζ = 1={fixed}", f"adaptive={adaptive}"]) == 0
  out = capsys.readouterr().out
  # mean 0.25, sample std of (0.2, 0.3) = 0.0707; within ζ_t: 10/20 and 10/20; released 0.5;
  # median ζ of (0.4, 0.6) = 0.5. The unfinished BLT run is left out.
  assert "| dpsgd | 0.2500 ± 0.0707 (seeds 0,1) | 0.2500 (seeds 0) | 0.5 | 0.500 / 0.500 |" in out
  assert "blt" not in out.split("\n\n")[0]
  assert _script().main([f"ζ = 1={fixed}", f"adaptive={adaptive}", "--accuracy", "end"]) == 0
  assert "| dpsgd | 0.2400 ± 0.0707 (seeds 0,1) | 0.2400 (seeds 0) |" in capsys.readouterr().out


def test_missing_results_and_mixed_labels_are_one_line_errors(tmp_path):
  with pytest.raises(SystemExit, match="results.json is missing .*--collect-only"):
    _script().main([f"x={tmp_path}"])
  mixed = _out(tmp_path, "mixed", [_run("dpsgd", 0, 0.2), _run("dpsgd", 0, 0.2, label="noisier")])
  with pytest.raises(SystemExit, match=r"holds labels \['default', 'noisier'\]: pick one"):
    _script().main([f"x={mixed}"])
