"""`fedmf train`: crash-resume to the same model, two TFF workers, the budget guard, refusals."""

import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import accounting
from fedmf.program.train import JOURNAL as JOURNAL_NAME
from tests.helpers import kill_after_released_rounds, settings

TINY = [
  "num_clients=60",
  "vocab_size=40",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "eval_every=3",
  "participation.min_sep=3",
  "noise_seed=3",
  "reference_clients_per_round=100",
]


def _args(root, extra):
  args = ["train", "--root", str(root), "--no-progress"]
  for item in settings(TINY, extra):
    args += ["--set", item]
  return args


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("strategies")
  os.environ["FEDMF_CACHE_DIR"] = str(path)
  yield path
  os.environ.pop("FEDMF_CACHE_DIR", None)


def _metric_rows(root):
  """metrics.csv without its wall-clock column."""
  return [
    {k: v for k, v in row.items() if k != "round_seconds"}
    for row in csv.DictReader(open(root / "metrics.csv"))
  ]


def _weights(root):
  with np.load(root / "release" / "final_model.npz") as f:
    return [f[k] for k in f.files]


def _worker_pids():
  """TFF workers started by this test process (other jobs on the machine may run their own):
  its children, and the worker_binary children of its network-namespace bridges."""
  out = subprocess.run(
    ["pgrep", "-P", str(os.getpid())], capture_output=True, text=True
  ).stdout.split()
  children = {int(p) for p in out}
  found = set()
  for pid in children:
    try:
      cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
      continue
    if b"worker_binary" in cmd or b"netns_bridge" in cmd:
      found.add(pid)
  return found


