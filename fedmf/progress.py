"""Progress of a long loop, for people: a bar on a terminal, plain lines with an ETA elsewhere.

One concept, shared by every long command (`fedmf simulate`, `fedmf train`, `strategy optimize`,
the audit's log scan; `fedmf public-features` may use it too): `Progress(total, unit=...)`, told
after each step how many steps are done.

* On a terminal: a tqdm bar (it redraws one line with carriage returns, which only a terminal shows
  as one line).
* Off a terminal (a log file, nohup, CI, a notebook): a plain line every `every` steps or every
  `seconds` seconds, whichever comes first; also while a step is still running (a background
  thread wakes every `seconds`), so a slow first round or a stalled worker is never silent. Each
  line names the steps done, the elapsed time, the recent time per step (over the last `window`
  steps, so a slow start stops counting once it is past) and the ETA, then the caller's fields:

    rounds 20/150 done  elapsed 48 s  recent 1.9 s/round  ETA 4m 07s  loss 4.213  epsilon 3.31

Why not tqdm's own output off a terminal: it redraws with carriage returns (one growing line in a
file) and says nothing between two updates. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional

from fedmf import display

# Off a terminal: at most this long between two lines (the contract: every 30 s).
LINE_SECONDS = 30.0


def _bytes(value: float) -> str:
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if value >= size:
      return f"{value / size:.3g} {unit}"
  return f"{value:.0f} B"


class Progress:
  """Steps done out of `total` (None: unknown), shown as the module docstring says.

  Args:
    total: the steps of the whole loop (None when unknown: no ETA is given).
    unit: what a step is, e.g. 'round' (lines say 'rounds 3/10 done', 'recent 2.0 s/round').
    label: a prefix naming the work, e.g. 'optimize bandmf' (None: none).
    every: a line at least every this many steps (None: by time only).
    seconds: a line at least every this many seconds, also within a step.
    stream: where to write (default: stderr).
    enabled: False shows nothing.
    initial: steps already done before this process (a resumed run).
    total_is_bound: the loop may end before `total` (an optimizer's iteration budget): the ETA
      is then an upper bound and said so ('ETA at most ...').
    byte_sizes: steps are bytes (a file read): sizes in KiB/MiB/GiB and a rate per second.
    window: the recent rate is over the last this many steps.
    clock: the time source (tests pass a fake one).
    heartbeat: off a terminal, a background thread writes a line when `seconds` pass without one.
    stage: what runs before the first step (e.g. 'preparing the run'); see `set_stage`.
  """

  def __init__(
    self,
    total: Optional[int],
    *,
    unit: str = "round",
    label: Optional[str] = None,
    every: Optional[int] = 10,
    seconds: float = LINE_SECONDS,
    stream=None,
    enabled: bool = True,
    initial: int = 0,
    total_is_bound: bool = False,
    byte_sizes: bool = False,
    window: int = 10,
    clock: Callable[[], float] = time.monotonic,
    heartbeat: bool = True,
    stage: Optional[str] = None,
  ):
    self.stream = stream or sys.stderr
    self.total = total
    self.unit = unit
    self.label = label
    self.every = None if every is None else max(1, int(every))
    self.seconds = float(seconds)
    self.enabled = enabled
    self.total_is_bound = total_is_bound
    self.byte_sizes = byte_sizes
    self.clock = clock
    self.start = clock()
    self.done = int(initial)
    self.fields: dict[str, str] = {}
    self._initial = int(initial)
    self._recent = collections.deque([(self.done, self.start)], maxlen=max(2, window + 1))
    self._last_line = self.start
    self._stage = stage
    self._stage_start = self.start
    self._last_line_done = self.done
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._thread = None
    self._bar = None
    if not enabled:
      return
    if _isatty(self.stream):
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top

      self._bar = tqdm(
        total=total,
        initial=initial,
        unit="B" if byte_sizes else unit,
        unit_scale=byte_sizes,
        unit_divisor=1024,
        desc=label,
        file=self.stream,
        dynamic_ncols=True,
        leave=not byte_sizes,
      )
    elif heartbeat and self.seconds > 0:
      self._thread = threading.Thread(target=self._beat, name="fedmf-progress", daemon=True)
      self._thread.start()

  # -- the caller's side ------------------------------------------------------------------------

  def update(self, done: Optional[int] = None, fields: Optional[Mapping[str, Any]] = None) -> None:
    """`done` steps are done now (default: one more); `fields` are shown after the times."""
    if not self.enabled:
      return
    with self._lock:
      done = self.done + 1 if done is None else int(done)
      advanced = done - self.done
      self.done = done
      if fields is not None:
        self.fields = {k: str(v) for k, v in fields.items()}
      now = self.clock()
      if advanced > 0:
        self._recent.append((done, now))
      if self._bar is not None:
        if advanced > 0:
          self._bar.update(advanced)
        if self.fields:
          self._bar.set_postfix(self.fields, refresh=False)
        return
      due_steps = self.every is not None and (
        done // self.every > self._last_line_done // self.every
      )
      finished = self.total is not None and done >= self.total and not self.byte_sizes
      if due_steps or finished or now - self._last_line >= self.seconds:
        self._write(now)

  def set_stage(self, stage: Optional[str]) -> None:
    """Names work outside the steps (preparing, auditing), shown on lines until set to None."""
    with self._lock:
      self._stage, self._stage_start = stage, self.clock()
      if stage is None:  # Steps start now: the time before them is not a step's.
        self._recent.clear()
        self._recent.append((self.done, self._stage_start))

  def start_at(self, done: int) -> None:
    """The loop starts at `done` steps (a resumed run learns it after it was created)."""
    with self._lock:
      self.done = self._last_line_done = int(done)
      self._recent.clear()
      self._recent.append((self.done, self.clock()))
      if self._bar is not None:
        self._bar.n = self.done
        self._bar.refresh()

  def close(self) -> None:
    """Stops the background thread and the bar (idempotent)."""
    self._stop.set()
    if self._thread is not None and self._thread is not threading.current_thread():
      self._thread.join(timeout=5)
    self._thread = None
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> "Progress":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # -- lines --------------------------------------------------------------------------------------

  def line(self, now: Optional[float] = None) -> str:
    """The plain line for the state at time `now` (default: the clock's)."""
    now = self.clock() if now is None else now
    parts = [f"{self.label}: {self._done_text()}" if self.label else self._done_text()]
    if self._stage is not None:
      parts.append(f"({self._stage}: {display.duration(now - self._stage_start)})")
    elif now - self._recent[-1][1] >= max(self.seconds, 1e-9) and self.done < (
      self.total or float("inf")
    ):
      # A step running for a while: say so, so a line without progress is not read as a hang (not on
      # the line a finished step prints, whose time is the last step's).
      running = display.duration(now - self._recent[-1][1])
      what = "no new bytes" if self.byte_sizes else f"{self.unit} {self.done} running"
      parts.append(f"({what} for {running})")
    parts.append(f"elapsed {display.duration(now - self.start)}")
    rate = self._seconds_per_step()
    if rate is not None:
      if self.byte_sizes:
        parts.append(f"recent {_bytes(1.0 / rate) if rate > 0 else 'fast'}/s")
      else:
        parts.append(f"recent {display.duration(rate)}/{self.unit}")
    parts.append(f"ETA {self._eta(rate, now)}")
    parts.extend(f"{k} {v}" for k, v in self.fields.items())
    return "  ".join(parts)

  def _done_text(self) -> str:
    if self.byte_sizes:
      of = f"/{_bytes(self.total)}" if self.total is not None else ""
      return f"read {_bytes(self.done)}{of}"
    of = f"/{self.total}" if self.total is not None else ""
    return f"{self.unit}s {self.done}{of} done"

  def _seconds_per_step(self) -> Optional[float]:
    (d0, t0), (d1, t1) = self._recent[0], self._recent[-1]
    if d1 <= d0:
      return None
    return (t1 - t0) / (d1 - d0)

  def _eta(self, rate: Optional[float], now: float) -> str:
    if self.total is None:
      return "unknown (total not known in advance)"
    remaining = self.total - self.done
    if remaining <= 0:
      return "0 s (done)"
    if rate is None:
      return f"unknown until the first {self.unit} ends" if not self.byte_sizes else "unknown"
    # The step running now has already taken part of its time.
    eta = max(0.0, remaining * rate - (now - self._recent[-1][1]))
    return ("at most " if self.total_is_bound else "") + display.duration(eta)

  def _write(self, now: float) -> None:
    print(self.line(now), file=self.stream, flush=True)
    self._last_line = now
    self._last_line_done = self.done

  def tick(self) -> bool:
    """Writes a line if none was written for `seconds` (the background thread calls this; a
    loop without steps may too); returns whether it wrote."""
    with self._lock:
      now = self.clock()
      if not self.enabled or self._bar is not None or self._stop.is_set():
        return False
      if now - self._last_line < self.seconds:
        return False
      self._write(now)
      return True

  def _beat(self) -> None:
    while not self._stop.wait(min(self.seconds, 1.0)):
      try:
        self.tick()
      except (OSError, ValueError):  # The stream was closed under us: stop quietly.
        return


def _isatty(stream) -> bool:
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False
