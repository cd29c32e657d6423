"""Bad input is refused in one line before TensorFlow is imported (issue 26, C.9 and C.11): config
values with no effect, --out under /proc or below a file, a finished run without --force, a
simulate run given to `fedmf train --root` (no .lock left behind)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRAIN_CONFIG = str(REPO / "deploy" / "configs" / "train.yaml")

_PROBE = (
  "import sys\n"
  "from fedmf.cli.main import main\n"
  "code = main(sys.argv[1:])\n"
  "print('tensorflow imported' if 'tensorflow' in sys.modules else 'no tensorflow')\n"
  "sys.exit(code)\n"
)


def _refused(*argv):
  """Runs `fedmf ARGV` in a fresh interpreter; returns its one error line (exit 2, no TF)."""
  proc = subprocess.run(
    [sys.executable, "-c", _PROBE, *map(str, argv)], capture_output=True, text=True, check=False
  )
  assert proc.returncode == 2, proc.stderr
  assert proc.stdout.strip() == "no tensorflow", proc.stdout
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
  return lines[0]


@pytest.mark.parametrize(
  "setting, expected",
  [
    ("participation.min_sep=0", "participation.min_sep must be an integer >= 1, got 0"),
    ("participation.min_sep=5", "participation.min_sep has no effect here (the hours timer"),
    ("bands=4", "bands has no effect here (mechanism is blt, not bandmf)"),
  ],
)
def test_train_refuses_a_value_with_no_effect_before_tensorflow(tmp_path, setting, expected):
  line = _refused("train", "--config", TRAIN_CONFIG, "--root", tmp_path / "r", "--set", setting)
  assert expected in line, line
  assert not (tmp_path / "r").exists()


def test_simulate_refuses_a_key_of_another_participation_model(tmp_path):
  line = _refused("simulate", "--out", tmp_path / "o", "--set", "participation.timer_hours=12")
  assert "participation.timer_hours has no effect here" in line, line
  assert "timer_unit is not hours" in line


def test_out_under_proc_is_refused_before_any_work(tmp_path):
  line = _refused("simulate", "--out", "/proc/fedmf-test/run", "--set", "rounds=2")
  assert "cannot create /proc/fedmf-test/run" in line and "does not accept" in line, line


def test_out_below_a_file_names_the_file(tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("x")
  line = _refused(
    "strategy", "optimize", "--mechanism", "dpsgd", "--n", "8", "--min-sep", "2",
    "--max-participations", "2", "--out", afile / "x.json",
  )  # fmt: skip
  assert f"{afile} is a file, not a directory" in line, line


def test_finished_run_and_simulate_run_as_train_root_are_refused_before_tensorflow(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  (run / "summary.json").write_text("{}")
  (run / "participation.csv").write_text("round,client_id\n0,a\n")
  (run / "run.json").write_text(
    json.dumps({"run_id": "r1", "command": "simulate", "state": "finished", "files": {}})
  )
  line = _refused("simulate", "--out", run, "--set", "rounds=2")
  assert "already holds a run" in line and "--force" in line, line
  line = _refused("train", "--config", TRAIN_CONFIG, "--root", run)
  assert "holds a fedmf simulate run" in line, line
  assert not (run / ".lock").exists()


def test_a_non_run_directory_is_never_replaced(tmp_path):
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("my notes")
  line = _refused("simulate", "--out", mine, "--force", "--set", "rounds=2")
  assert "not a fedmf run's (notes.txt)" in line, line
  assert (mine / "notes.txt").read_text() == "my notes"


def test_simulate_does_not_suggest_a_flag_it_does_not_have(tmp_path, capsys):
  from fedmf.cli import main as cli_main  # pylint: disable=g-import-not-at-top

  argv = ["simulate", "--out", str(tmp_path / "o"), "--no-progress"]
  for item in (
    "num_clients=60",
    "vocab_size=40",
    "clients_per_round=4",
    "max_sentences_per_client=16",
    "test_sentences=64",
    "rounds=2",
    "noise_multiplier=1e300",
  ):
    argv += ["--set", item]
  code = cli_main.main(argv)
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1 and "noise_multiplier" in lines[0], err
  assert "--accountant" not in err  # a flag simulate does not have
  assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
  "settings, expected",
  [
    # Issue 38 item 12: refused after 26-60 s (TensorFlow, then the data) before.
    (["vocab_size=700000000"], "training lstm-small at vocab_size 700000000 needs about 11.9 TiB"),
    # Item 13: cyclic Poisson sampling that cannot work, refused after 74 s and 32 s before.
    (
      [
        "participation.model=cyclic-poisson",
        "participation.partitions=5",
        "participation.sampling_probability=0.5",
      ],
      "expected cohort q·num_clients/partitions = 200 devices, but clients_per_round is 20: set "
      "clients_per_round to 200, or participation.sampling_probability to 0.05",
    ),
    (
      ["participation.model=cyclic-poisson", "participation.partitions=100000"],
      "needs num_clients >= groups × clients_per_round = 2000000, got 2000: lower "
      "participation.partitions to at most 100",
    ),
  ],
)
@pytest.mark.parametrize("command", ["simulate", "train"])
def test_runs_that_cannot_work_are_refused_before_tensorflow_and_data(
  tmp_path, command, settings, expected
):
  where = ["--out", tmp_path / "o"] if command == "simulate" else ["--root", tmp_path / "r"]
  args = [command, *where]
  for setting in settings:
    args += ["--set", setting]
  line = _refused(*args)
  assert expected in line, line
  assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()
