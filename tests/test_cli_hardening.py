"""`fedmf strategy` and `fedmf account` under hostile input (issue 14): one line on stderr, exit 2,
no traceback, nothing left behind; SIGTERM exits 143 after the same cleanup as Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmf.mf import dpsgd, evaluation, strategies as st
from tests.helpers import one_line_error, run_cli

P = ["--n", "24", "--min-sep", "4", "--max-participations", "3"]
ROOT = Path(__file__).resolve().parents[1]


def _optimize(out, *extra):
  return ["strategy", "optimize", "--mechanism", "dpsgd", *P, "--out", str(out), *extra]


def test_out_pointing_at_a_directory_leaves_nothing(tmp_path, capsys):
  code, _, err = run_cli(capsys, *_optimize(tmp_path))
  one_line_error(code, None, err, "--out", "is a directory")
  assert list(tmp_path.iterdir()) == []
  assert not Path(str(tmp_path) + ".tmp").exists()


def test_out_existing_needs_force(tmp_path, capsys):
  target = tmp_path / "s.json"
  target.write_text("keep me")
  code, _, err = run_cli(capsys, *_optimize(target))
  one_line_error(code, None, err, "--out", "exists; pass --force")
  assert target.read_text() == "keep me"
  code, _, err = run_cli(capsys, *_optimize(target, "--force", "--no-progress"))
  assert code == 0, err
  assert json.loads(target.read_text())["mechanism"] == "dpsgd"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


@pytest.mark.parametrize("seed", ["-1", str(2**64), str(2**130), "1.5", "0x10"])
def test_optimizer_seed_must_fit_64_bits(tmp_path, capsys, seed):
  code, _, err = run_cli(capsys, *_optimize(tmp_path / "s.json", "--seed", seed))
  one_line_error(code, None, err, "--seed", "[0, 2^64)")


def test_largest_seed_is_accepted(tmp_path, capsys):
  args = ["strategy", "optimize", "--mechanism", "blt", "--buffers", "1", *P, "--no-progress"]
  code, _, err = run_cli(
    capsys, *args + ["--seed", str(2**64 - 1), "--out", str(tmp_path / "b.json")]
  )
  assert code == 0, err


@pytest.mark.parametrize(
  "argv, needles",
  [
    (
      [
        "strategy",
        "evaluate",
        "x.json",
        "--n",
        "-3",
        "--min-sep",
        "1",
        "--max-participations",
        "1",
      ],
      ["--n", "positive integer", "--help"],
    ),
    (
      ["account", "x.json", "--n", "3", "--noise-multiplier", "abc", "--delta", "1e-5"],
      ["--noise-multiplier", "'abc'"],
    ),
    (
      ["account", "x.json", "--n", "3", "--noise-multiplier", "1e400", "--delta", "1e-5"],
      ["--noise-multiplier", "finite"],
    ),
    (
      ["account", "x.json", "--n", "9" * 5000, "--noise-multiplier", "1", "--delta", "1e-5"],
      ["--n", "..."],
    ),
    (["strategy", "evaluate"], ["required"]),
  ],
)
def test_usage_errors_are_one_line(capsys, argv, needles):
  code, _, err = run_cli(capsys, *argv)
  line = one_line_error(code, None, err, *needles)
  assert len(line) < 300


def _write(tmp_path, obj):
  path = tmp_path / "s.json"
  path.write_text(json.dumps(obj))
  return str(path)


def test_evaluate_refuses_work_it_cannot_finish(tmp_path, capsys):
  dpsgd_file = _write(tmp_path, {"mechanism": "dpsgd"})
  code, out, err = run_cli(
    capsys,
    *[
      "strategy",
      "evaluate",
      dpsgd_file,
      "--n",
      str(10**18),
      "--min-sep",
      "1",
      "--max-participations",
      "1",
    ],
  )
  one_line_error(code, None, err, "n=1000000000000000000", "EiB", "limit of 4 GiB", "--max-memory")
  assert out == ""
  tree = _write(tmp_path, {"mechanism": "tree"})

  def evaluate_tree(n, *flags):
    return [
      "strategy",
      "evaluate",
      tree,
      "--n",
      str(n),
      "--min-sep",
      "10",
      "--max-participations",
      "5",
      *flags,
    ]

  code, _, err = run_cli(capsys, *evaluate_tree(10_000))
  one_line_error(code, None, err, "dense 10000×19995 tree decoder", "limit of 4 GiB")
  code, _, err = run_cli(capsys, *evaluate_tree(24, "--max-seconds", "1e-6"))
  one_line_error(code, None, err, "above the limit of 1e-06 s", "--max-seconds")
  code, _, err = run_cli(capsys, *evaluate_tree(24, "--max-memory", "1e-6"))
  one_line_error(code, None, err, "above the limit of 1.05 KiB", "--max-memory")
  code, out, err = run_cli(capsys, *evaluate_tree(24, "--max-memory", "1", "--max-seconds", "60"))
  assert code == 0 and "sensitivity" in out, err


def test_column_normalized_toeplitz_at_20000_rounds_allocates_no_dense_matrix(tmp_path, capsys):
  path = _write(
    tmp_path,
    {"mechanism": "band-toeplitz", "coefficients": [1, 0.5, 0.25], "column_normalized": True},
  )
  strategy = st.load_strategy(path)
  schema = evaluation.ParticipationSchema(20_000, 10, 5)
  cost = strategy.evaluation_cost(schema)
  assert cost.memory_bytes < 20_000 * 100 * 8  # O(n·b̂), not 3.2 GB
  stream = strategy.noise_stream(20_000)  # its row norms come without the n×n inverse
  assert stream.horizon == 20_000 and stream.row_norm_table.shape == (20_000,)


@pytest.mark.parametrize(
  "flags, needles",
  [
    (["--noise-multiplier", "1e-300"], ["noise multiplier 1e-300 is too small", "exceeds 1e+06"]),
    # PLD's limits (the claim's default accountant, the exact curve, has neither).
    (
      ["--noise-multiplier", "1e300", "--accountant", "pld"],
      ["PLD accountant's range", "--accountant analytic"],
    ),
    (
      ["--target-epsilon", "1e9", "--accountant", "pld"],
      ["PiB of memory", "limit of 4 GiB", "--accountant analytic"],
    ),
    (["--target-epsilon", "1e30", "--accountant", "analytic"], ["too large to calibrate"]),
  ],
)
def test_account_refuses_out_of_range_numbers(tmp_path, capsys, flags, needles):
  path = _write(tmp_path, {"mechanism": "dpsgd"})
  code, out, err = run_cli(capsys, *["account", path, "--n", "10", *flags, "--delta", "1e-5"])
  one_line_error(code, None, err, *needles)
  assert out == ""


def test_account_defaults_to_the_exact_curve_of_the_claim(tmp_path, capsys):
  """A claim is accounted by the analytic curve unless --accountant pld is asked for: it answers
  where PLD's grid or range refuses, and says which accountant it used."""
  path = _write(tmp_path, {"mechanism": "dpsgd"})
  for flags in (["--noise-multiplier", "1e300"], ["--target-epsilon", "1e9"]):
    code, out, err = run_cli(
      capsys, "account", path, "--n", "10", *flags, "--delta", "1e-5", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["accountant"] == "analytic"


def test_account_at_ten_million_rounds_is_refused_or_quick(tmp_path, capsys):
  blt = _write(tmp_path, {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]})
  base = ["account", blt, "--n", str(10**7), "--noise-multiplier", "1", "--delta", "1e-5"]
  code, _, err = run_cli(capsys, *base + ["--min-sep", "1"])
  one_line_error(code, None, err, "n=10000000", "estimated", "--max-seconds")


