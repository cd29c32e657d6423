"""Canary clients in `fedmf simulate` and `fedmf train` (issue 33): inserted where their pattern
says, logged under canary ids, projected, kept in canaries.npz, reported by `fedmf audit`, resumed
exactly by `fedmf train`; a run's real clients and noise are the same with or without them."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.program import run_manifest
from tests.helpers import kill_after_released_rounds, settings

TINY = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "rounds=6",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=3",
  "noise_seed=5",
  "participation.min_sep=2",
  "noise_multiplier=0.2",  # μ ≈ 12: every inserted canary stands out
  "reference_clients_per_round=4",  # no cheap simulation: the noise accounted is the noise added
]
CANARIES = ["canaries.count=40", "canaries.held_out=40", "canaries.seed=9"]


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("strategies")
  os.environ["FEDMF_CACHE_DIR"] = str(path)
  yield path
  os.environ.pop("FEDMF_CACHE_DIR", None)


def _simulate(out, extra):
  args = ["simulate", "--out", str(out), "--no-progress"]
  for item in settings(TINY, extra):
    args += ["--set", item]
  assert cli_main.main(args) == 0


def _log(out):
  return [
    (int(r["round"]), r["client_id"]) for r in csv.DictReader(open(out / "participation.csv"))
  ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("canary_runs")
  _simulate(root / "plain", [])
  _simulate(root / "worst", [*CANARIES, "canaries.pattern=worst-case"])
  return root


def test_worst_case_canaries_join_the_worst_rounds_and_are_logged(runs):
  out = runs / "worst"
  assert (out / "canaries.npz").stat().st_mode & 0o077 == 0  # owner-only: it holds the seed
  with np.load(out / "canaries.npz") as f:
    data = {k: f[k] for k in f.files}
  rounds = data["worst_rounds"].tolist()
  assert str(data["worst_method"]) == "exact" and rounds == [0, 2, 4]
  membership, inserted = data["membership"], data["inserted"]
  assert membership.shape == (6, 80) and np.array_equal(
    membership.any(axis=1), np.isin(range(6), rounds)
  )
  assert np.all(np.isfinite(data["projections"])) and int(data["seed"]) == 9
  logged = sorted((r, c) for r, c in _log(out) if c.startswith("canary-"))
  expected = sorted((r, f"canary-{c:06d}") for r in rounds for c in np.flatnonzero(inserted))
  assert logged == expected


def test_real_clients_and_noise_are_unchanged_by_canaries(runs):
  plain, worst = runs / "plain", runs / "worst"
  real = [row for row in _log(worst) if not row[1].startswith("canary-")]
  assert real == _log(plain)
  metrics = [list(csv.DictReader(open(p / "metrics.csv"))) for p in (plain, worst)]
  assert [r["noise_stddev"] for r in metrics[0]] == [r["noise_stddev"] for r in metrics[1]]
  assert [r["clients"] for r in metrics[0]] == [r["clients"] for r in metrics[1]]
  assert "empirical" not in json.loads((plain / "audit.json").read_text())
  assert not (plain / "canaries.npz").exists()


def test_canaries_follow_an_adaptive_clip(tmp_path):
  """With `clip_norm: adaptive` each round's canaries are inserted at that round's ζ_t (issue 36:
  the canary scale follows ζ), and their projections are normalized by it."""
  out = tmp_path / "adaptive"
  _simulate(out, [*CANARIES, "clip_norm=adaptive", "adaptive_clip.initial=0.05"])
  zeta = [float(r["clip_norm"]) for r in csv.DictReader(open(out / "metrics.csv"))]
  assert len(set(zeta)) > 1  # ζ moved
  data = np.load(out / "canaries.npz")
  # metrics.csv holds 6 significant digits of ζ_t.
  np.testing.assert_allclose(data["clip_norms"], zeta, rtol=1e-5)
  assert json.loads((out / "audit.json").read_text())["count_releases"] >= 1


def test_audit_reports_measured_privacy_with_the_contract_keys(runs, capsys):
  out = runs / "worst"
  assert cli_main.main(["audit", str(out), "--json", "--strict"]) == 0
  data = json.loads(capsys.readouterr().out)
  empirical = data["empirical"]
  for name in ("all_releases", "final_model"):
    e = empirical[name]
    for key in ("epsilon_estimate", "epsilon_lower", "confidence", "analytic_epsilon"):
      assert isinstance(e[key], float), (name, key)
    assert e["confidence"] == 0.95 and e["epsilon_lower"] <= e["analytic_epsilon"]
  assert empirical == json.loads((out / "audit.json").read_text())["empirical"]
  assert json.loads((out / "summary.json").read_text())["audit"]["empirical"]["all_releases"]
  for name in ("report.html", "report.md"):
    assert "Measured privacy" in (out / name).read_text()
  assert (out / "canary_statistics.png").stat().st_size > 0
  assert cli_main.main(["audit", str(out)]) == 0
  assert "measured privacy:" in capsys.readouterr().out
  # A run without canaries: nothing new in the audit's text, JSON or report.
  plain = runs / "plain"
  assert cli_main.main(["audit", str(plain)]) == 0
  text = capsys.readouterr().out.lower().replace(str(plain).lower(), "RUN")  # the fixture's path
  assert "measured privacy" not in text and "canar" not in text
  assert cli_main.main(["audit", str(plain), "--json", "--strict"]) == 0
  assert "empirical" not in json.loads(capsys.readouterr().out)
  for name in ("report.html", "report.md"):
    report = (plain / name).read_text().lower()  # (paths may hold 'canary': the worktree's)
    assert "measured privacy" not in report and "canary_statistics" not in report
  assert not (plain / "canary_statistics.png").exists()


def test_strict_fails_when_a_lower_bound_exceeds_the_analytic_epsilon(runs, tmp_path, capsys):
  """A test double of a run whose plan claims 100× the noise it added (σ/100 in training)."""
  import shutil

  out = tmp_path / "claims_more_noise"
  shutil.copytree(runs / "worst", out)
  plan = json.loads((out / "plan.json").read_text())
  plan["training_noise_multiplier"] *= 100
  (out / "plan.json").write_text(json.dumps(plan))
  run_manifest.finish(out, run_manifest.read(out))
  assert cli_main.main(["audit", str(out), "--strict", "--json"]) == 1
  captured = capsys.readouterr()
  data = json.loads(captured.out)
  assert data["empirical"]["all_releases"]["epsilon_lower_exceeds_analytic"]
  assert "exceeds the analytic epsilon" in captured.err


def test_participation_canaries_follow_the_participation_model(tmp_path, capsys):
  out = tmp_path / "participation"
  _simulate(out, [*CANARIES, "rounds=8"])
  with np.load(out / "canaries.npz") as f:
    membership, inserted = f["membership"], f["inserted"]
  assert membership.sum() > 0
  for c in range(membership.shape[1]):
    rounds = np.flatnonzero(membership[:, c])
    assert np.all(np.diff(rounds) >= 2)  # the run's own timer: min_sep 2
  logged = sum(c.startswith("canary-") for _, c in _log(out))
  assert logged == int(membership[:, inserted].sum())
  audit = json.loads((out / "audit.json").read_text())
  assert (
    audit["violation_counts"]["min-sep"] == 0 and audit["empirical"]["pattern"] == "participation"
  )


def test_bad_canary_configs_are_refused_before_work(tmp_path, capsys):
  for extra, message in (
    (["canaries.count=40000", "canaries.held_out=40000"], "do not fit in a model"),
    (["canaries.count=5", "canaries.held_out=5", "noise_multiplier=0"], "noise_multiplier 0"),
    (["canaries.count=5", "canaries.held_out=1"], "canaries.held_out must be"),
  ):
    args = ["simulate", "--out", str(tmp_path / "x"), "--no-progress"]
    for item in settings(TINY, extra):
      args += ["--set", item]
    assert cli_main.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # 2.5 min in CI: kill -9 and resume (python3 dev.py test -m slow)
def test_train_resumes_canaries_exactly(tmp_path):
  """Killed after a checkpoint with a round released past it; the canary seed is unset (drawn by
  the first process, checkpointed): the recomputed round must carry the same canaries (the
  release journal refuses a different aggregate), and canaries.npz equals that of an
  uninterrupted run with the seed it recorded."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")

  def command(root, extra):
    args = ["train", "--root", str(root), "--no-progress"]
    for item in settings(TINY, ["rounds=8", "checkpoint_every=3", *extra]):
      args += ["--set", item]
    return [sys.executable, "-m", "fedmf.cli.main", *args]

  crashed = tmp_path / "crashed"
  extra = ["canaries.count=30", "canaries.held_out=30"]
  kill_after_released_rounds(command(crashed, extra), crashed, 4, env)
  final = subprocess.run(command(crashed, extra), env=env, capture_output=True, text=True)
  assert final.returncode == 0, final.stderr
  with np.load(crashed / "canaries.npz") as f:
    got = {k: f[k] for k in f.files}
  reference = tmp_path / "reference"
  extra_seeded = [*extra, f"canaries.seed={int(got['seed'])}"]
  done = subprocess.run(command(reference, extra_seeded), env=env, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr
  with np.load(reference / "canaries.npz") as f:
    want = {k: f[k] for k in f.files}
  for key in ("inserted", "membership", "projections", "final_projections", "client_sq_norms"):
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert (crashed / "participation.csv").read_text() == (
    reference / "participation.csv"
  ).read_text()
