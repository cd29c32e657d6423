"""`fedmf simulate` end to end on tiny tasks (synthetic and a StackOverflow sqlite file), and the
participation models' guarantees checked by the auditor on the logs they write."""

import csv
import json
import math
import os
import shutil

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.participation import ParticipationConfig, build
from fedmf.privacy import audit, participation_log
from fedmf.tasks import stackoverflow as sod
from tests.helpers import brute_min_sep, load_script, settings

TINY = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "rounds=8",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=4",
  "noise_seed=5",
  "reference_clients_per_round=100",
  "participation.min_sep=3",
]


def _simulate(tmp_path, capsys, extra, name="run"):
  out = tmp_path / name
  args = ["simulate", "--out", str(out), "--no-progress"]
  for item in settings(TINY, extra):
    args += ["--set", item]
  code = cli_main.main(args + ["--json"])
  captured = capsys.readouterr()
  assert code == 0, captured.err
  return out, json.loads(captured.out)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("strategies")
  os.environ["FEDMF_CACHE_DIR"] = str(path)
  yield path
  os.environ.pop("FEDMF_CACHE_DIR", None)


def test_simulation_writes_the_contract_outputs_and_audits_itself(tmp_path, capsys, cache_dir):
  out, summary = _simulate(
    tmp_path, capsys, ["target_epsilon=8", "participation.early_checkin_rate=0.3"]
  )
  for name in (
    "config.json",
    "metrics.csv",
    "participation.csv",
    "strategy.json",
    "audit.json",
    "report.html",
    "summary.json",
  ):
    assert (out / name).is_file(), name
  for key in (
    "rounds_completed",
    "noise_multiplier",
    "initial_test_accuracy",
    "final_test_accuracy",
    "refused_checkins",
    "violations",
  ):
    assert key in summary
  assert summary["rounds_completed"] == 8
  assert summary["refused_checkins"] > 0  # misbehaving devices were refused by the guard
  assert summary["violations"] == 0
  assert summary["audit"]["observed_min_sep"] >= 3
  assert summary["audit"]["epsilon"] <= 8 + 1e-9
  rows = list(csv.DictReader(open(out / "metrics.csv")))
  assert [int(r["round"]) for r in rows] == list(range(8))
  assert [r["accuracy"] != "" for r in rows] == [False, False, False, True] * 2
  assert all(float(r["round_seconds"]) > 0 and np.isfinite(float(r["loss"])) for r in rows)
  log = participation_log.read_participation_log(out / "participation.csv")
  assert log.num_rows == 8 * 4
  config = json.load(open(out / "config.json"))
  assert config["participation"]["min_sep"] == 3 and config["noise_seed"] == 5
  # `fedmf audit OUT` reads the run's own files and reports the run's own epsilon (issue 13).
  assert cli_main.main(["audit", str(out), "--json", "--strict", "--max-epsilon", "8"]) == 0
  again = json.loads(capsys.readouterr().out)
  assert again["epsilon"] == summary["audit"]["epsilon"] and again["strict"]["passed"]
  assert again["noise_multiplier"] == summary["noise_multiplier"]
  page = (out / "report.html").read_text()
  assert "Test accuracy" in page and "cheap simulation" in page
  # One accountant per run (issue 38 item 4), named in every output; PLD is a labelled cross-check.
  plan = json.load(open(out / "plan.json"))
  audited = json.load(open(out / "audit.json"))
  assert plan["accountant"] == summary["accountant"] == audited["accountant"] == "analytic"
  assert summary["audit"]["accountant"] == "analytic"
  assert "analytic Gaussian curve" in plan["accounting"] and "PLD" not in plan["accounting"]
  check = summary["cross_check"]
  assert check == plan["cross_check"] and check["accountant"] == "pld"
  # PLD is pessimistic, slightly: its epsilon at the plan's sigma is at least the exact one.
  assert plan["epsilon"] <= 8 + 1e-9 and plan["epsilon"] <= check["epsilon"] < 8.01
  assert "analytic Gaussian curve" in page
  # The same config and seeds give the same model: the noise is seeded and cohorts are keyed.
  _, again = _simulate(
    tmp_path, capsys, ["target_epsilon=8", "participation.early_checkin_rate=0.3"], name="again"
  )
  assert again["final_test_accuracy"] == summary["final_test_accuracy"]


