"""fedmf layer 4 (programs), participation: who joins which round. numpy only.

  timer           a device-side timer counted in rounds (`timer_unit: rounds`) or in hours of
                  simulated wall-clock time (`timer_unit: hours`), with the server guard
  epoch_shuffle   fixed-epoch (k, b) shuffling, as in the papers' StackOverflow runs
  uniform         a uniform sample every round, no timer (for contrast)
  cyclic_poisson  cyclic Poisson sampling (amplified BandMF; DP-SGD with amplification at groups = 1);
  cyclic-poisson  the same, as issue 25's contract spells it, with `partitions` (the groups, = b)
                  and optionally `sampling_probability` (q; default partitions·B/N)

`build(config, num_clients, clients_per_round, seed, poisson_groups)` makes one from its config.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fedmf.participation.base import Amplification, Cohort, ParticipationError, ParticipationModel
from fedmf.participation.schedules import CyclicPoisson, EpochShuffle, Uniform
from fedmf.participation.timers import ClockTimer, RoundTimer

MODELS = ("timer", "epoch_shuffle", "uniform", "cyclic_poisson", "cyclic-poisson")
TIMER_UNITS = ("rounds", "hours")

__all__ = [
  "Amplification",
  "Cohort",
  "ParticipationConfig",
  "ParticipationError",
  "ParticipationModel",
  "build",
  "MODELS",
  "TIMER_UNITS",
]


@dataclasses.dataclass(frozen=True)
class ParticipationConfig:
  """The `participation:` section of a simulation or training config.

  Attributes:
    model: timer | epoch_shuffle | uniform | cyclic_poisson (also spelled cyclic-poisson; stored
      as cyclic_poisson).
    timer_unit: rounds | hours (timer only).
    min_sep: b in rounds: the round timer's gap, the epoch length, or the Poisson groups (default:
      the BandMF bands for cyclic Poisson with bandmf, 1 with dpsgd).
    timer_hours: the wall-clock timer (timer_unit hours).
    round_minutes, round_jitter: simulated round duration and its ± fraction (timer_unit hours).
    night_availability, day_availability: check-in chance at 03:00 and 15:00 local time (hours).
    availability: chance a device is available in a round (timer_unit rounds).
    max_participations: optional cap k enforced on devices (timers).
    early_checkin_rate: chance that an available device whose timer has not expired checks in
      anyway (a misbehaving device).
    server_guard: refuse (and count) such early check-ins.
    partitions: cyclic Poisson: the number of partitions P (BandMF §5's b̂ groups); it sets
      min_sep (b = P), overriding a min_sep from a base config.
    sampling_probability: cyclic Poisson: q, each device of the round's partition joins with this
      probability (default P·clients_per_round/num_clients; if given, the expected cohort
      q·num_clients/P must round to clients_per_round, the batch the noise is scaled for).
  """

  model: str = "timer"
  timer_unit: str = "rounds"
  min_sep: Optional[int] = None
  timer_hours: float = 24.0
  round_minutes: float = 10.0
  round_jitter: float = 0.2
  night_availability: float = 0.5
  day_availability: float = 0.05
  availability: float = 1.0
  max_participations: Optional[int] = None
  early_checkin_rate: float = 0.0
  server_guard: bool = True
  partitions: Optional[int] = None
  sampling_probability: Optional[float] = None

  def __post_init__(self):
    # One spelling and one field inside: the contract's names map onto the existing ones.
    if self.model == "cyclic-poisson":
      object.__setattr__(self, "model", "cyclic_poisson")
    if self.partitions is not None and self.model == "cyclic_poisson":
      # partitions is b here; it overrides a min_sep left by a base config (e.g. a timer's).
      object.__setattr__(self, "min_sep", self.partitions)

  def validate(self) -> None:
    if self.model not in MODELS:
      raise ParticipationError(
        f"participation.model must be one of {', '.join(MODELS)}, got {self.model!r}"
      )
    if self.timer_unit not in TIMER_UNITS:
      raise ParticipationError(
        f"participation.timer_unit must be one of {', '.join(TIMER_UNITS)}, got {self.timer_unit!r}"
      )
    if self.early_checkin_rate and self.model != "timer":
      raise ParticipationError(
        "participation.early_checkin_rate needs participation.model: timer (only a device timer "
        "can be disobeyed)"
      )
    cyclic_only = [
      key for key in ("partitions", "sampling_probability") if getattr(self, key) is not None
    ]
    if cyclic_only and self.model != "cyclic_poisson":
      raise ParticipationError(
        f"participation.{cyclic_only[0]} needs participation.model: cyclic-poisson"
      )
    if self.partitions is not None and self.partitions < 1:
      raise ParticipationError(f"participation.partitions must be >= 1, got {self.partitions}")
    q = self.sampling_probability
    if q is not None and not 0.0 < q <= 1.0:
      raise ParticipationError(f"participation.sampling_probability must be in (0, 1], got {q}")
    if (
      self.model in ("timer", "epoch_shuffle")
      and self.timer_unit == "rounds"
      and (self.min_sep is None)
    ):
      raise ParticipationError(f"participation.min_sep is required for the {self.model} model")


def build(
  config: ParticipationConfig,
  num_clients: int,
  clients_per_round: int,
  seed: int,
  poisson_groups: Optional[int] = None,
) -> ParticipationModel:
  """The participation model of `config` over a population of `num_clients` devices."""
  config.validate()
  if config.model == "timer":
    common = dict(
      max_participations=config.max_participations,
      early_checkin_rate=config.early_checkin_rate,
      server_guard=config.server_guard,
    )
    if config.timer_unit == "rounds":
      return RoundTimer(
        num_clients,
        clients_per_round,
        seed,
        min_sep=config.min_sep,
        availability=config.availability,
        **common,
      )
    return ClockTimer(
      num_clients,
      clients_per_round,
      seed,
      timer_hours=config.timer_hours,
      round_minutes=config.round_minutes,
      round_jitter=config.round_jitter,
      night_availability=config.night_availability,
      day_availability=config.day_availability,
      **common,
    )
  if config.model == "epoch_shuffle":
    return EpochShuffle(num_clients, clients_per_round, seed, min_sep=config.min_sep)
  if config.model == "uniform":
    return Uniform(num_clients, clients_per_round, seed)
  groups = config.min_sep if config.min_sep is not None else poisson_groups
  if groups is None:
    raise ParticipationError(
      "participation.partitions (or min_sep: the number of Poisson groups) is required"
    )
  return CyclicPoisson(
    num_clients,
    clients_per_round,
    seed,
    groups=groups,
    sampling_probability=config.sampling_probability,
  )
