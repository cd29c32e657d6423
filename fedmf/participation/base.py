"""Who joins a round: the interface every participation model implements, and the cohort it returns.

One concept: a participation model draws each round's cohort from a population of N devices,
indexed 0..N-1 (the task maps an index to its client id). In cross-device FL the server does not
schedule devices: they check in when they are available and their device-side timer allows, and the
server picks the cohort among them (BLT §1 and Alg. 1; BandMF App. K). Each model states the
participation schema it guarantees by construction (`declared_schema`), which calibrates the noise;
the auditor later measures the realized schema from the participation log.

Randomness is keyed by (seed, round, purpose) with numpy's SeedSequence, so a model restored from its
`state()` draws exactly the cohorts the uninterrupted run would have drawn; `state()` is plain data
(a dict of numpy arrays and numbers) that checkpoints as is.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.mf.schema import ParticipationSchema


class ParticipationError(FedmfUserError):
  """A participation model that cannot be built or run as configured (one line naming the key)."""


@dataclasses.dataclass(frozen=True)
class Cohort:
  """One round's participants and what the server saw at check-in.

  Attributes:
    round: 0-based round index.
    clients: sorted population indices of the participants.
    checked_in: devices that checked in (available, and allowed by their timer or misbehaving).
    refused: early check-ins the server guard refused (a device whose timer had not expired).
    early_admitted: early check-ins admitted because the guard was off (they may violate b).
    time_hours: simulated wall-clock time at the start of the round (wall-clock models), else None.
  """

  round: int
  clients: np.ndarray
  checked_in: int = 0
  refused: int = 0
  early_admitted: int = 0
  time_hours: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Amplification:
  """Poisson sampling the accountant may credit (BandMF §5): `groups` cyclic groups, each device
  sampled with probability `sampling_probability` in its group's rounds."""

  groups: int
  sampling_probability: float


class ParticipationModel(abc.ABC):
  """Draws cohorts; its state is plain data."""

  name: str = ""

  def __init__(self, num_clients: int, clients_per_round: int, seed: int):
    if num_clients < 1 or clients_per_round < 1:
      raise ParticipationError("num_clients and clients_per_round must be >= 1")
    if clients_per_round > num_clients:
      raise ParticipationError(
        f"clients_per_round ({clients_per_round}) exceeds the population num_clients "
        f"({num_clients})"
      )
    self.num_clients = int(num_clients)
    self.clients_per_round = int(clients_per_round)
    self.seed = int(seed)

  def rng(self, round_index: int, purpose: int = 0) -> np.random.Generator:
    """The generator of one round and purpose: independent of every other round's draws."""
    return np.random.default_rng([self.seed, int(round_index), int(purpose)])

  @abc.abstractmethod
  def declared_schema(self, rounds: int) -> ParticipationSchema:
    """The (b, k) this model guarantees over `rounds` rounds (the planning and declared claim)."""

  def amplification(self) -> Optional[Amplification]:
    """Poisson sampling the accountant may credit, or None."""
    return None

  @abc.abstractmethod
  def sample(self, round_index: int) -> Cohort:
    """Round `round_index`'s cohort; records the participation (rounds must come in order)."""

  @abc.abstractmethod
  def state(self) -> dict[str, Any]:
    """Plain-data state, enough to continue exactly (see `restore`)."""

  @abc.abstractmethod
  def restore(self, state: dict[str, Any]) -> None:
    """Continues from a `state()`."""

  def describe(self) -> str:
    return self.name


def choose(rng: np.random.Generator, candidates: np.ndarray, size: int) -> np.ndarray:
  """`size` distinct candidates uniformly at random (all if fewer), sorted."""
  if candidates.size <= size:
    return np.sort(candidates)
  return np.sort(rng.choice(candidates, size=size, replace=False))
