"""Auditing a participation log against b̂-cyclic Poisson sampling (BandMF §5, Alg. 6).

Amplified BandMF's guarantee (BandMF Thm 4) holds only if every device joined rounds of its own
partition alone: partition j owns rounds j, j + P, j + 2P, …, so all the rounds of one device are
congruent modulo P (and, when the run recorded the assignment, congruent to its partition). This
module checks exactly that on a log's (client, round) pairs, and, when the log complies and the
run declares the sampling, reports the amplified ε (`fedmf.privacy.amplification`). Pure
functions of arrays: reading the log and the run's declaration is the auditor's business.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.privacy import amplification
from fedmf.privacy import accounting

_SHOWN = 5  # Violations named in the report.


@dataclasses.dataclass(frozen=True)
class PartitionViolation:
  """A participation outside the device's partition: `round` is not ≡ `partition` (mod P)."""

  client: Any
  partition: int
  round: int


@dataclasses.dataclass(frozen=True)
class PartitionCompliance:
  partitions: int
  clients: int
  participations: int
  violating_clients: int
  violating_participations: int
  examples: tuple[PartitionViolation, ...]

  @property
  def complies(self) -> bool:
    return self.violating_participations == 0

  def describe(self) -> str:
    if self.complies:
      return (
        f"complies with {self.partitions}-cyclic partitions: each of {self.clients} devices "
        f"joined only rounds of its partition ({self.participations} participations)"
      )
    shown = "; ".join(
      f"device {v.client} (partition {v.partition}) in round {v.round}" for v in self.examples
    )
    return (
      f"violates {self.partitions}-cyclic partitions: {self.violating_clients} of "
      f"{self.clients} devices joined {self.violating_participations} rounds outside their "
      f"partition, e.g. {shown}"
    )


def check_partitions(
  clients: Sequence[Any],
  rounds: Sequence[int],
  partitions: int,
  assignment: Optional[Mapping[Any, int]] = None,
) -> PartitionCompliance:
  """Whether every device joined only rounds of its partition (round ≡ partition mod P).

  Args:
    clients, rounds: the log's participations, one (client, 0-based round) pair per entry.
    partitions: P.
    assignment: optional {client: partition in [0, P)} recorded by the run; without it a device's
      partition is the residue of its first round, so only consistency is checked.
  """
  if isinstance(partitions, bool) or int(partitions) != partitions or partitions < 1:
    raise FedmfUserError(f"partitions must be an integer >= 1, got {partitions!r}")
  p = int(partitions)
  clients = np.asarray(clients)
  rounds = np.asarray(rounds, dtype=np.int64)
  if clients.shape != rounds.shape or clients.ndim != 1:
    raise FedmfUserError("clients and rounds must be 1-D and of equal length")
  if rounds.size and rounds.min() < 0:
    raise FedmfUserError(f"rounds must be >= 0, got {int(rounds.min())}")
  ids, inverse = np.unique(clients, return_inverse=True)
  residue = rounds % p
  if assignment is None:
    # The partition of a device: the residue of its first round.
    order = np.lexsort((rounds, inverse))
    first = np.ones(order.size, dtype=bool)
    first[1:] = inverse[order][1:] != inverse[order][:-1]
    partition_of = np.empty(ids.size, dtype=np.int64)
    partition_of[inverse[order][first]] = residue[order][first]
  else:
    missing = [c for c in ids.tolist() if c not in assignment]
    if missing:
      raise FedmfUserError(f"device {missing[0]} of the log has no recorded partition")
    partition_of = np.array([int(assignment[c]) for c in ids.tolist()], dtype=np.int64)
    if partition_of.size and (partition_of.min() < 0 or partition_of.max() >= p):
      raise FedmfUserError(f"recorded partitions must lie in [0, {p})")
  expected = partition_of[inverse]
  bad = np.flatnonzero(residue != expected)
  bad = bad[np.argsort(rounds[bad], kind="stable")]
  examples = tuple(
    PartitionViolation(ids[inverse[i]].item(), int(expected[i]), int(rounds[i]))
    for i in bad[:_SHOWN]
  )
  return PartitionCompliance(
    partitions=p,
    clients=int(ids.size),
    participations=int(rounds.size),
    violating_clients=int(np.unique(inverse[bad]).size),
    violating_participations=int(bad.size),
    examples=examples,
  )