def test_a_run_without_dp_says_so_everywhere(tmp_path, capsys, cache_dir):
  out = tmp_path / "no-dp"
  args = ["simulate", "--out", str(out)]  # With progress: stderr is not a terminal here.
  for item in settings(TINY, ["noise_multiplier=0"]):
    args += ["--set", item]
  assert cli_main.main(args) == 0
  captured = capsys.readouterr()
  text = captured.out
  # Issue 38 items 1 and 6: off a terminal, plain progress lines with the times and the ETA; a
  # run without DP says so on them instead of 'epsilon inf'.
  # (Heartbeats, lines of a stage or a round still running after 30 s, appear on a loaded machine;
  # one due less than 30 s after preparing ended says "rounds 0/8 done" without "running for".)
  progress = [
    line
    for line in captured.err.splitlines()
    if line.startswith("rounds ")
    and "(preparing" not in line
    and " running for " not in line
    and not line.startswith("rounds 0/")
  ]
  assert [line.split("  ")[0] for line in progress] == ["rounds 4/8 done", "rounds 8/8 done"]
  for line in progress:
    assert " elapsed " in line and " ETA " in line and " recent " in line, line
    assert line.endswith("epsilon none (no privacy guarantee)") and "inf" not in line, line
  assert "planned privacy: none (noise multiplier 0 trains without DP" in text
  assert "noise multiplier     0 (no DP: a baseline for comparison)" in text
  assert "privacy (audit)      no privacy guarantee (noise multiplier 0)" in text
  assert "cheap simulation" not in text and "epsilon" not in text.split("simulated")[1]
  summary = json.load(open(out / "summary.json"))
  assert summary["audit"]["privacy_guarantee"] is False
  assert "No privacy guarantee" in (out / "report.html").read_text()
  assert cli_main.main(["audit", str(out), "--strict"]) == 1
  assert "no privacy guarantee (noise multiplier 0)" in capsys.readouterr().err


def test_stackoverflow_file_runs_end_to_end(tmp_path, capsys, cache_dir):
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(30)]

  def sentences(n):
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 25)))) for _ in range(n)]

  clients = {
    "train": {f"u{i:02d}": sentences(int(rng.integers(2, 12))) for i in range(12)},
    "heldout": {},
    "test": {f"t{i}": sentences(6) for i in range(4)},
  }
  data = tmp_path / "so"
  data.mkdir()
  sod.write_tiny_stackoverflow_sqlite(str(data / sod.SQLITE_NAME), clients)
  out = tmp_path / "so-run"
  code = cli_main.main(
    [
      "simulate",
      "--out",
      str(out),
      "--no-progress",
      "--data-dir",
      str(data),
      "--set",
      "task=stackoverflow",
      "--set",
      "num_clients=12",
      "--set",
      "vocab_size=20",
      "--set",
      "rounds=4",
      "--set",
      "clients_per_round=3",
      "--set",
      "participation.model=epoch_shuffle",
      "--set",
      "participation.min_sep=4",
      "--set",
      "test_sentences=20",
      "--set",
      "eval_every=2",
      "--set",
      "mechanism=tree",
      "--set",
      "noise_multiplier=0.5",
    ]
  )
  assert code == 0, capsys.readouterr().err
  summary = json.load(open(out / "summary.json"))
  assert summary["rounds_completed"] == 4
  ids = set(
    participation_log.read_participation_log(out / "participation.csv")
    .column("client_id")
    .to_pylist()
  )
  assert ids <= set(clients["train"])


def test_missing_stackoverflow_file_is_one_line_exit_2(tmp_path, capsys):
  code = cli_main.main(
    [
      "simulate",
      "--out",
      str(tmp_path / "x"),
      "--data-dir",
      str(tmp_path),
      "--set",
      "task=stackoverflow",
      "--set",
      "target_epsilon=1",
    ]
  )
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "stackoverflow.sqlite" in err[0]


def test_unknown_key_and_occupied_out_dir_are_refused(tmp_path, capsys):
  assert cli_main.main(["simulate", "--out", str(tmp_path / "a"), "--set", "roundz=3"]) == 2
  assert "did you mean 'rounds'" in capsys.readouterr().err
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "summary.json").write_text("{}")
  assert cli_main.main(["simulate", "--out", str(tmp_path / "b")]) == 2
  assert "--force" in capsys.readouterr().err


