"""Device-side client timers: a device that took part may check in again only once its timer expires.

One concept: the timer of BLT §1 / Alg. 1 and BandMF App. K, in two units.

* `RoundTimer` counts rounds: a device that joined round r may join again from round r + b (b is the
  gap, docs/architecture.md). It enforces b-min-separation exactly.
* `ClockTimer` counts hours of simulated wall-clock time: rounds take `round_minutes` (± jitter),
  devices check in on a diurnal pattern (mostly at night in their own time zone, when phones are
  charging, idle and on wi-fi) and a device is eligible again `timer_hours` after it took part. The
  realized min-separation in rounds emerges from the timer and the round durations and is known
  only from the log; the schema it guarantees is b = ⌈timer_hours / longest round⌉.

Both have the **server guard**: the server keeps its own record of every device's last round (the
participation log) and refuses a device that checks in before its timer allows. A misbehaving device
(`early_checkin_rate`: the chance that an available device whose timer has not expired checks in
anyway) is then refused and counted; with the guard off it may be picked and break b, which the
auditor finds.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from fedmf.mf.schema import ParticipationSchema
from fedmf.participation.base import Cohort, ParticipationError, ParticipationModel, choose

NEVER = -(2**62)  # Last round of a device that never took part.
_AVAILABILITY, _EARLY, _COHORT, _DURATION = 0, 1, 2, 3  # RNG purposes.


def _probability(value: float, name: str) -> float:
  value = float(value)
  if not 0.0 <= value <= 1.0:
    raise ParticipationError(f"participation.{name} must lie in [0, 1], got {value}")
  return value


class _TimerModel(ParticipationModel):
  """What both timers share: the cap k, misbehaving devices and the server guard."""

  def __init__(
    self,
    num_clients,
    clients_per_round,
    seed,
    *,
    max_participations=None,
    early_checkin_rate=0.0,
    server_guard=True,
  ):
    super().__init__(num_clients, clients_per_round, seed)
    if max_participations is not None and max_participations < 1:
      raise ParticipationError(
        f"participation.max_participations must be >= 1, got {max_participations}"
      )
    self.max_participations = None if max_participations is None else int(max_participations)
    self.early_checkin_rate = _probability(early_checkin_rate, "early_checkin_rate")
    self.server_guard = bool(server_guard)
    self.participations = np.zeros(self.num_clients, dtype=np.int64)
    self.next_round = 0

  def _admit(
    self, round_index: int, available: np.ndarray, allowed: np.ndarray, time_hours: Optional[float]
  ) -> Cohort:
    if round_index != self.next_round:
      raise ParticipationError(
        f"rounds must be sampled in order: expected round {self.next_round}, got {round_index}"
      )
    if self.max_participations is not None:
      allowed = allowed & (self.participations < self.max_participations)
    honest = available & allowed
    early = np.zeros_like(honest)
    if self.early_checkin_rate > 0:
      draws = self.rng(round_index, _EARLY).random(self.num_clients)
      early = available & ~allowed & (draws < self.early_checkin_rate)
    refused = int(early.sum()) if self.server_guard else 0
    candidates = honest if self.server_guard else (honest | early)
    clients = choose(
      self.rng(round_index, _COHORT), np.flatnonzero(candidates), self.clients_per_round
    )
    early_admitted = 0 if self.server_guard else int(early[clients].sum())
    self.participations[clients] += 1
    self.next_round = round_index + 1
    return Cohort(
      round=round_index,
      clients=clients,
      checked_in=int((honest | early).sum()),
      refused=refused,
      early_admitted=early_admitted,
      time_hours=time_hours,
    )

  def _common_state(self) -> dict[str, Any]:
    return {"participations": self.participations.copy(), "next_round": self.next_round}

  def _restore_common(self, state: dict[str, Any]) -> None:
    participations = np.asarray(state["participations"], dtype=np.int64)
    if participations.shape != (self.num_clients,):
      raise ParticipationError(
        f"participation state is for {participations.shape[0]} clients, "
        f"not num_clients = {self.num_clients}"
      )
    self.participations = participations.copy()
    self.next_round = int(state["next_round"])


class RoundTimer(_TimerModel):
  """A device that joined round r may check in again from round r + b."""

  name = "timer (rounds)"

  def __init__(
    self, num_clients, clients_per_round, seed, *, min_sep: int, availability: float = 1.0, **kwargs
  ):
    super().__init__(num_clients, clients_per_round, seed, **kwargs)
    if min_sep < 1:
      raise ParticipationError(f"participation.min_sep must be >= 1, got {min_sep}")
    self.min_sep = int(min_sep)
    self.availability = _probability(availability, "availability")
    if self.availability == 0:
      raise ParticipationError("participation.availability must be > 0")
    self.last_round = np.full(self.num_clients, NEVER, dtype=np.int64)

  def declared_schema(self, rounds: int) -> ParticipationSchema:
    return ParticipationSchema(rounds, self.min_sep, self.max_participations)

  def sample(self, round_index: int) -> Cohort:
    available = self.rng(round_index, _AVAILABILITY).random(self.num_clients) < self.availability
    allowed = round_index - self.last_round >= self.min_sep
    cohort = self._admit(round_index, available, allowed, None)
    self.last_round[cohort.clients] = round_index
    return cohort

  def state(self) -> dict[str, Any]:
    return {**self._common_state(), "last_round": self.last_round.copy()}

  def restore(self, state: dict[str, Any]) -> None:
    self._restore_common(state)
    self.last_round = np.asarray(state["last_round"], dtype=np.int64).copy()

  def describe(self) -> str:
    return f"client timer of {self.min_sep} rounds"


def diurnal_availability(local_hour: np.ndarray, night: float, day: float) -> np.ndarray:
  """Chance a device checks in at a local hour: `night` at 03:00, `day` at 15:00, smooth between.

  Devices train when charging, idle and on unmetered wi-fi, which is mostly at night (BLT §1).
  """
  return day + (night - day) * 0.5 * (1.0 + np.cos(2 * np.pi * (local_hour - 3.0) / 24.0))


class ClockTimer(_TimerModel):
  """A device is eligible again `timer_hours` of simulated time after its last participation."""

  name = "timer (hours)"

  def __init__(
    self,
    num_clients,
    clients_per_round,
    seed,
    *,
    timer_hours: float,
    round_minutes: float = 10.0,
    round_jitter: float = 0.2,
    night_availability: float = 0.5,
    day_availability: float = 0.05,
    **kwargs,
  ):
    super().__init__(num_clients, clients_per_round, seed, **kwargs)
    if not (math.isfinite(timer_hours) and timer_hours > 0):
      raise ParticipationError(f"participation.timer_hours must be > 0, got {timer_hours}")
    if not (math.isfinite(round_minutes) and round_minutes > 0):
      raise ParticipationError(f"participation.round_minutes must be > 0, got {round_minutes}")
    if not 0 <= round_jitter < 1:
      raise ParticipationError(f"participation.round_jitter must lie in [0, 1), got {round_jitter}")
    self.timer_hours = float(timer_hours)
    self.round_minutes = float(round_minutes)
    self.round_jitter = float(round_jitter)
    self.night = _probability(night_availability, "night_availability")
    self.day = _probability(day_availability, "day_availability")
    if max(self.night, self.day) == 0:
      raise ParticipationError("participation.night_availability and day_availability are both 0")
    # Each device's time zone (hours ahead of the server clock), fixed by the seed.
    self.time_zone = np.random.default_rng([self.seed, 2**31]).uniform(0.0, 24.0, self.num_clients)
    self.now_hours = 0.0
    self.last_time = np.full(self.num_clients, -np.inf)

  @property
  def longest_round_hours(self) -> float:
    return self.round_minutes * (1.0 + self.round_jitter) / 60.0

  def declared_schema(self, rounds: int) -> ParticipationSchema:
    # Two participations at least timer_hours apart are at least ⌈timer_hours / longest round⌉
    # rounds apart, since every round lasts at most the longest round.
    b = max(1, math.ceil(self.timer_hours / self.longest_round_hours - 1e-9))
    return ParticipationSchema(rounds, b, self.max_participations)

  def sample(self, round_index: int) -> Cohort:
    t = self.now_hours
    local_hour = (t + self.time_zone) % 24.0
    chance = diurnal_availability(local_hour, self.night, self.day)
    available = self.rng(round_index, _AVAILABILITY).random(self.num_clients) < chance
    allowed = t - self.last_time >= self.timer_hours
    cohort = self._admit(round_index, available, allowed, t)
    self.last_time[cohort.clients] = t
    jitter = self.rng(round_index, _DURATION).uniform(-self.round_jitter, self.round_jitter)
    self.now_hours = t + self.round_minutes * (1.0 + jitter) / 60.0
    return cohort

  def state(self) -> dict[str, Any]:
    return {**self._common_state(), "now_hours": self.now_hours, "last_time": self.last_time.copy()}

  def restore(self, state: dict[str, Any]) -> None:
    self._restore_common(state)
    self.now_hours = float(state["now_hours"])
    self.last_time = np.asarray(state["last_time"], dtype=np.float64).copy()

  def describe(self) -> str:
    return (
      f"client timer of {self.timer_hours:g} hours, rounds of {self.round_minutes:g} "
      f"minutes ± {100 * self.round_jitter:g}%"
    )
