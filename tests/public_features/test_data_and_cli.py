"""Splits, the baselines, and `fedmf public-features` end to end (readers: test_movielens.py; bad
input and the run directory: test_cli_robustness.py)."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.public_features import baselines
from fedmf.public_features import data
from fedmf.public_features import evaluation
from tests.public_features import movielens_files as files


def test_random_split_is_three_disjoint_parts_of_the_given_sizes():
  rng = np.random.default_rng(0)
  ratings, features = data.synthetic_ratings(data.SyntheticSpec(num_users=400, num_items=40), rng)
  ds = data.random_split("synthetic", ratings, features, 400, 0.15, 0.1, rng, 0.0)
  parts = (ds.train, ds.validation.target, ds.test.target)
  assert sum(len(p) for p in parts) == len(ratings)
  keys = [set(zip(p.users.tolist(), p.items.tolist())) for p in parts]
  assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
  assert len(ds.validation.target) / len(ratings) == pytest.approx(0.15, abs=0.02)
  assert len(ds.test.target) / len(ratings) == pytest.approx(0.1, abs=0.02)


def test_heldout_user_split_trains_on_the_top_items_only():
  rng = np.random.default_rng(1)
  ratings, features = data.synthetic_ratings(data.SyntheticSpec(num_users=300, num_items=50), rng)
  ds = data.heldout_user_split("x", ratings, features, 300, 0.2, rng, 0.0)
  counts = np.bincount(ratings.items, minlength=50)
  top = set(np.argsort(-counts, kind="stable")[:5].tolist())
  assert set(np.unique(ds.train.items).tolist()) <= top
  test_users = set(np.unique(np.concatenate([ds.test.target.users, ds.test.history.users])))
  validation_users = set(
    np.unique(np.concatenate([ds.validation.target.users, ds.validation.history.users]))
  )
  assert not test_users & validation_users
  assert not (test_users | validation_users) & set(np.unique(ds.train.users).tolist())
  held = ds.test.history, ds.test.target
  assert 0.7 < len(held[0]) / (len(held[0]) + len(held[1])) < 0.9


def test_recall_at_k_against_a_hand_computed_case():
  scores = np.array([[3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
  history = data.Ratings(np.array([0]), np.array([0]), np.array([5.0]))
  target = data.Ratings(np.array([0, 0, 1]), np.array([1, 3, 3]), np.array([5.0, 5.0, 5.0]))
  # User 0: history item 0 excluded; top-2 of {1, 2, 3} by score is {1, 2}: 1 hit of min(2, 2).
  # User 1: top-2 contains item 3: 1 hit of min(2, 1). Mean (0.5 + 1) / 2.
  users = np.array([0, 1])
  assert evaluation.recall_at_k(scores, users, history, target, 0.0, k=2) == pytest.approx(0.75)


def test_the_trivial_baselines_against_direct_computation():
  rng = np.random.default_rng(2)
  ratings, features = data.synthetic_ratings(data.SyntheticSpec(num_users=200, num_items=30), rng)
  ds = data.random_split("synthetic", ratings, features, 200, 0.1, 0.1, rng, 0.0)
  test = ds.test.target
  mean = ds.train.values.mean()
  expected = math.sqrt(np.mean((test.values - mean) ** 2))
  assert baselines.global_mean(ds)["test_rmse"] == pytest.approx(expected, rel=1e-12)
  item_means = {
    j: ds.train.values[ds.train.items == j].mean() for j in np.unique(ds.train.items).tolist()
  }
  predicted = np.array([item_means.get(j, mean) for j in test.items.tolist()])
  expected = math.sqrt(np.mean((test.values - predicted) ** 2))
  assert baselines.item_mean(ds)["test_rmse"] == pytest.approx(expected, rel=1e-12)


def _run(argv, capsys):
  code = cli_main.main(argv)
  out, err = capsys.readouterr()
  return code, out, err


SMALL = ["--set", "outer_steps=2", "--set", "item_steps=5", "--set", "heldout_users=0.2"]


@pytest.mark.parametrize("layout", files.LAYOUTS)
def test_movielens_runs_end_to_end(tmp_path, capsys, layout):
  directory = files.write(layout, tmp_path / "data", files.random_rows(np.random.default_rng(2)))
  out = tmp_path / "out"
  argv = ["public-features", "--set", f"data={layout}", *SMALL, "--data-dir", str(directory)]
  code, stdout, err = _run([*argv, "--out", str(out)], capsys)
  assert code == 0, err
  summary = json.loads((out / "summary.json").read_text())
  key = "test_recall_at_20" if layout == "movielens-20m" else "test_rmse"
  assert np.isfinite(summary[key]) and summary["algorithm"] == "am-ssp"
  assert json.loads(stdout)["run_id"] == json.loads((out / "run.json").read_text())["run_id"]
  assert summary["privacy"]["epsilon_spent"]["analytic"] == pytest.approx(5.0, rel=1e-6)
  assert set(summary["baselines"]) == {"global_mean", "item_mean", "dp_bias"}
  assert (out / "metrics.csv").read_text().count("\n") == 3
  assert "outer step 2/2" in err


def test_synthetic_summary_has_the_contract_keys(tmp_path, capsys):
  argv = ["public-features", "--set", "num_users=300", "--set", "num_items=30"]
  argv += ["--set", "num_people=100", "--set", "algorithm=dp-als", "--set", "epsilon=2"]
  code, _, err = _run([*argv, "--set", "seeds=2", "--out", str(tmp_path / "o")], capsys)
  assert code == 0, err
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  for key in ("algorithm", "epsilon", "delta", "train_seconds", "test_rmse", "test_recall_at_20"):
    assert key in summary
  assert summary["algorithm"] == "dp-als" and summary["epsilon"] == 2.0
  assert "test_rmse_std" in summary and summary["seeds"] == 2  # two seeds: a mean and a spread
  metrics = (tmp_path / "o" / "metrics.csv").read_text().splitlines()
  assert metrics[0].startswith("seed,step,") and len(metrics) == 1 + 2 * 3


def test_epsilon_inf_is_the_non_private_reference_and_says_so(tmp_path, capsys):
  argv = ["public-features", "--set", "num_users=300", "--set", "num_items=30"]
  argv += ["--set", "num_people=100", "--set", "epsilon=inf", "--set", "outer_steps=1"]
  code, _, err = _run([*argv, "--out", str(tmp_path / "o")], capsys)
  assert code == 0, err
  assert "the non-private reference: no noise" in err
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  assert summary["private"] is False and summary["epsilon"] is None  # JSON has no inf
  assert summary["privacy"]["guarantee"].startswith("none")
  assert summary["privacy"]["mechanism"].startswith("none")


def test_tune_chooses_on_validation_and_says_tuning_is_not_covered(tmp_path, capsys, monkeypatch):
  from fedmf.public_features import tuning

  monkeypatch.setitem(tuning.GRIDS, "dp-als", {"reg_noise": (0.1, 30.0)})
  monkeypatch.setitem(tuning.GRIDS, "dp-bias", {"reg_noise": (1.0,)})
  argv = ["public-features", "--set", "num_users=300", "--set", "num_items=30", "--tune"]
  argv += ["--set", "num_people=100", "--set", "algorithm=dp-als", "--set", "outer_steps=1"]
  code, _, err = _run([*argv, "--out", str(tmp_path / "o")], capsys)
  assert code == 0, err
  summary = json.loads((tmp_path / "o" / "summary.json").read_text())
  table = (tmp_path / "o" / "tuning.csv").read_text().splitlines()
  assert len(table) == 3 and table[0].startswith("reg_noise,")
  rows = [dict(zip(table[0].split(","), line.split(","))) for line in table[1:]]
  best = min(rows, key=lambda r: float(r["validation_rmse"]))
  assert summary["tuned"] is True and summary["chosen"] == {"reg_noise": float(best["reg_noise"])}
  assert summary["hyperparameters"]["reg_noise"] == float(best["reg_noise"])
  assert summary["test_rmse"] == pytest.approx(float(best["test_rmse"]))
  assert "not covered" in summary["privacy"]["not_covered"]


def test_tune_runs_points_that_differ_only_in_reg_noise_once_without_noise(monkeypatch):
  from types import SimpleNamespace

  from fedmf.public_features import algorithms
  from fedmf.public_features import tuning

  monkeypatch.setitem(tuning.GRIDS, "dp-als", {"outer_steps": (1, 2), "reg_noise": (1.0, 10.0)})
  calls = []

  def run(hyper, seed):
    calls.append((hyper.outer_steps, hyper.reg_noise, seed))
    rmse = 1.0 / hyper.outer_steps + hyper.reg_noise / 100
    return SimpleNamespace(metrics=[{"validation_rmse": rmse, "test_rmse": rmse + 0.01}])

  hyper = algorithms.Hyperparameters()
  noisy = tuning.tune(run, "dp-als", hyper, [0, 1], "rmse")
  assert len(calls) == 8 and noisy.choice == {"outer_steps": 2, "reg_noise": 1.0}
  calls.clear()
  quiet = tuning.tune(run, "dp-als", hyper, [0, 1], "rmse", same=tuning.no_noise_key)
  # Each outer_steps value once (with the first reg_noise), both seeds; rows repeated per point.
  assert calls == [(1, 1.0, 0), (1, 1.0, 1), (2, 1.0, 0), (2, 1.0, 1)]
  assert [r["reg_noise"] for r in quiet.table] == [1.0, 10.0, 1.0, 10.0]
  assert quiet.table[2]["validation_rmse"] == quiet.table[3]["validation_rmse"]
  assert quiet.choice == {"outer_steps": 2, "reg_noise": 1.0}  # the first of equals


def test_every_grid_axis_has_room_around_what_movielens_100k_chose():
  """The grids reach one step past each value chosen on MovieLens-100K with the earlier two-value
  grids (issue 34; docs/public-features.md, "Protocol"), so those choices are inner points now.
  AM-SSP's clip_user 1 (chosen only at ε = inf) is the one documented exception."""
  from fedmf.public_features import tuning

  earlier_choices = {  # method: {axis: values chosen at some finite ε}
    # dim: 2, the best of a probe at ε = 5 (tuning.GRIDS).
    "am-ssp": {"clip_user": {0.25}, "outer_steps": {2}, "reg_noise": {1.0}, "dim": {2}},
    "dp-als": {"clip_user": {0.25, 1.0}, "outer_steps": {2}, "reg_noise": {10.0}},
    "dp-cmf": {"cmf_weight": {10.0, 100.0}, "outer_steps": {2}, "reg_noise": {10.0}},
    "dp-bias": {"reg_item": {1.0}, "outer_steps": {2}, "reg_noise": {1.0, 10.0}},
    # Adam's grid is centred on the ε = 5 and ε = inf probes' best (docs, "Results").
    "am-dpsgd": {"dpsgd_learning_rate": {0.03}, "clip_user": {4.0}},
  }
  for method, axes in earlier_choices.items():
    for axis, chosen in axes.items():
      values = sorted(tuning.GRIDS[method][axis])
      for value in chosen:
        assert values[0] < value < values[-1], (method, axis, value, values)


def test_help_does_not_import_the_work():
  code = (
    "import sys\nfrom fedmf.cli import main\n"
    "main.build_parser()\n"
    "print(any(m.startswith('fedmf.public_features.') and m != 'fedmf.public_features.cli'"
    " for m in sys.modules), 'numpy' in sys.modules and 'fedmf.public_features.driver' in sys.modules)"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["False", "False"]