def _audit_cohorts(tmp_path, model, rounds, declared_b):
  cohorts = [model.sample(r) for r in range(rounds)]
  path = tmp_path / "log.csv"
  participation_log.write_participation_log(
    path,
    np.concatenate([np.full(c.clients.size, c.round) for c in cohorts]),
    [f"d{i}" for c in cohorts for i in c.clients],
  )
  result = audit.audit_log(
    path, {"mechanism": "dpsgd"}, 1.0, 1e-6, rounds=rounds, min_sep=declared_b, progress=False
  )
  return cohorts, result


@pytest.mark.parametrize("guard", [True, False])
def test_audit_finds_early_checkins_only_without_the_guard(tmp_path, guard):
  cfg = ParticipationConfig(model="timer", min_sep=6, early_checkin_rate=0.4, server_guard=guard)
  model = build(cfg, 80, 8, seed=2)
  cohorts, result = _audit_cohorts(tmp_path, model, 60, 6)
  violations = result.violation_counts()["min-sep"]
  if guard:
    assert sum(c.refused for c in cohorts) > 0 and violations == 0
    assert result.stats.observed_min_sep >= 6
  else:
    assert sum(c.early_admitted for c in cohorts) > 0 and violations > 0
    assert result.stats.observed_min_sep < 6


def test_wall_clock_timer_min_sep_is_what_the_log_says(tmp_path):
  cfg = ParticipationConfig(
    model="timer",
    timer_unit="hours",
    timer_hours=2.0,
    round_minutes=10,
    round_jitter=0.5,
    night_availability=0.9,
    day_availability=0.3,
  )
  model = build(cfg, 120, 6, seed=4)
  declared = model.declared_schema(300).min_sep
  cohorts, result = _audit_cohorts(tmp_path, model, 300, declared)
  assert result.stats.observed_min_sep == brute_min_sep(cohorts)
  assert result.stats.observed_min_sep >= declared
  assert result.violation_counts()["min-sep"] == 0


def test_own_data_example_runs(tmp_path, capsys, cache_dir):
  example = load_script("simulations/own_data_example.py")
  assert (
    example.main(["--out", str(tmp_path / "own"), "--set", "rounds=4", "--set", "eval_every=2"])
    == 0
  )
  summary = json.loads((tmp_path / "own" / "summary.json").read_text())
  assert summary["rounds_completed"] == 4 and summary["violations"] == 0
  ids = participation_log.read_participation_log(tmp_path / "own" / "participation.csv")
  assert all(c.startswith("user-") for c in ids.column("client_id").to_pylist())


