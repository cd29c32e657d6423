"""The participation log's format: its columns, its file kinds and their one-line error.

One row per (round, client_id) participation (docs/participation-log.md). ``round`` is a 0-based
integer (the round whose noisy aggregate included the client's update), ``client_id`` a string (the
unit of privacy, a device). Extra columns (a timestamp, a cohort id, ...) are preserved but not
required. Formats, chosen by extension: ``.csv`` (with header), ``.jsonl`` (JSON Lines), either
optionally ``.gz``; and ``.parquet``.
"""

from __future__ import annotations

import dataclasses
import os

from fedmf.errors import FedmfUserError

ROUND = "round"
CLIENT_ID = "client_id"
REQUIRED_COLUMNS = (ROUND, CLIENT_ID)
SUFFIXES = (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".parquet")

# Rounds are integers in [0, 2^53]: a float round beyond 2^53 is not exact, and a round that large
# is a timestamp or a corrupt row, not a round (the auditor refuses per-round work beyond its limit).
MAX_ROUND_VALUE = 2**53


class ParticipationLogError(FedmfUserError):
  """A participation log that cannot be read or is invalid (one-line message naming the problem)."""


@dataclasses.dataclass(frozen=True)
class LogFormat:
  kind: str  # 'csv' | 'jsonl' | 'parquet'
  gzip: bool


def log_format(path: str | os.PathLike[str]) -> LogFormat:
  """The format of a log path, from its extension."""
  name = os.fspath(path).lower()
  for suffix, fmt in (
    (".csv.gz", LogFormat("csv", True)),
    (".jsonl.gz", LogFormat("jsonl", True)),
    (".csv", LogFormat("csv", False)),
    (".jsonl", LogFormat("jsonl", False)),
    (".parquet", LogFormat("parquet", False)),
  ):
    if name.endswith(suffix):
      return fmt
  raise ParticipationLogError(
    f"{path}: unknown participation log extension (expected one of {', '.join(SUFFIXES)})"
  )
