"""One voice on the console and the small ones of issue 26 (C.8, C.11, A.5): only fedmf's lines in a
`fedmf train` run on a fresh machine, progress lines when not on a terminal, epsilon 0 explained,
plurals, unknown strategy fields refused, the model's memory estimated before it is built."""

import io
import os
import subprocess
import sys

import pytest

from fedmf.cli import main as cli_main
from fedmf.cli import simulate as simulate_cli
from fedmf.cli import strategy as strategy_cli
from fedmf.mf import strategies
from fedmf.mf.checks import StrategyError
from tests.helpers import settings

TINY = [
  "task=synthetic",
  "num_clients=60",
  "vocab_size=40",
  "clients_per_round=4",
  "max_sentences_per_client=16",
  "test_sentences=64",
  "participation.min_sep=3",
  "rounds=2",
  "checkpoint_every=1",
  "target_epsilon=8",
]

# What fedmf itself prints in a train run (stdout and stderr), line by line.
FEDMF_LINE_STARTS = (
  "starting ",
  "strategy: ",
  "participation: ",
  "noise multiplier: ",
  "planned privacy: ",
  "trained ",
  "  ",
  "round ",
  "rounds ",  # the progress lines off a terminal (issue 38 item 1)
)


def test_a_train_run_on_a_fresh_machine_prints_only_fedmf_lines(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "MPL"))}
  env["MPLCONFIGDIR"] = str(tmp_path / "mpl")  # A fresh font cache: matplotlib's first run.
  env["FEDMF_CACHE_DIR"] = str(tmp_path / "cache")
  args = [sys.executable, "-m", "fedmf.cli.main", "train", "--root", str(tmp_path / "root")]
  for item in TINY:
    args += ["--set", item]
  proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr
  lines = (proc.stdout + proc.stderr).splitlines()
  foreign = [line for line in lines if line.strip() and not line.startswith(FEDMF_LINE_STARTS)]
  assert foreign == [], foreign
  for word in ("tensorflow", "INFO", "Warning", "cuDNN", "matplotlib", "Assets written"):
    assert word not in proc.stdout + proc.stderr


def test_fedmf_info_lines_only_with_verbose(tmp_path):
  base = [sys.executable, "-m", "fedmf.cli.main"]
  opt = ["strategy", "optimize", "--mechanism", "dpsgd", "--n", "8", "--min-sep", "2"]
  opt += ["--max-participations", "2"]
  quiet = subprocess.run(
    base + opt + ["--out", str(tmp_path / "a.json")], capture_output=True, text=True, check=False
  )
  assert quiet.returncode == 0 and "INFO" not in quiet.stderr and "wrote" not in quiet.stderr
  loud = subprocess.run(
    base + ["-v"] + opt + ["--out", str(tmp_path / "b.json")],
    capture_output=True,
    text=True,
    check=False,
  )
  assert loud.returncode == 0 and "INFO fedmf.strategy: wrote" in loud.stderr


def test_optimizer_progress_is_plain_lines_when_not_a_terminal(monkeypatch):
  stream = io.StringIO()  # Not a terminal.
  monkeypatch.setattr(sys, "stderr", stream)
  bar = strategy_cli._Progress(True, 100, "optimize bandmf", every_seconds=0.0)
  for i in range(3):
    bar({"loss": 1.5 / (i + 1), "iteration": i})
  bar.close()
  lines = stream.getvalue().splitlines()
  assert [line.split("  elapsed")[0] for line in lines] == [
    "optimize bandmf: steps 1/100 done",
    "optimize bandmf: steps 2/100 done",
    "optimize bandmf: steps 3/100 done",
  ]
  assert [line.split("  ")[-1] for line in lines] == ["loss 1.5", "loss 0.75", "loss 0.5"]
  assert all(" ETA at most " in line for line in lines)  # It may converge before step 100.
  assert "\r" not in stream.getvalue()


def test_account_explains_an_epsilon_of_zero(tmp_path, capsys):
  path = tmp_path / "dpsgd.json"
  strategies.save_strategy(strategies.load_strategy({"mechanism": "dpsgd"}), path)
  argv = ["account", str(path), "--n", "10", "--min-sep", "2", "--max-participations", "2"]
  code = cli_main.main(argv + ["--target-epsilon", "1e-12", "--delta", "1e-6"])
  out = capsys.readouterr().out
  assert code == 0 and "epsilon: 0 at delta" in out
  assert "(0, 1e-06)-DP holds" in out


def test_unknown_strategy_field_is_refused_naming_the_close_one():
  obj = {"mechanism": "blt", "buf_decay": [0.5], "output_scale": [0.1], "bufdecay": [0.2]}
  with pytest.raises(StrategyError, match="unknown strategy field 'bufdecay'.*'buf_decay'"):
    strategies.load_strategy(obj)
  kept = strategies.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.5], "output_scale": [0.1], "note": "x"}
  )
  assert kept.metadata == {"note": "x"}


def test_plurals_and_no_strategy_named_without_dp():
  summary = {
    "rounds_completed": 1,
    "noise_multiplier": 0.0,
    "strategy": "blt (1 buffer)",
    "clients_per_round": 1,
    "num_clients": 1,
    "seconds": 1.0,
    "initial_test_accuracy": 0.1,
    "final_test_accuracy": 0.2,
    "accuracy_note": "note",
    "refused_checkins": 0,
    "violations": 0,
    "audit": {
      "observed_min_sep": None,
      "observed_max_participations": 1,
      "epsilon": None,
      "delta": 1e-6,
      "privacy_guarantee": False,
    },
  }
  first = simulate_cli.summary_lines(summary, "/nonexistent")[0]
  assert first.startswith("simulated 1 round of FedAvg without DP (1 of 1 client per round)")
  assert "blt" not in first
  lines = simulate_cli.summary_lines({**summary, "zeroed_updates": 2}, "/nonexistent")
  assert "  updates zeroed       2 (non-finite or above zeroing_linf" in "\n".join(lines)
  assert "zeroed" not in "\n".join(simulate_cli.summary_lines(summary, "/nonexistent"))
  blt = strategies.load_strategy({"mechanism": "blt", "buf_decay": [0.5], "output_scale": [0.1]})
  assert blt.describe() == "blt (1 buffer)"


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(tmp_path, capsys):
  out = tmp_path / "run"
  argv = ["simulate", "--out", str(out), "--no-progress"]
  for item in settings(TINY[:-3], ["vocab_size=1000000000", "rounds=2", "target_epsilon=8"]):
    argv += ["--set", item]
  code = cli_main.main(argv)
  err = capsys.readouterr().err
  assert code == 2 and "float32 parameters" in err and "--max-memory" in err, err
  assert not out.exists()


def test_one_call_quiets_tensorflow_in_a_users_script():
  script = (
    "import logging, sys\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "import fedmf.console\n"
    "fedmf.console.quiet_tensorflow()\n"
    "import tensorflow as tf\n"
    "tf.get_logger().info('Assets written to: x')\n"
    "logging.getLogger('matplotlib.font_manager').info('generated new fontManager')\n"
    "tf.get_logger().warning('a real warning')\n"
  )
  env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
  proc = subprocess.run(
    [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
  )
  assert proc.returncode == 0, proc.stderr
  assert [line for line in proc.stderr.splitlines() if line.strip()] == [
    "WARNING:tensorflow:a real warning"
  ]
