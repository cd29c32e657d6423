"""The participation log: who joined which round (format: docs/participation-log.md).

One row per (round, client_id) participation; ``.csv``, ``.jsonl`` (either optionally ``.gz``) and
``.parquet``. This module is the one name callers import; each concept lives in a module of its own:

* `fedmf.privacy.log_format`: the columns, the formats by extension, ``ParticipationLogError``;
* `fedmf.privacy.log_reader`: validated, streamed pyarrow batches (``iter_log_batches``);
* `fedmf.privacy.client_index`: ids as dense codes (``ClientIndex``), the log as arrays;
* `fedmf.privacy.log_writer`: the atomic writer (``ParticipationLogWriter``);
* `fedmf.privacy.log_journal`: the durable, appendable log of a resumable program.

Layer 2 (docs/architecture.md): numpy + pyarrow, no TensorFlow.
"""

from __future__ import annotations

from fedmf.privacy.client_index import (
  ClientIndex,
  ParticipationArrays,
  iter_participation_codes,
  read_participation_arrays,
)
from fedmf.privacy.log_format import (
  CLIENT_ID,
  MAX_ROUND_VALUE,
  REQUIRED_COLUMNS,
  ROUND,
  SUFFIXES,
  LogFormat,
  ParticipationLogError,
  log_format,
)
from fedmf.privacy.log_journal import AppendableParticipationLog, csv_rounds, truncate_csv_by_round
from fedmf.privacy.log_reader import LogTail, iter_log_batches, read_participation_log
from fedmf.privacy.log_writer import ParticipationLogWriter, write_participation_log

__all__ = [
  "CLIENT_ID",
  "MAX_ROUND_VALUE",
  "REQUIRED_COLUMNS",
  "ROUND",
  "SUFFIXES",
  "AppendableParticipationLog",
  "ClientIndex",
  "LogFormat",
  "LogTail",
  "ParticipationArrays",
  "ParticipationLogError",
  "ParticipationLogWriter",
  "csv_rounds",
  "iter_log_batches",
  "iter_participation_codes",
  "log_format",
  "read_participation_arrays",
  "read_participation_log",
  "truncate_csv_by_round",
  "write_participation_log",
]