@dataclasses.dataclass(frozen=True)
class AmplifiedAudit:
  """The partition check and, if the log complies, the amplified accounting (else None, why)."""

  compliance: PartitionCompliance
  accounting: Optional[amplification.AmplifiedAccounting]
  note: str

  def to_dict(self) -> dict[str, Any]:
    c = self.compliance
    return {
      "partitions": c.partitions,
      "complies": c.complies,
      "violating_clients": c.violating_clients,
      "violating_participations": c.violating_participations,
      "amplified": None if self.accounting is None else self.accounting.to_dict(),
      "note": self.note,
    }

  @classmethod
  def uncredited(
    cls, compliance: PartitionCompliance, why: Optional[str] = None, fallback: str = ""
  ) -> "AmplifiedAudit":
    """No amplification credited, and why (default: the log does not comply); `fallback` says
    what the claim is instead."""
    if why is None:
      why = (
        compliance.describe() + " (BandMF Thm 4 needs each device in rounds of its partition only)"
      )
    return cls(compliance, None, f"no amplification credited: {why}{fallback}")


# What the auditor's claim is when the declared sampling is not credited.
_NON_AMPLIFIED = "; the claim is the non-amplified one"


def audit_amplified(
  clients: Sequence[Any],
  rounds: Sequence[int],
  *,
  strategy: Any,
  n: int,
  partitions: int,
  dataset_size: int,
  sampling_probability: float,
  noise_multiplier: float,
  delta: float,
  assignment: Optional[Mapping[Any, int]] = None,
  accountant: accounting.Accountant = accounting.AMPLIFIED_ACCOUNTANT,
) -> AmplifiedAudit:
  """Checks the log against the declared P-cyclic Poisson sampling over `dataset_size` devices
  with probability q, and reports the amplified ε of `strategy` over n rounds if it complies.

  The log cannot show the sampling itself (who was asked and declined is not logged), only where
  devices joined: the amplified ε holds if the run sampled as declared, which is the run's claim.
  """
  compliance = check_partitions(clients, rounds, partitions, assignment)
  rounds = np.asarray(rounds, dtype=np.int64)
  if rounds.size and int(rounds.max()) >= n:
    raise FedmfUserError(f"the log has round {int(rounds.max())}, beyond the n={n} rounds audited")
  clients_seen = np.unique(np.asarray(clients)).size
  if clients_seen > dataset_size:
    raise FedmfUserError(
      f"the log has {clients_seen} devices, more than the declared population {dataset_size}"
    )
  if not compliance.complies:
    return AmplifiedAudit.uncredited(compliance)
  sampling = amplification.CyclicPoissonSampling.from_probability(
    dataset_size, partitions, sampling_probability
  )
  result = amplification.account_amplified(
    strategy,
    n,
    sampling,
    delta,
    noise_multiplier=noise_multiplier,
    accountant=accountant,
  )
  return AmplifiedAudit(
    compliance,
    result,
    f"amplified epsilon {result.epsilon:.6g} at delta {result.delta:g}: the log "
    + compliance.describe()
    + f"; the run declares {sampling.describe(n)}",
  )


@dataclasses.dataclass(frozen=True)
class DeclaredSampling:
  """What a run declares about its P-cyclic Poisson sampling (`participation.model:
  cyclic-poisson`): P partitions of `dataset_size` devices, each joining its partition's rounds
  with probability q. The auditor checks the log against it (`audit_declared`)."""

  partitions: int
  dataset_size: int
  sampling_probability: float

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def audit_declared(
  client_ids: Any,
  codes: np.ndarray,
  rounds: np.ndarray,
  declared: DeclaredSampling,
  *,
  strategy: Any,
  n: int,
  noise_multiplier: float,
  delta: float,
  accountant: accounting.Accountant = accounting.AMPLIFIED_ACCOUNTANT,
) -> AmplifiedAudit:
  """`audit_amplified` on a log read as codes into `client_ids` (as the auditor reads it).

  A declaration the accounting cannot credit (a strategy that is not banded, more bands than
  partitions, a log with more devices than the declared population) is not an error of the log:
  the audit then credits no amplification and says why, so the claim falls back to the
  non-amplified one (never under-counting).
  """
  codes = np.asarray(codes, dtype=np.int64)
  compliance = check_partitions(codes, rounds, declared.partitions)
  if compliance.examples:  # Name the devices by their ids, not their codes.
    ids = client_ids.to_pylist() if hasattr(client_ids, "to_pylist") else list(client_ids)
    compliance = dataclasses.replace(
      compliance,
      examples=tuple(
        dataclasses.replace(v, client=ids[int(v.client)]) for v in compliance.examples
      ),
    )
  if not compliance.complies:
    return AmplifiedAudit.uncredited(compliance, fallback=_NON_AMPLIFIED)
  try:
    result = audit_amplified(
      codes,
      rounds,
      strategy=strategy,
      n=n,
      noise_multiplier=noise_multiplier,
      delta=delta,
      accountant=accountant,
      **declared.to_dict(),  # partitions, dataset_size, sampling_probability
    )
  except FedmfUserError as e:
    return AmplifiedAudit.uncredited(compliance, str(e), _NON_AMPLIFIED)
  return dataclasses.replace(result, compliance=compliance)
