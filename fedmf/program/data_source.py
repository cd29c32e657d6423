"""A `tff.program.FederatedDataSource` that admits devices only when their timer allows.

One concept: the training program's view of participation. The iterator wraps a participation model
(`fedmf.participation`): `select()` runs one round of check-ins, refuses early check-ins (the
server guard) and counts them, and returns the admitted devices' client ids (`{str}@CLIENTS`, as
TFF's `ClientIdDataSource`); the program maps ids to data. Its state is plain data and it
serializes with `to_bytes` / `from_bytes` (a JSON header with what rebuilds the model, then the
model's state as an `.npz`), so it is checkpointed with the program state and a restored iterator
draws exactly the cohorts the uninterrupted run would have drawn. TFF's own data sources pick
clients with Python's global `random` module and could not resume reproducibly.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
from typing import Any, Callable, Optional

import numpy as np
import tensorflow_federated as tff

from fedmf import participation as participation_lib
from fedmf.participation import Cohort, ParticipationConfig

_MAGIC = b"fedmf-participation-iterator-1\n"


class ParticipationIterator(tff.program.FederatedDataSourceIterator):
  """One participation model's rounds; `select()` returns the next round's client ids."""

  def __init__(
    self,
    spec: dict,
    model: participation_lib.ParticipationModel,
    client_id: Optional[Callable[[int], str]] = None,
  ):
    self._spec = spec
    self.model = model
    self.client_id = client_id
    self.last_cohort: Optional[Cohort] = None
    self._round = 0

  @classmethod
  def create(
    cls,
    config: ParticipationConfig,
    num_clients: int,
    clients_per_round: int,
    seed: int,
    poisson_groups: Optional[int] = None,
    client_id: Optional[Callable[[int], str]] = None,
  ) -> "ParticipationIterator":
    spec = {
      "config": dataclasses.asdict(config),
      "num_clients": int(num_clients),
      "clients_per_round": int(clients_per_round),
      "seed": int(seed),
      "poisson_groups": poisson_groups,
    }
    return cls(spec, _build(spec), client_id)

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(tff.SequenceType(np.str_), tff.CLIENTS)

  @property
  def round(self) -> int:
    """The round the next `select()` draws."""
    return self._round

  def select(self, k: Optional[int] = None) -> list[str]:
    """The next round's admitted client ids (`k` must be None or the configured cohort size)."""
    if k is not None and k != self.model.clients_per_round:
      raise ValueError(f"this data source draws cohorts of {self.model.clients_per_round}, not {k}")
    round_index = self._round
    cohort = self.model.sample(round_index)
    self._round = round_index + 1
    self.last_cohort = cohort
    id_of = self.client_id or (lambda i: str(int(i)))
    return [id_of(int(i)) for i in cohort.clients]

  def to_bytes(self) -> bytes:
    arrays = {k: np.asarray(v) for k, v in self.model.state().items()}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    header = json.dumps({"spec": self._spec, "round": self._round}).encode()
    return _MAGIC + len(header).to_bytes(8, "little") + header + buf.getvalue()

  @classmethod
  def from_bytes(cls, buffer: bytes) -> "ParticipationIterator":
    if not buffer.startswith(_MAGIC):
      raise ValueError("not a fedmf participation iterator")
    rest = buffer[len(_MAGIC) :]
    size = int.from_bytes(rest[:8], "little")
    header = json.loads(rest[8 : 8 + size])
    model = _build(header["spec"])
    with np.load(io.BytesIO(rest[8 + size :])) as arrays:
      state = {k: arrays[k] for k in arrays.files}
    if state:
      model.restore({k: (v.item() if v.ndim == 0 else v) for k, v in state.items()})
    it = cls(header["spec"], model)
    it._round = int(header["round"])
    return it

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ParticipationIterator) and self.to_bytes() == other.to_bytes()


def _build(spec: dict) -> participation_lib.ParticipationModel:
  config = ParticipationConfig(**spec["config"])
  return participation_lib.build(
    config, spec["num_clients"], spec["clients_per_round"], spec["seed"], spec["poisson_groups"]
  )


class ParticipationDataSource(tff.program.FederatedDataSource):
  """The data source of a training run: its iterators are `ParticipationIterator`s."""

  def __init__(self, *args: Any, **kwargs: Any):
    """The arguments of `ParticipationIterator.create`, from which every `iterator()` starts."""
    self._create = functools.partial(ParticipationIterator.create, *args, **kwargs)

  @property
  def federated_type(self) -> tff.FederatedType:
    return tff.FederatedType(tff.SequenceType(np.str_), tff.CLIENTS)

  def iterator(self) -> ParticipationIterator:
    return self._create()
