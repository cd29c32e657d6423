"""Server-side schedules: fixed-epoch shuffling, uniform sampling and cyclic Poisson sampling.

One concept: participation decided by the server's sampling design rather than a device timer.

* `EpochShuffle`, the (k, b) fixed-epoch participation of the papers' StackOverflow runs (BandMF §6,
  BLT §5): the population is shuffled once into b slots of `clients_per_round` devices, and round r
  trains slot r mod b, so every device joins every b rounds, in the same slot every epoch.
* `Uniform`: each round a fresh uniform sample without a timer, for contrast: nothing bounds b.
* `CyclicPoisson`: the sampling of amplified BandMF (BandMF §5, Scaling BandMF Prop 2.1). Devices
  are split once into `groups` groups; in round r each device of group r mod groups joins
  independently with probability q = groups·B/N. With groups = 1 this is plain Poisson sampling
  (DP-SGD with amplification). A device can only join rounds of its group, so b = groups holds.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from fedmf.mf.schema import ParticipationSchema
from fedmf.participation.base import Amplification, Cohort, ParticipationError, ParticipationModel
from fedmf.participation.base import choose

_ASSIGNMENT = 2**31  # RNG purpose of the one-time shuffle.


class _Stateless(ParticipationModel):
  """Models whose cohorts depend only on (seed, round)."""

  def state(self) -> dict[str, Any]:
    return {}

  def restore(self, state: dict[str, Any]) -> None:
    pass


class EpochShuffle(_Stateless):
  """Round r trains slot r mod b of a fixed shuffle of b·B devices."""

  name = "epoch shuffle"

  def __init__(self, num_clients, clients_per_round, seed, *, min_sep: int):
    super().__init__(num_clients, clients_per_round, seed)
    if min_sep < 1:
      raise ParticipationError(f"participation.min_sep must be >= 1, got {min_sep}")
    used = min_sep * self.clients_per_round
    if used > self.num_clients:
      raise ParticipationError(
        f"epoch shuffling needs min_sep × clients_per_round = {used} devices, but num_clients "
        f"is {self.num_clients}"
      )
    self.min_sep = int(min_sep)
    shuffled = np.random.default_rng([self.seed, _ASSIGNMENT]).permutation(self.num_clients)
    self.slots = np.sort(shuffled[:used].reshape(self.min_sep, self.clients_per_round), axis=1)

  def declared_schema(self, rounds: int) -> ParticipationSchema:
    return ParticipationSchema(rounds, self.min_sep, -(-rounds // self.min_sep))

  def sample(self, round_index: int) -> Cohort:
    clients = self.slots[round_index % self.min_sep]
    return Cohort(round=round_index, clients=clients.copy(), checked_in=clients.size)

  def describe(self) -> str:
    return f"fixed-epoch shuffling, {self.min_sep} rounds per epoch"


class Uniform(_Stateless):
  """A uniform sample of B of the N devices every round, no timer."""

  name = "uniform"

  def declared_schema(self, rounds: int) -> ParticipationSchema:
    return ParticipationSchema(rounds, 1, rounds)  # Nothing bounds b or k.

  def sample(self, round_index: int) -> Cohort:
    clients = choose(self.rng(round_index), np.arange(self.num_clients), self.clients_per_round)
    return Cohort(round=round_index, clients=clients, checked_in=self.num_clients)

  def describe(self) -> str:
    return "uniform sampling without a timer"


class CyclicPoisson(_Stateless):
  """Round r Poisson-samples group r mod `groups` with probability groups·B/N."""

  name = "cyclic Poisson"

  def __init__(
    self,
    num_clients,
    clients_per_round,
    seed,
    *,
    groups: int,
    sampling_probability: Optional[float] = None,
  ):
    super().__init__(num_clients, clients_per_round, seed)
    q = self.sampling_probability_for(
      self.num_clients, self.clients_per_round, groups, sampling_probability
    )
    self.groups = int(groups)
    self.sampling_probability = q
    order = np.random.default_rng([self.seed, _ASSIGNMENT]).permutation(self.num_clients)
    self.group = np.empty(self.num_clients, dtype=np.int64)
    self.group[order] = np.arange(self.num_clients) % self.groups

  @staticmethod
  def sampling_probability_for(
    num_clients: int,
    clients_per_round: int,
    groups: int,
    sampling_probability: Optional[float] = None,
  ) -> float:
    """q of `groups`-cyclic Poisson sampling of `num_clients` devices for a cohort of
    `clients_per_round` (default P·B/N), or a one-line ParticipationError when no q works. Pure
    arithmetic: the program checks it before any data exists (`fedmf.program.preflight`)."""
    if groups < 1:
      raise ParticipationError(f"the number of Poisson groups must be >= 1, got {groups}")
    q = groups * clients_per_round / num_clients
    if sampling_probability is not None:
      # The expected cohort q·N/P must be the batch the DP mean divides by (clients_per_round).
      expected = float(sampling_probability) * num_clients / groups
      if not 0.0 < sampling_probability <= 1.0 or round(expected) != clients_per_round:
        raise ParticipationError(
          f"participation.sampling_probability {sampling_probability:g} gives an expected cohort "
          f"q·num_clients/partitions = {expected:.6g} devices, but clients_per_round is "
          f"{clients_per_round}: set clients_per_round to {max(1, round(expected))}"
          + (f", or participation.sampling_probability to {q:.6g}" if q <= 1 else "")
        )
      q = float(sampling_probability)
    if q > 1:
      raise ParticipationError(
        f"cyclic Poisson sampling with {groups} groups needs num_clients >= groups × "
        f"clients_per_round = {groups * clients_per_round}, got {num_clients}: lower "
        f"participation.partitions to at most {num_clients // clients_per_round}"
      )
    return q

  def declared_schema(self, rounds: int) -> ParticipationSchema:
    return ParticipationSchema(rounds, self.groups, -(-rounds // self.groups))

  def amplification(self) -> Optional[Amplification]:
    return Amplification(self.groups, self.sampling_probability)

  def sample(self, round_index: int) -> Cohort:
    members = np.flatnonzero(self.group == round_index % self.groups)
    drawn = self.rng(round_index).random(members.size) < self.sampling_probability
    return Cohort(round=round_index, clients=members[drawn], checked_in=members.size)

  def describe(self) -> str:
    return f"cyclic Poisson sampling, {self.groups} groups, q = {self.sampling_probability:.4g}"
