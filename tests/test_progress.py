"""fedmf.progress and fedmf.display: progress lines off a terminal (issue 38 item 1), one ε rule."""

import io
import time

import pytest

from fedmf import display
from fedmf import progress


class Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def _progress(total, **kw):
  clock = Clock()
  out = io.StringIO()  # Not a terminal: plain lines.
  bar = progress.Progress(total, stream=out, clock=clock, heartbeat=False, **kw)
  return bar, clock, out


def test_a_line_every_n_steps_with_elapsed_recent_rate_and_eta():
  bar, clock, out = _progress(40, every=10)
  for r in range(40):
    clock.now += 2.0
    bar.update(r + 1, {"loss": f"{4 - r / 10:.3f}"})
  lines = out.getvalue().splitlines()
  assert len(lines) == 4, lines
  assert lines[0].startswith("rounds 10/40 done  elapsed 20 s  recent 2.0 s/round  ETA 1m 00s")
  assert lines[0].endswith("loss 3.100")
  assert "ETA 0 s (done)" in lines[-1] and lines[-1].startswith("rounds 40/40 done")
  assert "\r" not in out.getvalue()


def test_a_line_every_30_seconds_when_steps_are_slower_than_that():
  bar, clock, out = _progress(40, every=10)
  clock.now += 31.0
  bar.update(1)
  clock.now += 10.0
  bar.update(2)  # 10 s after the last line: not yet.
  clock.now += 25.0
  bar.update(3)
  lines = out.getvalue().splitlines()
  assert [line.split("  ")[0] for line in lines] == ["rounds 1/40 done", "rounds 3/40 done"]
  assert "ETA unknown" not in lines[0] and "ETA" in lines[0]


def test_a_step_running_longer_than_30_seconds_is_not_silent():
  """The first round (tracing) or a stalled worker: the background tick says it is running."""
  bar, clock, out = _progress(40)
  clock.now += 29.0
  assert not bar.tick()
  clock.now += 2.0
  assert bar.tick()
  line = out.getvalue().splitlines()[-1]
  assert line.startswith("rounds 0/40 done  (round 0 running for 31 s)  elapsed 31 s")
  assert "ETA unknown until the first round ends" in line
  bar.update(1)
  clock.now += 40.0
  assert bar.tick()
  assert "rounds 1/40 done  (round 1 running for 40 s)  elapsed 1m 11s  recent 31 s/round" in (
    out.getvalue()
  )


def test_the_recent_rate_forgets_a_slow_start():
  bar, clock, out = _progress(100, every=50, window=10)
  clock.now += 60.0  # A slow first round (tracing).
  bar.update(1)
  for r in range(1, 50):
    clock.now += 1.0
    bar.update(r + 1)
  line = out.getvalue().splitlines()[-1]
  assert line.startswith("rounds 50/100 done")
  assert "recent 1.0 s/round  ETA 50 s" in line  # Not (60 + 49) / 50 s per round.


def test_unknown_totals_bounds_and_bytes():
  bar, clock, out = _progress(None, unit="step", label="optimize bandmf", every=None)
  clock.now += 31
  bar.update(5)
  assert out.getvalue().startswith("optimize bandmf: steps 5 done  elapsed 31 s")
  assert "ETA unknown (total not known in advance)" in out.getvalue()
  bar, clock, out = _progress(100, unit="step", every=None, total_is_bound=True)
  clock.now += 31
  bar.update(10)
  assert "ETA at most 4m 39s" in out.getvalue()
  bar, clock, out = _progress(10 * 2**20, byte_sizes=True, every=None, label="reading log.csv")
  clock.now += 40
  bar.update(4 * 2**20)
  assert out.getvalue().startswith("reading log.csv: read 4 MiB/10 MiB  elapsed 40 s")
  assert "recent 102 KiB/s  ETA 1m 00s" in out.getvalue()


def test_stages_before_the_steps_and_a_resumed_start():
  bar, clock, out = _progress(40, stage="preparing the run")
  clock.now += 45
  assert bar.tick()
  assert out.getvalue().startswith("rounds 0/40 done  (preparing the run: 45 s)  elapsed 45 s  ETA")
  bar.start_at(12)
  bar.set_stage(None)
  clock.now += 3
  bar.update(13)
  clock.now += 3
  bar.update(14)
  clock.now += 30
  assert bar.tick()
  line = out.getvalue().splitlines()[-1]
  # The 45 s of preparation are not a round's: 3 s per round since.
  assert (
    "rounds 14/40 done  (round 14 running for 30 s)  elapsed 1m 21s  recent 3.0 s/round" in line
  )
  assert "ETA 48 s" in line  # 26 rounds x 3 s, less the 30 s round 14 has run.


def test_disabled_and_closed_progress_write_nothing():
  bar, clock, out = _progress(10, enabled=False)
  clock.now += 100
  bar.update(5)
  assert not bar.tick()
  assert out.getvalue() == ""
  bar, clock, out = _progress(10)
  bar.close()
  clock.now += 100
  assert not bar.tick()


def test_the_background_thread_writes_without_updates():
  out = io.StringIO()
  bar = progress.Progress(10, stream=out, seconds=0.05)
  try:
    deadline = time.monotonic() + 10
    while "running for" not in out.getvalue() and time.monotonic() < deadline:
      time.sleep(0.02)
  finally:
    bar.close()
  assert "rounds 0/10 done  (round 0 running for" in out.getvalue()
  assert bar._thread is None


@pytest.mark.parametrize(
  "value, shown",
  [
    (8.0, "8"),
    (7.9994, "8"),
    (8.004, "8.01"),
    (5.6, "5.6"),
    (4.79, "4.79"),
    (4.791, "4.8"),
    (0.012301, "0.0124"),
    (1234.5, "1.24e+03"),
    (float("inf"), "inf"),
    (None, "-"),
    (0.0, "0"),
  ],
)
def test_epsilon_is_shown_with_three_digits_never_below_the_truth(value, shown):
  assert display.epsilon(value) == shown
  if value not in (None, 0.0) and value != float("inf"):
    assert float(display.epsilon(value)) >= value


def test_durations_read_as_people_write_them():
  assert [display.duration(s) for s in (0.84, 42.2, 185, 3725, None)] == [
    "0.8 s",
    "42 s",
    "3m 05s",
    "1h 02m",
    "-",
  ]
