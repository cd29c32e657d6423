"""What a run leaves behind is true (issue 26, section A), end to end through the CLI: an interrupted
`--force` run leaves the earlier run intact, a killed one leaves a staging directory the audit
refuses with what to do, a directory mixing runs or holding an unfinished `fedmf train` is refused,
and a diverging run stops naming its round, with strict JSON everywhere."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmf.cli import main as cli_main
from tests.helpers import settings

TINY = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "participation.min_sep=3",
]


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("strategies")
  os.environ["FEDMF_CACHE_DIR"] = str(path)
  yield path
  os.environ.pop("FEDMF_CACHE_DIR", None)


def _sets(extra):
  args = []
  for item in settings(TINY, extra):
    args += ["--set", item]
  return args


def _simulate_args(out, extra, *flags):
  return ["simulate", "--out", str(out), "--no-progress", *flags, *_sets(extra)]


def _command(args):
  return [sys.executable, "-m", "fedmf.cli.main", *map(str, args)]


def _env():
  return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _digests(directory: Path) -> dict[str, str]:
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(directory.rglob("*"))
    if p.is_file()
  }


def _staging(out: Path) -> list[Path]:
  return sorted(out.parent.glob(f".{out.name}.staging-*"))


def _default_sigint() -> None:
  """In the child: SIGINT as at a terminal. A test run started in the background (`cmd &` in a
  script) ignores SIGINT, and children inherit that, so Ctrl-C could not be tested there."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_stop_after(args, out: Path, rounds: int, sig) -> subprocess.Popen:
  """Starts `fedmf ARGS`, sends `sig` once its staging directory holds `rounds` metrics rows."""
  proc = subprocess.Popen(
    _command(args),
    env=_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    preexec_fn=_default_sigint,
  )
  deadline = time.monotonic() + 300
  while proc.poll() is None and time.monotonic() < deadline:
    partial = [p for s in _staging(out) for p in s.glob(".metrics.csv.partial-*")]
    if partial and len(partial[0].read_text().splitlines()) - 1 >= rounds:
      proc.send_signal(sig)
      break
    time.sleep(0.05)
  proc.wait(timeout=120)
  return proc


def _audit(capsys, source, *flags):
  code = cli_main.main(["audit", str(source), *flags])
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def _one_line(err: str) -> str:
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1, err
  assert "Traceback" not in err
  return lines[0]


