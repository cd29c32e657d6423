"""Writing a participation log, atomically: ``ParticipationLogWriter`` and ``write_participation_log``.

Rows go to a hidden temporary file next to the target (`fedmf.atomic_files.PartialFile`), and
``close()`` fsyncs and renames it to the final name. A crash never leaves a half-written log under
the final name (a ``keep_partial`` file keeps the flushed rows for forensics); SIGTERM while a
writer is open removes its temporary file.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedmf import atomic_files
from fedmf.privacy.log_format import (
  CLIENT_ID,
  REQUIRED_COLUMNS,
  ROUND,
  ParticipationLogError,
  log_format,
)


class ParticipationLogWriter:
  """Writes a participation log, atomically: a temporary file renamed on ``close()``.

  Usage::

    with ParticipationLogWriter("run/participation.csv") as w:
      for r in range(n):
        w.write_round(r, cohort_ids, timestamp=now)
        w.flush()

  The schema (``round``, ``client_id`` then extra columns) is fixed by the first write. Leaving the
  ``with`` block by an exception (Ctrl-C included) aborts: the temporary file is removed unless
  ``keep_partial``. So does SIGTERM while the writer is open, unless the program handles SIGTERM
  itself (then its exception or exit path should leave the ``with`` block).
  """

  def __init__(self, path: str | os.PathLike[str], *, keep_partial: bool = False):
    self.path = pathlib.Path(path)
    self._fmt = log_format(self.path)
    if not self.path.parent.exists():
      raise ParticipationLogError(f"{self.path.parent}: no such directory")
    self._partial = atomic_files.PartialFile(
      self.path, tag="partial", keep=keep_partial, sigterm=not keep_partial
    )
    self.partial_path = self._partial.partial
    self._raw = self._partial.file
    self._sink = gzip.GzipFile(fileobj=self._raw, mode="wb") if self._fmt.gzip else self._raw
    self._schema: pa.Schema | None = None
    self._writer: Any = None
    self._closed = False
    self.rows_written = 0

  def __enter__(self) -> "ParticipationLogWriter":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
    else:
      self.abort()

  def write_round(
    self, round_index: int, client_ids: Sequence[Any] | np.ndarray, **extra: Any
  ) -> None:
    """Appends the participants of one round; each extra column is a scalar or a per-client list."""
    m = len(client_ids)
    cols = {
      k: (v if isinstance(v, (list, tuple, np.ndarray, pa.Array)) else [v] * m)
      for k, v in extra.items()
    }
    self.write_rows(np.full(m, round_index, dtype=np.int64), client_ids, **cols)

  def write_rows(
    self,
    rounds: Sequence[int] | np.ndarray,
    client_ids: Sequence[Any] | np.ndarray,
    **extra: Sequence[Any] | np.ndarray,
  ) -> None:
    """Appends rows (round[i], client_ids[i], extra[i])."""
    if self._closed:
      raise ValueError("the participation log writer is closed")
    r = np.asarray(rounds)
    if r.size and (not np.issubdtype(r.dtype, np.integer)):
      rf = r.astype(np.float64)
      if not np.all(np.isfinite(rf)) or np.any(rf != np.floor(rf)):
        raise ValueError("rounds must be integers")
    r = r.astype(np.int64)
    if r.size and r.min() < 0:
      raise ValueError("rounds must be >= 0")
    ids = (
      pa.array([str(c) for c in client_ids], pa.string())
      if not isinstance(client_ids, pa.Array)
      else pc.cast(client_ids, pa.string())
    )
    if len(ids) != len(r):
      raise ValueError("rounds and client_ids differ in length")
    if len(ids) and pc.any(pc.equal(pc.utf8_length(ids), 0)).as_py():
      raise ValueError("client ids must be non-empty")
    arrays = {ROUND: pa.array(r, pa.int64()), CLIENT_ID: ids}
    for k, v in extra.items():
      if k in REQUIRED_COLUMNS:
        raise ValueError(f"extra column {k!r} clashes with a required column")
      arrays[k] = (
        v if isinstance(v, pa.Array) else pa.array(list(v) if not isinstance(v, np.ndarray) else v)
      )
      if len(arrays[k]) != len(r):
        raise ValueError(f"extra column {k!r} has the wrong length")
    table = pa.table(arrays)
    if self._schema is None:
      self._schema = table.schema
      self._open_writer()
    elif table.schema.names != self._schema.names:
      raise ValueError(f"columns {table.schema.names} differ from the log's {self._schema.names}")
    else:
      table = table.cast(self._schema)
    self._write(table)
    self.rows_written += table.num_rows

  def _open_writer(self) -> None:
    if self._fmt.kind == "csv":
      import pyarrow.csv as pacsv  # pylint: disable=g-import-not-at-top

      self._writer = pacsv.CSVWriter(
        self._sink, self._schema, write_options=pacsv.WriteOptions(quoting_style="needed")
      )
    elif self._fmt.kind == "parquet":
      import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

      self._writer = pq.ParquetWriter(self._sink, self._schema)

  def _write(self, table: pa.Table) -> None:
    if self._fmt.kind == "jsonl":
      buf = io.StringIO()
      for row in table.to_pylist():
        buf.write(json.dumps(row, default=str, allow_nan=False))
        buf.write("\n")
      self._sink.write(buf.getvalue().encode("utf-8"))
    else:
      self._writer.write_table(table)

  def flush(self) -> None:
    """Pushes written rows to the temporary file (they reach the final name only on close)."""
    if self._fmt.kind != "parquet":
      self._sink.flush()
      self._raw.flush()

  def close(self) -> pathlib.Path:
    """Finishes the file, fsyncs it and renames it to the final path. Returns the path."""
    if self._closed:
      return self.path
    if self._schema is None:
      # An empty log: header only (CSV) or an empty file.
      self._schema = pa.schema([(ROUND, pa.int64()), (CLIENT_ID, pa.string())])
      self._open_writer()
    if self._writer is not None:
      self._writer.close()
    if self._sink is not self._raw:
      self._sink.close()
    self._partial.commit()
    self._closed = True
    return self.path

  def abort(self) -> None:
    """Closes without publishing; removes the temporary file unless ``keep_partial``."""
    if self._closed:
      return
    self._closed = True
    try:
      if self._writer is not None:
        self._writer.close()
      if self._sink is not self._raw:
        self._sink.close()
    except Exception:  # pylint: disable=broad-except
      pass
    self._partial.abort()


def write_participation_log(
  path: str | os.PathLike[str],
  rounds: Sequence[int] | np.ndarray,
  client_ids: Sequence[Any] | np.ndarray,
  extra: Mapping[str, Sequence[Any]] | None = None,
) -> pathlib.Path:
  """Writes a whole log at once (atomically)."""
  with ParticipationLogWriter(path) as w:
    w.write_rows(rounds, client_ids, **(extra or {}))
  return pathlib.Path(path)