def test_an_rmse_that_overflows_is_refused(tmp_path, capsys):
  path = _write(tmp_path, {"mechanism": "dpsgd"})
  argv = ["strategy", "evaluate", path, *P, "--noise-multiplier", "1.7e308"]
  code, out, err = run_cli(capsys, *argv)
  one_line_error(code, None, err, "--noise-multiplier 1.7e+308", "overflows float64")
  assert out == ""


def test_evaluate_never_prints_non_finite_numbers(monkeypatch):
  strategy = st.load_strategy({"mechanism": "dpsgd"})
  monkeypatch.setattr(
    dpsgd.DpSgd, "decoder_row_sq_norms", lambda self, n, workload=None: [float("inf")] * n
  )
  with pytest.raises(st.StrategyError, match="overflows float64"):
    evaluation.evaluate(strategy, 10)


# --- signals ----------------------------------------------------------------------------------


def test_sigterm_exits_143_after_cleanup_in_process(tmp_path, capsys, monkeypatch):
  before = signal.getsignal(signal.SIGTERM)
  target = tmp_path / "s.json"

  def terminated_while_writing(src, dst):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this returns

  monkeypatch.setattr(st.os, "replace", terminated_while_writing)
  code, out, err = run_cli(capsys, *_optimize(target, "--no-progress"))
  assert code == 143
  assert err.strip().splitlines() == ["fedmf strategy: terminated (SIGTERM)"]
  assert list(tmp_path.iterdir()) == []  # neither the .tmp nor a half-written file
  assert signal.getsignal(signal.SIGTERM) is before