def test_interrupted_force_run_leaves_the_earlier_run_intact(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli_main.main(_simulate_args(out, ["rounds=6", "noise_multiplier=0.9"])) == 0
  capsys.readouterr()
  before = _digests(out)
  run_id = json.loads((out / "run.json").read_text())["run_id"]
  assert json.loads((out / "plan.json").read_text())["run_id"] == run_id
  assert json.loads((out / "summary.json").read_text())["run_id"] == run_id
  assert json.loads((out / "config.json").read_text())["run_id"] == run_id

  args = _simulate_args(out, ["rounds=400", "noise_multiplier=1.6", "eval_every=400"], "--force")
  proc = _start_and_stop_after(args, out, 2, signal.SIGINT)
  assert proc.returncode == 130, proc.stderr
  assert _digests(out) == before  # Every file of the earlier run, byte for byte.
  assert _staging(out) == []  # Ctrl-C cleans up its staging directory.
  code, _, _ = _audit(capsys, out)
  assert code == 0 and json.loads((out / "plan.json").read_text())["noise_multiplier"] == 0.9

  # A finished --force run replaces the earlier one as a whole.
  assert cli_main.main(_simulate_args(out, ["rounds=3", "noise_multiplier=1.6"], "--force")) == 0
  capsys.readouterr()
  manifest = json.loads((out / "run.json").read_text())
  assert manifest["run_id"] != run_id and manifest["state"] == "finished"
  assert json.loads((out / "plan.json").read_text())["noise_multiplier"] == 1.6
  assert len((out / "participation.csv").read_text().splitlines()) - 1 == 3 * 4


def test_killed_run_leaves_a_staging_directory_that_says_what_to_do(tmp_path, capsys):
  out = tmp_path / "run"
  args = _simulate_args(out, ["rounds=400", "eval_every=400"])
  proc = _start_and_stop_after(args, out, 2, signal.SIGKILL)
  assert proc.returncode == -signal.SIGKILL
  assert not out.exists()  # Nothing under the name the user gave.
  (left,) = _staging(out)
  code, _, err = _audit(capsys, left)
  line = _one_line(err)
  assert code == 2
  assert "interrupted fedmf simulate" in line and f"rm -r {left}" in line, line
  assert "rounds done" in line and "was killed" in line, line
  # The next run into OUT names the leftover on its console, and still works.
  done = subprocess.run(
    _command(_simulate_args(out, ["rounds=2"])), env=_env(), capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr
  assert str(left) in done.stderr and "rm -r" in done.stderr
  assert (out / "run.json").is_file()


def test_audit_refuses_a_directory_mixing_runs(tmp_path, capsys):
  a, b = tmp_path / "a", tmp_path / "b"
  assert cli_main.main(_simulate_args(a, ["rounds=3", "noise_multiplier=0.9"])) == 0
  assert cli_main.main(_simulate_args(b, ["rounds=3", "noise_multiplier=1.6"])) == 0
  capsys.readouterr()
  assert _audit(capsys, a)[0] == 0
  mixed = tmp_path / "mixed"
  shutil.copytree(a, mixed)
  shutil.copy(b / "plan.json", mixed / "plan.json")  # The new σ beside the old log.
  code, _, err = _audit(capsys, mixed)
  line = _one_line(err)
  assert code == 2 and "plan.json" in line and "not audited" in line, line

  # Without run.json the ids in the JSON files still show the files belong to a run.
  shutil.copytree(a, tmp_path / "no_manifest")
  (tmp_path / "no_manifest" / "run.json").unlink()
  code, _, err = _audit(capsys, tmp_path / "no_manifest")
  assert code == 2 and "no run.json" in _one_line(err)

  # A file an audit reads that the run did not write is another run's.
  shutil.copytree(a, tmp_path / "extra")
  (tmp_path / "extra" / "participation.jsonl").write_text('{"round": 0, "client_id": "x"}\n')
  code, _, err = _audit(capsys, tmp_path / "extra")
  assert code == 2 and "mixes runs" in _one_line(err)


def _train_args(root, extra):
  return ["train", "--root", str(root), "--no-progress", *_sets(extra)]


def test_unfinished_train_root_is_refused_until_resumed(tmp_path, capsys):
  root = tmp_path / "root"
  # Killed after 2 released rounds: 6 rounds of margin, and a short resume (a checkpoint a round).
  extra = ["rounds=8", "checkpoint_every=1", "eval_every=8"]
  proc = subprocess.Popen(
    _command(_train_args(root, extra)),
    env=_env(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  journal = root / "journal.csv"
  while proc.poll() is None:
    if journal.exists() and len(journal.read_text().splitlines()) - 1 >= 2:
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.05)
  proc.wait(timeout=120)
  assert proc.returncode == -signal.SIGKILL
  code, _, err = _audit(capsys, root)
  line = _one_line(err)
  assert code == 2 and "unfinished fedmf train run" in line and "resume" in line, line
  # Resumed to the end, the same ROOT audits; the run id is kept across the resume.
  run_id = json.loads((root / "run.json").read_text())["run_id"]
  assert cli_main.main(_train_args(root, extra)) == 0
  capsys.readouterr()
  assert json.loads((root / "run.json").read_text())["run_id"] == run_id
  assert _audit(capsys, root)[0] == 0


def test_train_refuses_a_simulate_run_and_leaves_it_as_it_was(tmp_path, capsys):
  out = tmp_path / "sim"
  assert cli_main.main(_simulate_args(out, ["rounds=2"])) == 0
  capsys.readouterr()
  before = _digests(out)
  code = cli_main.main(_train_args(out, ["rounds=2"]))
  err = capsys.readouterr().err
  assert code == 2 and "fedmf simulate run" in _one_line(err)
  assert _digests(out) == before and not (out / ".lock").exists()


def _strict(path: Path):
  """Parses a JSON file as a strict reader would (no NaN, Infinity)."""

  def refuse(name):
    raise AssertionError(f"{path}: {name} is not JSON")

  return json.loads(path.read_text(), parse_constant=refuse)


def test_divergence_stops_the_program_naming_the_round_and_keeps_the_finite_checkpoint(
  tmp_path, capsys
):
  root = tmp_path / "root"
  extra = ["rounds=3", "checkpoint_every=1", "warmup_fraction=0", "server_learning_rate=1e30"]
  code = cli_main.main(_train_args(root, extra))
  line = _one_line(capsys.readouterr().err)
  assert code == 2 and line.startswith("fedmf train: error: round 1: training diverged"), line
  assert "nan" in line and "1 rounds done" in line
  import numpy as np  # pylint: disable=g-import-not-at-top

  assert sorted(p.name for p in (root / "release").iterdir()) == ["model_round_000001.npz"]
  with np.load(root / "release" / "model_round_000001.npz") as f:
    assert all(np.all(np.isfinite(f[k])) for k in f.files)
  assert "program_state_1" in {p.name for p in (root / "state").iterdir()}
  assert _strict(root / "run.json")["state"] == "running"  # Not a finished run: not audited.
  assert not (root / "metrics.csv").exists() or "nan" not in (root / "metrics.csv").read_text()


def test_divergence_stops_a_simulation_and_leaves_no_run(tmp_path, capsys):
  out = tmp_path / "run"
  extra = ["rounds=3", "server_learning_rate=1e30", "warmup_fraction=0"]
  code = cli_main.main(_simulate_args(out, extra))
  err = capsys.readouterr().err
  assert code == 2 and "round 1: training diverged (the training loss is nan)" in err
  assert not out.exists() and _staging(out) == []


def test_every_json_file_of_a_run_is_strict_json(tmp_path, capsys):
  out = tmp_path / "run"
  # σ = 0: no DP, so epsilon is infinite: written as null, never Infinity.
  assert cli_main.main(_simulate_args(out, ["rounds=2", "noise_multiplier=0"], "--json")) == 0
  stdout = capsys.readouterr().out
  assert "Infinity" not in stdout and "NaN" not in stdout
  for path in out.glob("*.json"):
    _strict(path)
  assert _strict(out / "audit.json")["epsilon"] is None


def test_json_text_writes_null_for_non_finite_numbers():
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedmf import jsonio  # pylint: disable=g-import-not-at-top

  text = jsonio.json_text(
    {"a": float("nan"), "b": [np.float32("inf"), -float("inf"), 1.5], "c": np.int64(3)},
    indent=None,
  )
  assert json.loads(text) == {"a": None, "b": [None, None, 1.5], "c": 3}


def test_a_file_written_by_tff_without_index_trains_read_only_and_unchanged(
  tmp_path, capsys, monkeypatch
):
  import stat  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.simulation.datasets import (  # pylint: disable=g-import-not-at-top
    sql_client_data_utils,
  )

  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path / "cache"))
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(30)]

  def sentences(count):
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 9)))) for _ in range(count)]

  data = {f"u{i:02d}": sentences(int(rng.integers(2, 10))) for i in range(12)}
  data.update({f"t{i}": sentences(6) for i in range(3)})
  splits = {c: ("test" if c.startswith("t") else "train") for c in data}
  directory = tmp_path / "so"
  directory.mkdir()
  path = directory / "stackoverflow.sqlite"
  sql_client_data_utils.save_to_sql_client_data(
    list(data),
    lambda c: tf.data.Dataset.from_tensor_slices({"tokens": data[c]}),
    str(path),
    split_names_by_client_id=splits,
  )
  before = path.read_bytes()
  path.chmod(stat.S_IRUSR | stat.S_IRGRP)
  directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
  try:
    out = tmp_path / "run"
    argv = ["simulate", "--out", str(out), "--no-progress", "--data-dir", str(directory)]
    for item in (
      "task=stackoverflow",
      "num_clients=12",
      "vocab_size=20",
      "rounds=2",
      "clients_per_round=3",
      "participation.min_sep=2",
      "test_sentences=10",
      "target_epsilon=8",
    ):
      argv += ["--set", item]
    code = cli_main.main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "indexing the clients" in captured.err
  finally:
    directory.chmod(stat.S_IRWXU)
  assert path.read_bytes() == before
  assert sorted(p.name for p in directory.iterdir()) == ["stackoverflow.sqlite"]


def test_a_symlinked_out_keeps_its_link_and_gets_the_run(tmp_path, capsys):
  real = tmp_path / "real"
  link = tmp_path / "link"
  assert cli_main.main(_simulate_args(real, ["rounds=2"])) == 0
  link.symlink_to(real, target_is_directory=True)
  assert cli_main.main(_simulate_args(link, ["rounds=3"], "--force")) == 0
  capsys.readouterr()
  assert (
    link.is_symlink() and json.loads((real / "summary.json").read_text())["rounds_completed"] == 3
  )
  assert _staging(real) == [] and _staging(link) == []