def test_compare_mechanisms_runs_each_arm_at_the_same_epsilon_and_resumes(
  tmp_path, capsys, cache_dir
):
  compare = load_script("simulations/compare_mechanisms.py")
  out = tmp_path / "compare"
  args = ["--out", str(out), "--seeds", "0", "--arms", "dpsgd,blt-k1-2", "--epsilon", "6"]
  args += ["--end-evaluations", "2", "--label", "tiny"]
  for item in TINY:
    args += ["--set", item]
  assert compare.main(args) == 0
  first = json.loads((out / "results.json").read_text())
  assert (
    first["format"] == load_script("simulations/comparison_results.py").RESULTS_FORMAT
    and len(first["code"]["commit"] or "x" * 40) == 40
  )
  runs = first["runs"]
  # Each run names the checkout that trained it, from the code.json its launch wrote.
  for r in runs:
    code_file = out / "runs" / "tiny" / f"{r['arm']}-seed0" / "code.json"
    assert json.loads(code_file.read_text())["trained_by"] == r["trained_by"] == [first["code"]]
  assert [(r["label"], r["arm"], r["seed"]) for r in runs] == [
    ("tiny", "blt-k1-2", 0),
    ("tiny", "dpsgd", 0),
  ]
  for r in runs:  # Calibrated alike; the realized participation may cost less than planned.
    run_dir = out / "runs" / "tiny" / f"{r['arm']}-seed0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert abs(r["planned_epsilon"] - 6) < 0.05 and r["finished"]
    assert 0 < r["audited_epsilon"] <= summary["planned_epsilon"] + 1e-9
    assert r["metrics"]["round"] == list(range(8)) and len(r["metrics"]["loss"]) == 8
    evals = r["metrics"]["evaluations"]
    assert evals["round"] == [3, 7]
    assert r["final_accuracy"] == evals["accuracy"][-1]  # 9 digits: float32 round-trips
    assert r["final_accuracy"] == pytest.approx(summary["final_test_accuracy"], rel=1e-8)
    assert r["end_accuracy"] == pytest.approx(sum(evals["accuracy"]) / 2)
    assert r["config"]["seed"] == 0 and r["config"]["noise_seed"] == 1000
    assert r["rms_loss"] > 0 and r["max_loss"] >= r["rms_loss"]
  blt, dpsgd = runs
  # The k = 1 BLT is a strategy file, accounted under the run's own (n, b, k) = (8, 3, 3).
  assert blt["config"]["strategy"].endswith("blt-n8-b3-k1-2buffers.json")
  assert blt["strategy_json"]["optimized_for"]["max_participations"] == 1
  assert dpsgd["rms_loss"] == pytest.approx(math.sqrt(3 * 36 / 8))  # √k · ‖A‖_F/√n, A = prefix sums
  assert blt["noise_multiplier"] != dpsgd["noise_multiplier"]
  table = (out / "results.md").read_text()
  assert "| dpsgd |" in table and "| blt-k1-2 |" in table
  assert (out / "accuracy-tiny.png").stat().st_size
  capsys.readouterr()
  assert compare.main(args) == 0  # Finished runs are kept, not rerun.
  assert capsys.readouterr().err.count("finished:") == 2
  assert json.loads((out / "results.json").read_text()) == first
  # On another machine the run directories are gone and results.json is copied in: its finished
  # runs are not trained again, and the collect keeps their records.
  shutil.rmtree(out / "runs")
  assert compare.main(args) == 0
  err = capsys.readouterr().err
  assert err.count("finished (in results.json, trained elsewhere):") == 2
  assert not (out / "runs" / "tiny").exists()
  assert json.loads((out / "results.json").read_text())["runs"] == first["runs"]
  # A record of another config is refused in one line, not trained over.
  with pytest.raises(
    SystemExit, match=r"records tiny/dpsgd-seed0 with another config \(target_epsilon\)"
  ):
    compare.main([*args, "--arms", "dpsgd", "--epsilon", "5"])


def test_the_report_curve_shows_the_consoles_epsilon(tmp_path, capsys, cache_dir):
  # Issue 26 C.10: one definition of "ε after r released rounds" for console, metrics.csv and the
  # report's curve (each r at its own realized (b_r, k_r); no bound where the run knows the value).
  import csv  # pylint: disable=import-outside-toplevel

  out, _ = _simulate(tmp_path, capsys, ["rounds=12", "eval_every=2", "noise_multiplier=1.0"])
  with open(out / "epsilon_curve.csv") as f:
    curve = {int(row["rounds"]): row for row in csv.DictReader(f)}
  compared = 0
  with open(out / "metrics.csv") as f:
    for row in csv.DictReader(f):
      if row["epsilon"]:
        point = curve[int(row["round"]) + 1]
        assert float(point["epsilon"]) == pytest.approx(float(row["epsilon"]), rel=1e-8)  # 9 digits
        assert point["sensitivity_method"] != "upper-bound"
        compared += 1
  assert compared >= 5


def test_runs_in_one_process_clip_at_their_own_clip_norm(tmp_path, capsys, cache_dir):
  """The client round is built once per model and recipe in a process (`training_run`): a second
  run with another ζ, or another learning rate, must not get the first run's computation (its ζ is
  a constant of the computation: a stale one would clip at the wrong norm, and the privacy
  analysis would not hold)."""

  def clipped(out):
    return [int(row["clipped"]) for row in csv.DictReader(open(out / "metrics.csv"))]

  fast = ["rounds=2", "eval_every=2", "noise_multiplier=0"]
  loose, _ = _simulate(tmp_path, capsys, [*fast, "clip_norm=1e6"], "loose")
  tight, _ = _simulate(tmp_path, capsys, [*fast, "clip_norm=1e-9"], "tight")
  assert clipped(loose) == [0, 0]
  assert clipped(tight) == [4, 4]  # Every client's update is longer than 1e-9.
  # Same ζ, another client learning rate: the second round starts from another model.
  other, _ = _simulate(
    tmp_path, capsys, [*fast, "clip_norm=1e6", "client_learning_rate=0.01"], "lr"
  )

  def losses(out):
    return [float(row["loss"]) for row in csv.DictReader(open(out / "metrics.csv"))]

  assert losses(other)[1] != losses(loose)[1]  # (Runs without noise are deterministic.)