_SLOW_OPTIMIZER = """
import sys, time
from pathlib import Path
from fedmf.mf import dpsgd

def slow(cls, schema, options):
  Path(sys.argv[1]).write_text("started")
  time.sleep(60)

dpsgd.DpSgd.optimize = classmethod(slow)
from fedmf.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_in_a_subprocess(tmp_path):
  marker, target = tmp_path / "started", tmp_path / "out" / "s.json"
  target.parent.mkdir()
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.Popen(
    [sys.executable, "-c", _SLOW_OPTIMIZER, str(marker), *_optimize(target, "--no-progress")],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
  )
  try:
    deadline = time.monotonic() + 120
    while not marker.exists():
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 143, err
  assert err.strip().splitlines() == ["fedmf strategy: terminated (SIGTERM)"]
  assert list(target.parent.iterdir()) == []


_SIGTERM_IN_A_GC_CALLBACK = """
import gc, os, signal, sys, time
from pathlib import Path
from fedmf.mf import dpsgd

def slow(cls, schema, options):
  Path(sys.argv[1]).write_text("started")
  for _ in range(600):  # Garbage to collect, for a minute at most.
    [[] for _ in range(1000)]
    time.sleep(0.1)

def _xla_gc_callback(phase, info):  # As JAX registers it: the signal lands inside it.
  if phase == "start" and not sent and Path(marker).exists():
    sent.append(1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)

sent, marker = [], sys.argv[1]
gc.callbacks.append(_xla_gc_callback)
dpsgd.DpSgd.optimize = classmethod(slow)
from fedmf.cli.main import main
code = main(sys.argv[2:])
gc.callbacks.remove(_xla_gc_callback)
sys.exit(code)
"""


def test_a_sigterm_inside_a_gc_callback_still_terminates_in_one_line(tmp_path):
  """Issue 38 item 17: the handler raised inside JAX's garbage-collection callback, where Python
  prints "Exception ignored in: <function _xla_gc_callback ...>" with a traceback and drops the
  exception: the run went on. The signal is now delivered again outside the callback."""
  marker, target = tmp_path / "started", tmp_path / "out" / "s.json"
  target.parent.mkdir()
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run(
    [sys.executable, "-c", _SIGTERM_IN_A_GC_CALLBACK, str(marker)]
    + _optimize(target, "--no-progress"),
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
  )
  assert marker.exists()
  assert proc.returncode == 143, proc.stderr
  assert proc.stderr.strip().splitlines() == ["fedmf strategy: terminated (SIGTERM)"]
  assert list(target.parent.iterdir()) == []


def test_a_second_sigterm_during_the_cleanup_is_not_a_traceback(tmp_path, capsys, monkeypatch):
  """`timeout` (or a second kill) landing while the first SIGTERM's cleanup runs."""
  target = tmp_path / "s.json"

  def terminated_while_writing(src, dst):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler raises before this returns

  real_unlink = os.unlink

  def second_sigterm_in_cleanup(path):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    real_unlink(path)

  monkeypatch.setattr(st.os, "replace", terminated_while_writing)
  monkeypatch.setattr(st.os, "unlink", second_sigterm_in_cleanup)
  code, out, err = run_cli(capsys, *_optimize(target, "--no-progress"))
  assert code == 143
  assert err.strip().splitlines() == ["fedmf strategy: terminated (SIGTERM)"]
  assert list(tmp_path.iterdir()) == []
