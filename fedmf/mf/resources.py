"""Resource limits: memory and time are estimated before any allocation, and refused in one line.

One concept: a `Cost` (peak bytes and estimated seconds of each step, named) that the math and
accounting layers compute from n, b, k and the strategy's structure *before* they allocate or loop,
and `check(cost, action)`, which raises `ResourceLimitError` naming the estimate, the limit and the
flag that raises it. The limits live in a context (`limits(...)`), which the CLI sets from
`--max-memory GIB` and `--max-seconds S`; library callers get the defaults below.

Estimates lean high: the bytes count the arrays alive during the dominant step
(tests/mf/test_resources.py checks them against tracemalloc), and the seconds turn operation counts
into time at the nominal rates below (2 cores of the CI machine class: a guide, not a promise).

So that `--max-seconds` holds on a slower or loaded machine too, iterative work also runs under a
clock (`time_limit(action)`): its steps call `check_time()` (the optimizers' L-BFGS driver at each
iteration, the PLD accountant at each evaluation, the audit after each batch of the log), which stops the work
with one line naming the flag once it has run longer than the limit. The estimate refuses what
cannot fit in advance; the clock stops what turned out slower than estimated.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import time
from typing import Iterator, Optional

from fedmf.errors import FedmfUserError

GIB = 2**30
DEFAULT_MAX_MEMORY_BYTES = 4 * GIB
DEFAULT_MAX_SECONDS = 120.0

# Nominal throughputs turning operation counts into seconds.
DENSE_RATE = 5e9  # multiply-adds per second in BLAS-3 (products, factorizations, SVD)
VECTOR_RATE = 5e8  # per second in vectorized loops and IIR filters (lfilter, VecSens layers)
PYTHON_RATE = 2e6  # Python-level loop iterations per second

FLOAT = 8  # bytes of a float64


class ResourceLimitError(FedmfUserError):
  """Work whose estimated memory or time exceeds the limit (one line: estimate, limit, flag)."""


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a computation: its peak bytes, its estimated seconds and what it is."""

  what: str
  memory_bytes: float = 0.0
  seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class Cost:
  """Sequential steps: the peak memory is the largest step's, the time is the sum."""

  steps: tuple[Step, ...] = ()

  @classmethod
  def of(cls, what: str, memory_bytes: float = 0.0, seconds: float = 0.0) -> "Cost":
    return cls((Step(what, float(memory_bytes), float(seconds)),))

  def __add__(self, other: "Cost") -> "Cost":
    return Cost(self.steps + other.steps)

  @property
  def memory_bytes(self) -> float:
    return max((s.memory_bytes for s in self.steps), default=0.0)

  @property
  def seconds(self) -> float:
    return math.fsum(s.seconds for s in self.steps)

  def largest(self, key: str) -> Optional[Step]:
    return max(self.steps, key=lambda s: getattr(s, key), default=None)


@dataclasses.dataclass(frozen=True)
class Limits:
  max_memory_bytes: float = DEFAULT_MAX_MEMORY_BYTES
  max_seconds: float = DEFAULT_MAX_SECONDS


_LIMITS: contextvars.ContextVar[Limits] = contextvars.ContextVar("fedmf_limits", default=Limits())


def current() -> Limits:
  return _LIMITS.get()


@contextlib.contextmanager
def limits(
  max_memory_bytes: Optional[float] = None, max_seconds: Optional[float] = None
) -> Iterator[Limits]:
  """Sets the limits inside the block (None keeps the current one)."""
  now = current()
  new = Limits(
    now.max_memory_bytes if max_memory_bytes is None else float(max_memory_bytes),
    now.max_seconds if max_seconds is None else float(max_seconds),
  )
  token = _LIMITS.set(new)
  try:
    yield new
  finally:
    _LIMITS.reset(token)


def format_bytes(nbytes: float) -> str:
  """E.g. 146 TiB, 3.2 GiB, 512 KiB (binary units)."""
  if not math.isfinite(nbytes):
    return "unbounded memory"
  for unit, size in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20)):
    if nbytes >= size:
      return f"{nbytes / size:.3g} {unit}"
  return f"{nbytes / 1024:.3g} KiB"


def format_seconds(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "unbounded time"
  for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
    if seconds >= size:
      return f"{seconds / size:.3g} {unit}"
  return f"{seconds:.3g} s"


def check(cost: Cost, action: str) -> None:
  """Raises ResourceLimitError if `cost` exceeds the current limits.

  `action` says what was asked, e.g. "evaluating blt (4 buffers) at n=1000000".
  """
  lim = current()
  if not cost.memory_bytes <= lim.max_memory_bytes:
    step = cost.largest("memory_bytes")
    raise ResourceLimitError(
      f"{action} needs about {format_bytes(cost.memory_bytes)} of memory ({step.what}), above "
      f"the limit of {format_bytes(lim.max_memory_bytes)} (--max-memory GIB raises it)"
    )
  if not cost.seconds <= lim.max_seconds:
    step = cost.largest("seconds")
    raise ResourceLimitError(
      f"{action} needs an estimated {format_seconds(cost.seconds)} ({step.what}), above the "
      f"limit of {format_seconds(lim.max_seconds)} (--max-seconds S raises it)"
    )


def check_memory(nbytes: float, what: str, action: str) -> None:
  """Shorthand for one allocation."""
  check(Cost.of(what, nbytes), action)


@dataclasses.dataclass(frozen=True)
class PerRound:
  """Work linear in the rounds: `what` costs `memory_bytes` and `seconds` per round."""

  what: str
  memory_bytes: float
  seconds: float

  def check(self, num_rounds: int, action: str) -> None:
    """`check` of this work over `num_rounds` rounds."""
    check(
      Cost.of(
        f"{self.what} of {num_rounds:,} rounds",
        self.memory_bytes * float(num_rounds),
        self.seconds * num_rounds,
      ),
      action,
    )


# The clock of `time_limit` (tests replace it with a fake one).
clock = time.monotonic


@dataclasses.dataclass(frozen=True)
class _Clock:
  action: str
  start: float
  limit: float


_CLOCK: contextvars.ContextVar[Optional[_Clock]] = contextvars.ContextVar(
  "fedmf_clock", default=None
)


@contextlib.contextmanager
def time_limit(action: str) -> Iterator[None]:
  """Runs the block under the current `--max-seconds` limit, enforced by `check_time()` (see the
  module docstring). `action` says what runs, e.g. "optimizing bandmf at n=2052". Nested blocks
  keep the outer clock (the user's limit is for the whole of the work asked for)."""
  if _CLOCK.get() is not None:
    yield
    return
  token = _CLOCK.set(_Clock(action, clock(), current().max_seconds))
  try:
    yield
  finally:
    _CLOCK.reset(token)


def check_time() -> None:
  """Raises ResourceLimitError once the work of the enclosing `time_limit` block has run longer
  than its limit; outside such a block, does nothing."""
  running = _CLOCK.get()
  if running is None:
    return
  elapsed = clock() - running.start
  if elapsed > running.limit:
    raise ResourceLimitError(
      f"{running.action} was stopped after {elapsed:.0f} s, past the limit of "
      f"{running.limit:g} s (this machine ran slower than estimated; "
      "--max-seconds S raises the limit)"
    )