# The uninterrupted run the crash tests compare with (one run for both).
RESUMED = ["rounds=12", "checkpoint_every=3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
  root = tmp_path_factory.mktemp("reference") / "root"
  assert cli_main.main(_args(root, RESUMED)) == 0
  return root


def test_killed_runs_resume_to_the_uninterrupted_result(tmp_path, capsys, reference):
  extra = RESUMED
  capsys.readouterr()
  crashed = tmp_path / "crashed"
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  command = [sys.executable, "-m", "fedmf.cli.main", *_args(crashed, extra)]
  rng = random.Random(7)
  kills = 0
  for _ in range(3):
    target = rng.randint(1, 11)  # Kill once the log holds this many rounds (or it finishes).
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = crashed / "journal.csv"
    while proc.poll() is None:
      rows = len(journal.read_text().splitlines()) - 1 if journal.exists() else 0
      if rows >= target:
        time.sleep(rng.uniform(0.0, 1.0))  # Anywhere within the round: training, saving, writing.
        proc.send_signal(signal.SIGKILL)
        kills += 1
        break
      time.sleep(0.05)
    proc.wait()
    if proc.returncode == 0:
      break
  assert kills >= 1
  final = subprocess.run(command, env=env, capture_output=True, text=True)
  assert final.returncode == 0, final.stderr
  for a, b in zip(_weights(reference), _weights(crashed)):
    np.testing.assert_array_equal(a, b)
  assert _metric_rows(reference) == _metric_rows(crashed)
  assert (reference / "participation.csv").read_text() == (
    crashed / "participation.csv"
  ).read_text()
  audit = json.loads((crashed / "audit.json").read_text())
  assert audit["duplicate_rows"] == 0 and audit["violation_counts"]["min-sep"] == 0
  assert not [p for p in (crashed / "state").iterdir() if "_temp" in p.name]
  assert (crashed / "state").stat().st_mode & 0o077 == 0  # Owner-only: it holds the noise seed.


def test_a_run_without_noise_seed_resumes_with_its_checkpointed_seed(tmp_path):
  """The noise stream of a resumed run is started with the checkpoint's seed (the config leaves
  noise_seed unset: the first process drew it): the round released after the checkpoint and
  recomputed on resume must hash the same in the journal, or the program refuses (exit 2)."""
  root = tmp_path / "root"
  args = ["train", "--root", str(root), "--no-progress"]
  for item in [*TINY, "rounds=12", "checkpoint_every=4"]:
    if not item.startswith("noise_seed="):
      args += ["--set", item]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  command = [sys.executable, "-m", "fedmf.cli.main", *args]
  # Rounds 0-4 released: the checkpoint after round 3 (version 4) is the latest; round 4 is
  # recomputed on resume.
  kill_after_released_rounds(command, root, 5, env)
  assert json.loads((root / "config.json").read_text())["noise_seed"] is None
  final = subprocess.run(command, env=env, capture_output=True, text=True)
  assert final.returncode == 0, final.stderr
  assert "resuming" in final.stdout
  rounds = [int(line.split(",")[0]) for line in (root / "journal.csv").read_text().splitlines()[1:]]
  assert rounds == list(range(12))


def test_local_workers_give_the_in_process_model_bit_for_bit(tmp_path, capsys):
  # 4 clients a round in chunks of 1: 4 chunk sums added in chunk order, however many workers.
  extra = ["rounds=4", "checkpoint_every=10", "clients_per_call=1"]
  before = _worker_pids()  # e.g. a default context another test module left for exit
  assert cli_main.main(_args(tmp_path / "local", extra)) == 0, capsys.readouterr().err
  reference = _weights(tmp_path / "local")
  for workers in (1, 3):
    root = tmp_path / f"pool{workers}"
    assert cli_main.main(_args(root, extra + [f"workers={workers}"])) == 0
    capsys.readouterr()
    for a, b in zip(reference, _weights(root)):
      np.testing.assert_array_equal(a, b)
  assert not _worker_pids() - before  # Every worker the program started is gone.


def test_budget_guard_stops_at_the_last_round_within_the_budget(tmp_path, capsys, monkeypatch):
  from fedmf.program import train

  budget = 3.0
  root = tmp_path / "budget"
  args = _args(
    root,
    [
      "rounds=30",
      "noise_multiplier=2.0",
      "participation.min_sep=2",
      "checkpoint_every=5",
      f"budget.epsilon={budget}",
      "reference_clients_per_round=null",
    ],
  )
  # The checkpoint saved after the budget stop (between checkpoints) fails, as on a full disk:
  # the error surfaces (it was swallowed), the run stays unfinished, and a rerun resumes from the
  # last checkpoint to the same stop.
  original = train.FileCheckpoints.save
  saved = []

  async def save_or_fail(self, run, version):
    if version % 5:
      raise OSError(28, "No space left on device")
    saved.append(version)
    await original(self, run, version)

  with monkeypatch.context() as patch:
    patch.setattr(train.FileCheckpoints, "save", save_or_fail)
    assert cli_main.main(args) == 1  # An OS error: one line, exit 1 (it was swallowed: exit 0).
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "No space left on device" in err[0], err
  assert json.loads((root / "run.json").read_text())["state"] == "running"
  assert cli_main.main(args) == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  summary = json.loads((root / "summary.json").read_text())
  assert summary["stopped_by_budget"]
  # Issue 38 item 7: said at plan time, with the round it cannot stop before; and in the report.
  warned = re.search(
    r"warning: the planned epsilon \S+ exceeds budget.epsilon 3: .* round (\d+) ", out
  )
  assert warned, out
  assert int(warned.group(1)) <= summary["rounds_completed"]
  report = (root / "report.html").read_text()
  assert f"the program stopped after {summary['rounds_completed']} of 30 rounds" in report
  assert "privacy budget (budget.epsilon): 3" in report and "budget.epsilon)</dt><dd>3<" in report
  assert summary["rounds_completed"] % 5, "the stop must fall between checkpoints (change them)"
  assert saved[-1] == summary["rounds_completed"] // 5 * 5
  # A rerun of the finished ROOT stops at once, with the same numbers.
  assert cli_main.main(args) == 0, capsys.readouterr().err
  assert (
    json.loads((root / "summary.json").read_text())["rounds_completed"]
    == summary["rounds_completed"]
  )
  assert 0 <= summary["final_test_accuracy"] <= 1  # The released final model, evaluated.
  done = summary["rounds_completed"]
  assert 0 < done < 30
  strategy = json.loads((root / "strategy.json").read_text())
  rows = list(csv.DictReader(open(root / "participation.csv")))

  def epsilon_after(rounds):
    """The accountant on the realized schema of the first `rounds` rounds of the log."""
    last, gaps, counts = {}, [], {}
    for row in rows:
      r, c = int(row["round"]), row["client_id"]
      if r >= rounds:
        break
      if c in last:
        gaps.append(r - last[c])
      last[c] = r
      counts[c] = counts.get(c, 0) + 1
    k = max(counts.values())
    schema = ParticipationSchema(rounds, min(gaps) if k > 1 else None, k)
    return accounting.account(strategy, schema, 2.0, 1e-6).epsilon

  assert epsilon_after(done) <= budget
  assert summary["audit"]["epsilon"] == pytest.approx(epsilon_after(done), rel=1e-9)
  # The next round, with the cohort it would have drawn, would have gone over: rerun a copy of the
  # run without a budget for one more round and account it.
  longer = tmp_path / "longer"
  assert (
    cli_main.main(
      _args(
        longer,
        [
          "rounds=30",
          "noise_multiplier=2.0",
          "participation.min_sep=2",
          "checkpoint_every=5",
          "reference_clients_per_round=null",
        ],
      )
    )
    == 0
  )
  capsys.readouterr()
  rows = list(csv.DictReader(open(longer / "participation.csv")))
  assert epsilon_after(done + 1) > budget


def test_released_rounds_without_state_and_other_configs_are_refused(tmp_path, capsys):
  root = tmp_path / "run"
  assert cli_main.main(_args(root, ["rounds=2", "target_epsilon=8"])) == 0
  capsys.readouterr()
  assert cli_main.main(_args(root, ["rounds=3", "target_epsilon=8"])) == 2
  assert "another config" in capsys.readouterr().err
  for state in (root / "state").iterdir():
    import shutil

    shutil.rmtree(state)
  assert cli_main.main(_args(root, ["rounds=2", "target_epsilon=8"])) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "released rounds but no checkpoint" in err[0]


class _Crash(BaseException):
  """A crash at a chosen point: no fedmf code catches it (it is not an Exception), so the program
  stops there with its files as a SIGKILL would leave them (every write before it completed)."""


def _crash_after(monkeypatch, owner, name, when):
  """Wraps `owner.name` (sync or async) so that it raises `_Crash` right after the call for which
  `when(*args)` is true; returns a list that records the crash."""
  import inspect

  original = getattr(owner, name)
  crashed = []

  def check(args):
    if not crashed and when(*args):
      crashed.append(args)
      raise _Crash()

  if inspect.iscoroutinefunction(original):

    async def wrapper(self, *args):
      await original(self, *args)
      check(args)

  else:

    def wrapper(self, *args):
      original(self, *args)
      check(args)

  monkeypatch.setattr(owner, name, wrapper)
  return crashed


def test_a_crash_between_a_rounds_records_and_its_checkpoint_loses_no_released_round(
  tmp_path, monkeypatch, capsys, reference
):
  """Item 0 of issue 38: the program stops right after one step of a round (deterministically, not
  at a random moment), is rerun, and must end with the uninterrupted run's logs. The first crash
  lands right after the checkpoint that covers round 5: a participation log written after the
  checkpoint would miss round 5 for good (resume truncates the log to the checkpoint and goes on
  from round 6), and its audit would under-count those devices' participations."""
  from fedmf.privacy import log_journal
  from fedmf.program import metrics_csv, train

  extra = RESUMED
  capsys.readouterr()
  root = tmp_path / "crashed"
  crash_points = [
    # The checkpoint (version 6) that covers round 5.
    (train.FileCheckpoints, "save", lambda run, version: version == 6),
    # Round 7's participation rows, before its metrics (resumed from version 6).
    (log_journal.AppendableParticipationLog, "write_round", lambda r, ids: r == 7),
    # Round 8's metrics, before its model release and the checkpoint that covers it.
    (metrics_csv.MetricsCsv, "release", lambda value, key: key == 8),
  ]
  for owner, name, when in crash_points:
    with monkeypatch.context() as patch:
      crashed = _crash_after(patch, owner, name, when)
      with pytest.raises(_Crash):
        cli_main.main(_args(root, extra))
      assert crashed
    capsys.readouterr()
  # With the ROOT written as users do (a trailing slash), which the summary printed as 'ROOT//'.
  assert cli_main.main(_args(f"{root}/", extra)) == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert "resuming" in out and "//" not in out
  assert f"final model          {root / 'release' / 'final_model.npz'}" in out
  assert (root / "participation.csv").read_text() == (reference / "participation.csv").read_text()
  logged = {int(row["round"]) for row in csv.DictReader(open(root / "participation.csv"))}
  assert logged == set(range(12))  # Every released round, each with its devices.
  assert _metric_rows(root) == _metric_rows(reference)
  assert (root / JOURNAL_NAME).read_text() == (reference / JOURNAL_NAME).read_text()
  for a, b in zip(_weights(reference), _weights(root)):
    np.testing.assert_array_equal(a, b)
  releases = sorted(p.name for p in (root / "release").iterdir())
  assert releases == sorted(p.name for p in (reference / "release").iterdir())
  audit, expected = (json.loads((d / "audit.json").read_text()) for d in (root, reference))
  assert audit["epsilon"] == expected["epsilon"]
  assert audit["observed_max_participations"] == expected["observed_max_participations"]


def test_metrics_rows_are_durable_in_simulates_column_order(tmp_path, monkeypatch):
  """Issue 38 item 20: train's metrics.csv had TFF's alphabetical columns (and no fsync); an
  earlier ROOT's file is rewritten in the new order when the run resumes."""
  import asyncio

  from fedmf.program import metrics_csv, outputs

  synced = []
  real = os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
  path = tmp_path / "metrics.csv"
  old = "round,accuracy,clients,loss\n0,,4.0,3.5\n1,0.25,4.0,3.25\n2,,4.0,3.0\n"
  path.write_text(old)  # As TFF's manager wrote it, with round 2 after the checkpoint.
  journal = metrics_csv.MetricsCsv.resumable(path, resume_below=2)
  synced.clear()
  asyncio.run(journal.release({"loss": 2.75, "clients": 4.0, "round_seconds": 0.5}, 2))
  assert synced  # On disk when release returns.
  journal.close()
  rows = list(csv.reader(open(path)))
  assert rows[0] == list(outputs.METRIC_COLUMNS)
  as_dicts = [dict(zip(rows[0], row)) for row in rows[1:]]
  assert [(d["round"], d["loss"], d["accuracy"], d["clients"]) for d in as_dicts] == [
    ("0", "3.5", "", "4.0"),
    ("1", "3.25", "0.25", "4.0"),
    ("2", "2.75", "", "4"),
  ]
