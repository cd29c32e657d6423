"""A run's canary clients: inserted into the clipped sums, projected from every release, resumable.

One concept: the `canaries:` section of a run (issue 33; docs/empirical-privacy.md) at run time.
`RunCanaries` holds the design (which canaries are inserted, on fair coins:
`fedmf.privacy.canary_design`), their directions (`fedmf.privacy.canary_directions`: one randomized
Hadamard transform inserts or projects them all, none is stored) and their rounds, and per round:

  insert(r, clipped_sum, ζ_r)   the canaries of round r: each inserted one adds ζ_r·u_c to the
                                clipped sum, like a client whose update has norm ζ_r; returns
                                their log ids (the held-out ones join nothing)
  project(r, noisy_mean, B)     p[r, c] = B·⟨noisy mean, u_c⟩/ζ_r for every canary c

The noise is added after `insert` and the mean divided by the same fixed B as the clients' sum,
so the canaries go through the very code path the clients' updates take. ζ_r is the round's clip
norm, passed in each round (adaptive clipping changes it). Memory: the projections (float32) and
the rounds each canary joined (a byte): 5 bytes per (round, canary), plus the directions' tables
of the model's size. `state()`/`restore()` checkpoint it with the program state; `save` writes
canaries.npz (owner-only: it holds the canary seed) at the end of the run.

Rounds: `participation` gives the canaries their own devices of the run's participation model
(same config, the same rate per device: B·M/N of the M canaries per round); `worst-case` puts
every canary in the rounds attaining the strategy's sensitivity under the declared (b, k)
(`fedmf.mf.worst_pattern`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from fedmf import atomic_files
from fedmf.errors import FedmfUserError
from fedmf.mf import worst_pattern as worst_pattern_lib
from fedmf.privacy import canary_design
from fedmf.privacy import canary_directions
from fedmf.participation import ParticipationConfig
from fedmf.program.config_sections import CanariesConfig

CANARIES_FILE = "canaries.npz"
FILE_FORMAT = 1
PARTICIPATION_TAG = 0xCA11


class CanaryError(FedmfUserError):
  """Canaries that cannot run as configured (one line naming the key)."""


def canary_clients_per_round(clients_per_round: int, num_clients: int, canaries: int) -> int:
  """B·M/N rounded, at least 1: the canaries' devices join at the rate of the real ones."""
  return max(1, int(round(clients_per_round * canaries / num_clients)))


def check_fits(c: CanariesConfig, parameters: int) -> None:
  """Refuses, before any work, more canaries than a model of `parameters` has orthonormal
  Hadamard directions (`fedmf.privacy.canary_directions`: 2^⌊log₂ d⌋)."""
  if c.enabled and c.count + c.held_out > 1 << (int(parameters).bit_length() - 1):
    raise CanaryError(
      f"canaries.count + canaries.held_out = {c.count + c.held_out} orthonormal directions do not "
      f"fit in a model of {parameters} parameters (at most "
      f"{1 << (int(parameters).bit_length() - 1)}, the largest power of two <= d)"
    )


