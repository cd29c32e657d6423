"""Which canaries are inserted: the design the estimators and the one-run lower bound rely on.

One concept: from `count`, `held_out` and the canary seed, decide each canary's role. The one-run
lower bound (Steinke, Nasr & Jagielski 2023; Mahloujifar, Melis & Chaudhuri 2024) holds only for
canaries inserted on independent fair coins, so 2·min(count, held_out) canaries get a fair coin
each; the other |count − held_out| are inserted (count > held_out) or held out (held_out > count)
outright. On average `count` canaries are inserted and `held_out` are not; the realized numbers
are in the run's canaries.npz and its audit. The fixed canaries take part in the Gaussian fit, not
in the lower bound.

Canary c's id in the participation log is `canary_id(c)` ("canary-000042").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedmf.errors import FedmfUserError

DESIGN_TAG = 0xDE5167
CANARY_PREFIX = "canary-"


def canary_id(c: int) -> str:
  return f"{CANARY_PREFIX}{int(c):06d}"


@dataclasses.dataclass(frozen=True)
class CanaryDesign:
  """inserted[c]: canary c is inserted; coins[c]: that was decided by an independent fair coin."""

  inserted: np.ndarray
  coins: np.ndarray

  @property
  def canaries(self) -> int:
    return int(self.inserted.size)

  def ids(self, which: np.ndarray) -> list[str]:
    """The log ids of the canaries `which` (indices)."""
    return [canary_id(c) for c in np.asarray(which, np.int64)]


def draw_design(count: int, held_out: int, seed: int) -> CanaryDesign:
  """The design of the module docstring (a pure function of its arguments)."""
  for key, value in (("canaries.count", count), ("canaries.held_out", held_out)):
    if isinstance(value, bool) or int(value) != value or value < 0:
      raise FedmfUserError(f"{key} must be an integer >= 0, got {value!r}")
  count, held_out = int(count), int(held_out)
  total = count + held_out
  rng = np.random.default_rng([int(seed), DESIGN_TAG])
  order = rng.permutation(total)
  paired = 2 * min(count, held_out)
  coins = np.zeros(total, bool)
  coins[order[:paired]] = True
  inserted = np.zeros(total, bool)
  inserted[order[:paired]] = rng.random(paired) < 0.5
  inserted[order[paired:]] = count > held_out
  return CanaryDesign(inserted, coins)
