"""Splits, the synthetic data, and `fedmf public-features` end to end (readers: test_movielens.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.public_features import data
from fedmf.public_features import evaluation
from tests.public_features import movielens_files as files


def write_ml10m(directory, rng):
  return files.write("movielens-10m", directory, files.random_rows(rng))


def write_ml20m(directory, rng):
  return files.write("movielens-20m", directory, files.random_rows(rng))


def test_heldout_user_split_trains_on_the_top_items_only():
  rng = np.random.default_rng(1)
  ratings, features = data.synthetic_ratings(data.SyntheticSpec(num_users=300, num_items=50), rng)
  ds = data.heldout_user_split("x", ratings, features, 300, 0.2, rng, 0.0)
  counts = np.bincount(ratings.items, minlength=50)
  top = set(np.argsort(-counts, kind="stable")[:5].tolist())
  assert set(np.unique(ds.train.items).tolist()) <= top
  heldout = set(np.unique(ds.test.users).tolist()) | set(np.unique(ds.history.users).tolist())
  assert not heldout & set(np.unique(ds.train.users).tolist())
  assert len(ds.history) + len(ds.test) == np.isin(ratings.users, list(heldout)).sum()
  assert 0.7 < len(ds.history) / (len(ds.history) + len(ds.test)) < 0.9


def test_recall_at_k_against_a_hand_computed_case():
  users = np.eye(2)
  items = np.array([[3.0, 0], [2.0, 0], [1.0, 0], [0, 5.0]])
  history = data.Ratings(np.array([0]), np.array([0]), np.array([5.0]))
  target = data.Ratings(np.array([0, 0, 1]), np.array([1, 3, 3]), np.array([5.0, 5.0, 5.0]))
  # User 0: history item 0 excluded; top-2 of {1, 2, 3} by score is {1, 2}: 1 hit of min(2, 2).
  # User 1: top-2 contains item 3: 1 hit of min(2, 1). Mean (0.5 + 1) / 2.
  assert evaluation.recall_at_k(users, items, history, target, 0.0, k=2) == pytest.approx(0.75)


def _run(argv, capsys):
  code = cli_main.main(argv)
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize("fmt", ["movielens-10m", "movielens-20m"])
def test_movielens_runs_end_to_end(tmp_path, capsys, fmt):
  writer = write_ml10m if fmt == "movielens-10m" else write_ml20m
  directory = writer(tmp_path / "data", np.random.default_rng(2))
  code, out, err = _run(
    [
      "public-features",
      "--set",
      f"data={fmt}",
      "--set",
      "outer_steps=2",
      "--set",
      "item_steps=5",
      "--set",
      "heldout_users=0.3",
      "--data-dir",
      str(directory),
      "--out",
      str(tmp_path / "out"),
    ],
    capsys,
  )
  assert code == 0, err
  summary = json.loads((tmp_path / "out" / "summary.json").read_text())
  key = "test_rmse" if fmt == "movielens-10m" else "test_recall_at_20"
  assert np.isfinite(summary[key]) and summary["algorithm"] == "am-ssp"
  assert summary["privacy"]["epsilon_spent"]["analytic"] == pytest.approx(5.0, rel=1e-6)
  assert (tmp_path / "out" / "metrics.csv").read_text().count("\n") == 3
  assert "outer step 2/2" in err


def test_synthetic_summary_has_the_contract_keys(tmp_path, capsys):
  code, _, err = _run(
    [
      "public-features",
      "--set",
      "num_users=300",
      "--set",
      "num_items=30",
      "--set",
      "num_people=100",
      "--set",
      "algorithm=dp-als",
      "--set",
      "epsilon=2",
      "--out",
      str(tmp_path),
    ],
    capsys,
  )
  assert code == 0, err
  summary = json.loads((tmp_path / "summary.json").read_text())
  for key in ("algorithm", "epsilon", "delta", "train_seconds", "test_rmse", "test_recall_at_20"):
    assert key in summary
  assert summary["algorithm"] == "dp-als" and summary["epsilon"] == 2.0


@pytest.mark.parametrize(
  "args, message",
  [
    (["--set", "epsilon=0"], "epsilon must be a finite number > 0"),
    (["--set", "epsilon=-1"], "epsilon must be"),
    (["--set", "colour=red"], "unknown config key 'colour'"),
    (["--set", "algorithm=sgd"], "algorithm must be one of"),
    (["--set", "data=movielens-10m"], "needs a data directory"),
    (["--set", "dim=two"], "dim must be an integer"),
    (["--set", "federated=true", "--set", "algorithm=am-dpsgd"], "federated runs am-ssp or dp-als"),
  ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, args, message):
  code, out, err = _run(["public-features", *args, "--out", str(tmp_path / "o")], capsys)
  assert code == 2
  assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
  assert not (tmp_path / "o" / "summary.json").exists()


def test_malformed_data_file_is_exit_2(tmp_path, capsys):
  directory = write_ml10m(tmp_path / "d", np.random.default_rng(0))
  (directory / "ratings.dat").write_text("1::1::five::0\n")
  code, _, err = _run(
    [
      "public-features",
      "--set",
      "data=movielens-10m",
      "--data-dir",
      str(directory),
      "--out",
      str(tmp_path / "o"),
    ],
    capsys,
  )
  assert (
    code == 2
    and "ratings.dat:1: rating 'five' is not a number" in err
    and len(err.strip().splitlines()) == 1
  )


def test_help_does_not_import_the_work():
  code = (
    "import sys\nfrom fedmf.cli import main\n"
    "main.build_parser()\n"
    "print(any(m.startswith('fedmf.public_features.') and m != 'fedmf.public_features.cli'"
    " for m in sys.modules), 'numpy' in sys.modules and 'fedmf.public_features.driver' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False", "False"]
