"""ε of the rounds released so far, from the participation that really happened.

One concept: the live counterpart of the post-hoc auditor (BLT §1, App. C). It keeps, per device,
the last round and the number of rounds joined, hence the realized min-separation b and max
participations k of the released prefix (the auditor's numbers on the same cohorts:
tests/program/test_meter.py), and accounts the strategy under that realized schema as `fedmf
audit` accounts its realized claim: one Gaussian mechanism, by the claim's accountant
(`accounting.CLAIM_ACCOUNTANT`, the exact analytic curve). Under cyclic Poisson sampling that is
the unamplified claim, an upper bound of the amplified ε the audit may credit. With adaptive
clipping (`count_noise_multiplier`), a device's k realized participations are also k count
releases, composed in (`fedmf.privacy.adaptive_clip`). The training program's budget guard asks it
before releasing a round; the progress bar shows it.

Its counters are its own, not the auditor's engine (`fedmf.privacy.log_statistics`): they are
checkpointed with the run, and `epsilon_if` asks about a cohort without recording it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from fedmf.mf.schema import ParticipationSchema


class PrivacyMeter:
  """Realized (b, k) and ε of the first r rounds."""

  def __init__(
    self,
    strategy,
    noise_multiplier: float,
    delta: float,
    num_clients: int,
    count_noise_multiplier: Optional[float] = None,
  ):
    self.strategy = strategy
    self.noise_multiplier = float(noise_multiplier)
    self.delta = float(delta)
    # Adaptive clipping's z_b: the k realized participations are also k count releases.
    self.count_noise_multiplier = count_noise_multiplier
    self.last_round = np.full(num_clients, -1, dtype=np.int64)
    self.count = np.zeros(num_clients, dtype=np.int64)
    self.min_gap: Optional[int] = None
    self.max_participations = 0
    self._cache: dict[tuple, float] = {}

  def record(self, round_index: int, clients: np.ndarray) -> None:
    """Adds one round's participants (rounds in order)."""
    clients = np.asarray(clients, dtype=np.int64)
    if clients.size == 0:
      return
    seen = self.last_round[clients] >= 0
    if seen.any():
      gap = int((round_index - self.last_round[clients[seen]]).min())
      self.min_gap = gap if self.min_gap is None else min(self.min_gap, gap)
    self.last_round[clients] = round_index
    self.count[clients] += 1
    self.max_participations = max(self.max_participations, int(self.count[clients].max()))

  def schema(self, rounds: int) -> Optional[ParticipationSchema]:
    """The realized schema of the first `rounds` rounds (None before anyone took part)."""
    if self.max_participations == 0:
      return None
    b = self.min_gap if self.max_participations > 1 else None
    return ParticipationSchema(rounds, b, self.max_participations)

  def epsilon(self, rounds: int) -> float:
    """ε at δ after `rounds` released rounds (0 before anyone took part, inf without noise)."""
    schema = self.schema(rounds)
    if schema is None:
      return 0.0
    if self.noise_multiplier == 0:
      return math.inf
    key = (schema.n, schema.min_sep, schema.max_participations)
    if key not in self._cache:
      from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top

      self._cache[key] = accounting.account(
        self.strategy,
        schema,
        self.noise_multiplier,
        self.delta,
        accountant=accounting.CLAIM_ACCOUNTANT,
        count_noise_multiplier=self.count_noise_multiplier,
      ).epsilon
    return self._cache[key]

  def epsilon_if(self, round_index: int, clients: np.ndarray) -> float:
    """ε after round `round_index` would be released with these participants (no change)."""
    saved = self.state()
    try:
      self.record(round_index, clients)
      return self.epsilon(round_index + 1)
    finally:
      self.restore(saved)

  def state(self) -> dict[str, Any]:
    return {
      "last_round": self.last_round.copy(),
      "count": self.count.copy(),
      "min_gap": -1 if self.min_gap is None else self.min_gap,
      "max_participations": self.max_participations,
    }

  def restore(self, state: dict[str, Any]) -> None:
    self.last_round = np.asarray(state["last_round"], np.int64).copy()
    self.count = np.asarray(state["count"], np.int64).copy()
    gap = int(state["min_gap"])
    self.min_gap = None if gap < 0 else gap
    self.max_participations = int(state["max_participations"])