def _canary_iterator(
  participation: ParticipationConfig,
  clients_per_round: int,
  canaries: int,
  num_clients: int,
  seed: int,
  poisson_groups: Optional[int],
):
  """The canaries' own devices of the run's participation model (`participation` pattern)."""
  from fedmf.program.data_source import ParticipationIterator  # pylint: disable=g-import-not-at-top

  participation = dataclasses.replace(participation, sampling_probability=None)
  per_round = canary_clients_per_round(clients_per_round, num_clients, canaries)
  if participation.model == "epoch_shuffle" and participation.min_sep:
    per_round = max(1, min(per_round, canaries // participation.min_sep))
  try:
    return ParticipationIterator.create(participation, canaries, per_round, seed, poisson_groups)
  except FedmfUserError as e:
    raise CanaryError(
      f"canaries.pattern participation: the canaries' {canaries} devices cannot follow the run's "
      f"participation model ({e}); use more canaries or canaries.pattern worst-case"
    ) from None


class RunCanaries:
  """The canaries of one run (see the module docstring)."""

  def __init__(
    self,
    config: CanariesConfig,
    *,
    seed: int,
    shapes: Sequence[tuple[int, ...]],
    rounds: int,
    worst: Optional[worst_pattern_lib.WorstPattern] = None,
    iterator: Any = None,
  ):
    self.config = config
    self.pattern = self.config.pattern
    self.seed = int(seed)
    self.design = canary_design.draw_design(self.config.count, self.config.held_out, self.seed)
    m = self.design.canaries
    self.directions = canary_directions.HadamardDirections(shapes, m, self.seed)
    self.worst = worst
    self.iterator = iterator
    self.rounds = int(rounds)
    self.membership = np.zeros((self.rounds, m), bool)
    self.projections = np.full((self.rounds, m), np.nan, np.float32)
    self.clip_norms = np.full(self.rounds, np.nan)
    # ‖Σ clients' clipped updates‖²/ζ² per round: the real clients project on every canary
    # direction too, about this over N each (the noise check says how much that is).
    self.client_sq_norms = np.full(self.rounds, np.nan)

  @property
  def canaries(self) -> int:
    return self.design.canaries

  def describe(self) -> str:
    if self.worst is not None:
      return f"every canary in the worst-case {self.worst.describe()}"
    per_round = self.iterator.model.clients_per_round
    return (
      f"{self.canaries} canary devices of the run's participation model "
      f"({self.iterator.model.describe()}), {per_round} per round"
    )

  def joining(self, r: int) -> np.ndarray:
    """The canaries joining round r (inserted ones and held-out ones alike), sorted indices."""
    if self.worst is not None:
      return np.arange(self.canaries) if r in self.worst.rounds else np.zeros(0, np.int64)
    self.iterator.select()  # its own rounds, in order with the run's
    return np.asarray(self.iterator.last_cohort.clients, np.int64)

  def insert(self, r: int, clipped_sum: list[np.ndarray], clip_norm: float) -> list[str]:
    """Adds round r's inserted canaries (ζ·u_c each) to the clipped sum; returns their log ids."""
    joined = self.joining(r)
    self.membership[r, joined] = True
    self.clip_norms[r] = float(clip_norm)
    self.client_sq_norms[r] = (
      sum(float(np.dot(t.reshape(-1), t.reshape(-1))) for t in clipped_sum) / float(clip_norm) ** 2
    )
    inserted = joined[self.design.inserted[joined]]
    if inserted.size:
      coefficients = np.zeros(self.canaries)
      coefficients[inserted] = float(clip_norm)
      self.directions.add(clipped_sum, coefficients)
    return self.design.ids(inserted)

  def project(self, r: int, noisy_mean: list[np.ndarray], clients_per_round: int) -> None:
    """p[r, c] = B·⟨noisy mean of round r, u_c⟩/ζ_r: the released noised sum over ζ, projected."""
    scale = float(clients_per_round) / self.clip_norms[r]
    self.projections[r] = (scale * self.directions.project(noisy_mean)).astype(np.float32)

  # --- checkpoints ------------------------------------------------------------------------

  def state(self) -> dict[str, Any]:
    """The checkpointed state: the arrays themselves, not copies (a checkpoint is written before
    the next round changes them), so saving one adds no rounds × canaries copy."""
    out = {
      "seed": np.uint64(self.seed),
      "membership": self.membership,
      "projections": self.projections,
      "clip_norms": self.clip_norms,
      "client_sq_norms": self.client_sq_norms,
    }
    if self.iterator is not None:
      out["iterator"] = self.iterator
    return out

  def restore(self, state: dict[str, Any]) -> None:
    seed = int(np.uint64(state["seed"]))
    if seed != self.seed:  # The seed was drawn anew by this process: take the checkpoint's.
      rebuilt = RunCanaries.__new__(RunCanaries)
      rebuilt.__dict__.update(self.__dict__)
      rebuilt.seed = seed
      rebuilt.design = canary_design.draw_design(self.config.count, self.config.held_out, seed)
      rebuilt.directions = canary_directions.HadamardDirections(
        self.directions.shapes, self.canaries, seed
      )
      self.__dict__.update(rebuilt.__dict__)
    self.membership = np.asarray(state["membership"], bool).copy()
    self.projections = np.asarray(state["projections"], np.float32).copy()
    self.clip_norms = np.asarray(state["clip_norms"], np.float64).copy()
    self.client_sq_norms = np.asarray(state["client_sq_norms"], np.float64).copy()
    if self.iterator is not None:
      self.iterator = state["iterator"]

  # --- the record ------------------------------------------------------------------------

  def save(
    self,
    path: Path,
    rounds_completed: int,
    initial_weights: Sequence[np.ndarray],
    final_weights: Sequence[np.ndarray],
  ) -> None:
    """canaries.npz (owner-only): the design, the rounds, the projections of the first
    `rounds_completed` rounds and of the final model's change Δ = w_initial − w_final (the sum
    of the server's steps, in the clients' update convention: an inserted canary points along it)."""
    n = int(rounds_completed)
    delta = [
      np.asarray(a, np.float64) - np.asarray(b, np.float64)
      for a, b in zip(initial_weights, final_weights)
    ]
    norm = math.sqrt(sum(float(np.sum(d * d)) for d in delta))
    arrays = {
      "format": np.int64(FILE_FORMAT),
      "seed": np.uint64(self.seed),
      "count": np.int64(self.config.count),
      "held_out": np.int64(self.config.held_out),
      "pattern": np.str_(self.pattern),
      "pattern_description": np.str_(self.describe()),
      "inserted": self.design.inserted,
      "coins": self.design.coins,
      "membership": self.membership[:n],
      "projections": self.projections[:n],
      "clip_norms": self.clip_norms[:n],
      "client_sq_norms": self.client_sq_norms[:n],
      "final_projections": self.directions.project(delta),
      "final_norm": np.float64(norm),
      "model_dim": np.int64(self.directions.dim),
      "directions": np.int64(self.directions.size),
    }
    if self.worst is not None:
      arrays.update(
        worst_rounds=np.asarray(self.worst.rounds, np.int64),
        worst_value=np.float64(self.worst.value),
        worst_method=np.str_(self.worst.method),
        worst_sensitivity=np.float64(self.worst.sensitivity.value),
        worst_sensitivity_method=np.str_(self.worst.sensitivity.method),
      )
    # Streamed into the file (no in-memory copy of the projections), published atomically.
    with atomic_files.open_atomic(path, binary=True, mode=0o600) as f:
      np.savez(f, **arrays)


def build(c: CanariesConfig, participation: ParticipationConfig, *, clients_per_round: int,
          rounds: int, shapes, schema, strategy, num_clients: int, poisson_groups=None,
          seed: Optional[int] = None) -> Optional[RunCanaries]:  # fmt: skip
  """The run's canaries (None when `canaries.count` is 0), from the config's `canaries:` section and
  the run's participation model, cohort and rounds. `seed`: the canary seed (default: the
  section's, else drawn from OS randomness)."""
  if not c.enabled:
    return None
  if seed is None:
    from fedmf.tff import dp_mean  # pylint: disable=g-import-not-at-top

    seed = c.seed if c.seed is not None else dp_mean.draw_noise_seed()
  m = c.count + c.held_out
  worst = iterator = None
  if c.pattern == "worst-case":
    worst = worst_pattern_lib.worst_case_pattern(strategy, schema)
  else:
    iterator = _canary_iterator(
      participation,
      clients_per_round,
      m,
      num_clients,
      (int(seed) + PARTICIPATION_TAG) % 2**64,
      poisson_groups,
    )
  return RunCanaries(c, seed=seed, shapes=shapes, rounds=rounds, worst=worst, iterator=iterator)
