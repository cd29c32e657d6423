"""`fedmf strategy optimize|evaluate`: JSON contract, readable output and one-line errors."""

import json

import numpy as np
import pytest

from fedmf.cli import main as cli
from fedmf.mf import evaluation
from fedmf.mf import strategies as st
from tests.helpers import run_cli

PARTICIPATION = ["--n", "24", "--min-sep", "4", "--max-participations", "3"]
REQUIRED_KEYS = {
  "sensitivity",
  "sensitivity_method",
  "max_error",
  "rms_error",
  "max_loss",
  "rms_loss",
  "n",
  "min_sep",
  "max_participations",
  "effective_max_participations",
}


@pytest.mark.parametrize(
  "mechanism, extra",
  [
    ("dpsgd", []),
    ("tree", ["--tree-variant", "vanilla"]),
    ("blt", ["--buffers", "2"]),
    ("band-toeplitz", ["--bands", "4"]),
    ("bandmf", ["--bands", "4", "--max-iter", "30"]),
  ],
)
def test_optimize_then_evaluate(tmp_path, capsys, mechanism, extra):
  out_file = tmp_path / f"{mechanism}.json"
  code, out, err = run_cli(
    capsys,
    *[
      "strategy",
      "optimize",
      "--mechanism",
      mechanism,
      *PARTICIPATION,
      *extra,
      "--out",
      str(out_file),
      "--json",
      "--no-progress",
    ],
  )
  assert code == 0, err
  optimized = json.loads(out)
  saved = json.loads(out_file.read_text())
  assert saved["mechanism"] == mechanism
  assert saved["optimized_for"]["n"] == 24
  code, out, err = run_cli(
    capsys, *["strategy", "evaluate", str(out_file), *PARTICIPATION, "--json"]
  )
  assert code == 0, err
  result = json.loads(out)
  assert REQUIRED_KEYS <= result.keys()
  assert result["max_participations"] == 3 and result["effective_max_participations"] == 3
  assert result["sensitivity_method"] in ("exact", "upper-bound")
  # The CLI reports what the library computes from the same file.
  direct = evaluation.evaluate(st.load_strategy(out_file), 24, 4, 3)
  assert result["rms_loss"] == pytest.approx(direct.rms_loss)
  assert optimized["max_loss"] == pytest.approx(direct.max_loss)
  if mechanism in ("blt", "band-toeplitz", "bandmf"):
    # Optimized correlated noise beats independent noise on prefix sums.
    dpsgd = evaluation.evaluate(st.DpSgd(), 24, 4, 3)
    key = "max_loss" if mechanism == "blt" else "rms_loss"
    assert result[key] < getattr(dpsgd, key)


def test_evaluate_prints_a_readable_table(tmp_path, capsys):
  path = tmp_path / "s.json"
  path.write_text(
    json.dumps({"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]})
  )
  code, out, _ = run_cli(
    capsys, *["strategy", "evaluate", str(path), *PARTICIPATION, "--noise-multiplier", "2"]
  )
  assert code == 0
  assert "sensitivity" in out and "exact" in out and "rmse @ noise multiplier" in out


def test_lower_bound_is_labelled(tmp_path, capsys):
  path = tmp_path / "s.json"
  path.write_text(json.dumps({"mechanism": "tree", "variant": "vanilla"}))
  code, out, _ = run_cli(
    capsys,
    *["strategy", "evaluate", str(path), *PARTICIPATION, "--sensitivity", "lower-bound", "--json"],
  )
  assert code == 0
  assert json.loads(out)["sensitivity_method"] == "lower-bound"


@pytest.mark.parametrize(
  "content, needle",
  [
    (None, "not found"),
    ("{", "not valid JSON"),
    (json.dumps({"mechanism": "blt", "buf_decay": [1.5], "output_scale": [0.1]}), "buf_decay"),
    (
      json.dumps({"mechanism": "bandmf", "n": 3, "bands": 1, "columns": [[1], [1], [1]]}),
      "built for n=3",
    ),
  ],
)
def test_bad_strategy_files_give_one_line_errors(tmp_path, capsys, content, needle):
  path = tmp_path / "bad.json"
  if content is not None:
    path.write_text(content)
  code, out, err = run_cli(capsys, *["strategy", "evaluate", str(path), *PARTICIPATION])
  assert code == 2
  assert out == ""
  lines = err.strip().splitlines()
  assert len(lines) == 1 and needle in lines[0], err
  assert "Traceback" not in err


def test_bad_numbers_are_usage_errors(capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(
      ["strategy", "evaluate", "x.json", "--n", "-3", "--min-sep", "1", "--max-participations", "1"]
    )
  assert e.value.code == 2
  assert "positive integer" in capsys.readouterr().err


def test_optimize_refuses_missing_output_directory(tmp_path, capsys):
  code, _, err = run_cli(
    capsys,
    *[
      "strategy",
      "optimize",
      "--mechanism",
      "dpsgd",
      *PARTICIPATION,
      "--out",
      str(tmp_path / "nope" / "s.json"),
    ],
  )
  assert code == 2 and "does not exist" in err


@pytest.mark.parametrize("mechanism", ["blt", "band-toeplitz", "bandmf"])
def test_max_iter_reaches_every_optimizer(tmp_path, capsys, mechanism):
  code, _, err = run_cli(
    capsys,
    *[
      "strategy",
      "optimize",
      "--mechanism",
      mechanism,
      *PARTICIPATION,
      "--buffers",
      "1",
      "--max-iter",
      "3",
      "--out",
      str(tmp_path / "s.json"),
      "--no-progress",
    ],
  )
  assert code == 0, err
