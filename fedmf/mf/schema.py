"""The participation schema: how often, and how far apart, one client may join the n rounds.

One concept: Π_{b,k}, the b-min-separation schema (BandMF §2, BLT §2): a client joins at most k of
the n rounds (0-based), any two of them at least b apart (|i - j| ≥ b; b is the gap, never b - 1).
Every entry point (CLI, configs, the accountant, the auditor, the aggregator factory) builds one
`ParticipationSchema`; it validates once, fills the defaults and describes itself in words.

Defaults (BandMF §2): a missing k means "as many as the separation allows", ⌈n/b⌉; a missing b with
k > 1 means any rounds (b = 1); neither means single participation. Single participation is stored
as b = n, k = 1, which is the same schema (one round out of n).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Optional

from fedmf.errors import FedmfUserError


class SchemaError(FedmfUserError):
  """A participation schema that does not validate (one line naming the field)."""


# n, b and k are counted in int64 (numpy index arithmetic, the TF round counter).
MAX_COUNT = 2**63 - 1


def _whole(value: Any, name: str, minimum: int) -> int:
  def refuse():
    if isinstance(value, int) and value.bit_length() > 128:  # repr fails beyond 4300 digits
      shown = f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    else:
      shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    return SchemaError(f"{name} must be an integer in [{minimum}, 2^63 - 1], got {shown}")

  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise refuse()
  if isinstance(value, numbers.Integral):
    whole = int(value)
  elif math.isfinite(value) and float(value).is_integer():
    whole = int(value)
  else:
    raise refuse()
  if not minimum <= whole <= MAX_COUNT:
    raise refuse()
  return whole


@dataclasses.dataclass(frozen=True)
class ParticipationSchema:
  """b-min-separation participation over n rounds with at most k participations per client.

  Attributes:
    n: Number of rounds.
    min_sep: b, the smallest gap |i - j| between two rounds of one client (b = n: single
      participation).
    max_participations: k, the most rounds one client joins (filled with ⌈n/b⌉ when absent).
  """

  n: int
  min_sep: Optional[int] = None
  max_participations: Optional[int] = None

  def __post_init__(self):
    n = _whole(self.n, "the number of rounds n", 1)
    b = None if self.min_sep is None else _whole(self.min_sep, "min-sep b", 1)
    k = (
      None
      if self.max_participations is None
      else _whole(self.max_participations, "max participations k", 1)
    )
    if b is None:
      b = n if (k is None or k == 1) else 1
    if k is None:
      k = -(-n // b)
    if k == 1:
      b = max(b, n)  # One participation: the separation is vacuous.
    object.__setattr__(self, "n", n)
    object.__setattr__(self, "min_sep", b)
    object.__setattr__(self, "max_participations", k)

  @classmethod
  def of(
    cls,
    n_or_schema: "int | ParticipationSchema",
    min_sep: Optional[int] = None,
    max_participations: Optional[int] = None,
  ) -> "ParticipationSchema":
    """A schema as given, or built from (n, b, k)."""
    if isinstance(n_or_schema, ParticipationSchema):
      if min_sep is not None or max_participations is not None:
        raise TypeError("pass either a ParticipationSchema or (n, min_sep, max_participations)")
      return n_or_schema
    return cls(n_or_schema, min_sep, max_participations)

  @property
  def effective_max_participations(self) -> int:
    """min(k, ⌈n/b⌉): the most rounds one client can really join (BandMF §2)."""
    return min(self.max_participations, -(-self.n // self.min_sep))

  @property
  def single_participation(self) -> bool:
    return self.effective_max_participations == 1

  def with_rounds(self, n: int) -> "ParticipationSchema":
    """The same b and k over another number of rounds."""
    return ParticipationSchema(
      n, None if self.single_participation else self.min_sep, self.max_participations
    )

  def describe(self) -> str:
    """The schema in words, e.g. 'n = 60 rounds, each client at most 4 times, at least 15 apart'."""
    if self.single_participation:
      return f"n = {self.n} rounds, each client at most once"
    times = f"at most {self.max_participations} times"
    if self.max_participations != self.effective_max_participations:
      times += f" (at most {self.effective_max_participations} fit)"
    apart = "in any rounds" if self.min_sep == 1 else f"at least {self.min_sep} rounds apart"
    return f"n = {self.n} rounds, each client {times}, {apart}"

  def __str__(self) -> str:
    return self.describe()

  def to_dict(self) -> dict[str, int]:
    return {
      "n": self.n,
      "min_sep": self.min_sep,
      "max_participations": self.max_participations,
      "effective_max_participations": self.effective_max_participations,
    }
