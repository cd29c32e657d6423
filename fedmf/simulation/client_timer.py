"""A simulated device-side client timer that enforces b-min-separation participation.

One concept: who may join round r. In cross-device FL the server cannot schedule devices; each
device keeps a timer and refuses to check in again until b rounds after its last participation
(BLT §1 and Alg. 1, with the gap convention of docs/architecture.md: a client that joined round r
may join again at round r + b). Devices are also only sometimes available. The realized
min-separation and participation counts are therefore only known afterwards, from the log.

The timer is a plain numpy object whose whole state is `last_round` and `participations`, so a
training program can checkpoint and restore it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

NEVER = -(2**62)


@dataclasses.dataclass
class ClientTimer:
  """Samples cohorts among clients whose timers allow them to check in.

  Attributes:
    num_clients: population size; client i has id `client_ids[i]`.
    min_sep: b; a client that joined round r is eligible again from round r + b.
    clients_per_round: cohort size (fewer if not enough clients are eligible).
    max_participations: k, optional cap per client.
    availability: probability a device is online and eligible in a given round.
    seed: seeds the cohort sampling (round r uses a generator keyed by (seed, r), so a restored
      timer reproduces the same cohorts).
  """

  num_clients: int
  min_sep: int
  clients_per_round: int
  max_participations: Optional[int] = None
  availability: float = 1.0
  seed: int = 0
  last_round: np.ndarray = dataclasses.field(default=None, repr=False)
  participations: np.ndarray = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if self.num_clients < 1 or self.clients_per_round < 1 or self.min_sep < 1:
      raise ValueError("num_clients, clients_per_round and min_sep must be positive")
    if not 0 < self.availability <= 1:
      raise ValueError(f"availability must lie in (0, 1], got {self.availability}")
    if self.last_round is None:
      self.last_round = np.full(self.num_clients, NEVER, dtype=np.int64)
    if self.participations is None:
      self.participations = np.zeros(self.num_clients, dtype=np.int64)

  def eligible(self, round_num: int) -> np.ndarray:
    """Indices of clients whose timer has expired (gap >= b) and that are under the cap."""
    ok = round_num - self.last_round >= self.min_sep
    if self.max_participations is not None:
      ok &= self.participations < self.max_participations
    return np.flatnonzero(ok)

  def sample(self, round_num: int) -> np.ndarray:
    """The cohort (client indices, sorted) for `round_num`, and records their participation."""
    rng = np.random.default_rng([self.seed, round_num])
    candidates = self.eligible(round_num)
    if self.availability < 1:
      candidates = candidates[rng.random(candidates.size) < self.availability]
    size = min(self.clients_per_round, candidates.size)
    cohort = np.sort(rng.choice(candidates, size=size, replace=False)) if size else candidates[:0]
    self.last_round[cohort] = round_num
    self.participations[cohort] += 1
    return cohort

  def state(self) -> dict[str, np.ndarray]:
    return {"last_round": self.last_round.copy(), "participations": self.participations.copy()}

  def restore(self, state: dict[str, np.ndarray]) -> None:
    self.last_round = np.array(state["last_round"], dtype=np.int64)
    self.participations = np.array(state["participations"], dtype=np.int64)
