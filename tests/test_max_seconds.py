"""--max-seconds holds on a slow machine too (issue 38 item 2): work the estimate let through is
stopped, with one line naming the flag, once it has run longer than the limit.

The machine is made "slow" by a fake clock that jumps 50 s at every reading: the estimates (at
nominal rates) pass, the clock does not. Nothing here depends on the real machine's speed."""

import csv

import pytest

from fedmf.cli import main as cli_main
from fedmf.mf import resources
from fedmf.mf import strategies


@pytest.fixture
def slow_machine(monkeypatch):
  now = [0.0]

  def clock():
    now[0] += 50.0
    return now[0]

  monkeypatch.setattr(resources, "clock", clock)


def _one_line(capsys, code):
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2 and len(lines) == 1, err
  return lines[0]


def test_the_clock_stops_work_inside_its_block_only(slow_machine):
  resources.check_time()  # Outside a block: nothing to stop.
  with resources.limits(max_seconds=120):
    with resources.time_limit("optimizing bandmf at n=2052"):
      resources.check_time()  # 50 s in: within the limit.
      with resources.time_limit("an inner step"):  # The outer clock goes on.
        resources.check_time()  # 100 s in.
        with pytest.raises(resources.ResourceLimitError) as e:
          resources.check_time()
  assert str(e.value) == (
    "optimizing bandmf at n=2052 was stopped after 150 s, past the limit of 120 s (this "
    "machine ran slower than estimated; --max-seconds S raises the limit)"
  )


@pytest.mark.parametrize("mechanism", ["bandmf", "blt", "band-toeplitz"])
def test_strategy_optimize_is_stopped_past_the_limit(slow_machine, tmp_path, capsys, mechanism):
  out = tmp_path / "s.json"
  code = cli_main.main(
    ["strategy", "optimize", "--mechanism", mechanism, "--n", "64", "--min-sep", "8"]
    + ["--max-participations", "8", "--out", str(out), "--max-seconds", "120", "--no-progress"]
  )
  line = _one_line(capsys, code)
  assert line.startswith("fedmf strategy: error: fedmf strategy optimize was stopped after")
  assert "--max-seconds S raises the limit" in line
  assert not out.exists()


def test_an_amplified_calibration_is_stopped_past_the_limit(slow_machine, tmp_path, capsys):
  path = tmp_path / "dpsgd.json"
  strategies.save_strategy(strategies.load_strategy({"mechanism": "dpsgd"}), path)
  code = cli_main.main(
    ["account", str(path), "--n", "100", "--target-epsilon", "2", "--delta", "1e-6"]
    + ["--dataset-size", "100000", "--batch-size", "100"]
  )
  assert "fedmf account was stopped after" in _one_line(capsys, code)


def test_the_audit_of_a_log_is_stopped_past_the_limit(slow_machine, tmp_path, capsys):
  path = tmp_path / "dpsgd.json"
  strategies.save_strategy(strategies.load_strategy({"mechanism": "dpsgd"}), path)
  log = tmp_path / "log.csv"
  with open(log, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["round", "client_id"])
    writer.writerows([r, f"c{r % 7}"] for r in range(100))
  code = cli_main.main(
    ["audit", str(log), "--strategy", str(path), "--noise-multiplier", "1", "--delta", "1e-6"]
    + ["--rounds", "100", "--no-progress", "--max-seconds", "30"]  # A one-batch log: one check.
  )
  assert "fedmf audit was stopped after" in _one_line(capsys, code)
