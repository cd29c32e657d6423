"""The participation log: THE reader and writer of who joined which round (format: docs/participation-log.md).

One row per (round, client_id) participation. ``round`` is a 0-based integer (the round whose noisy
aggregate included the client's update), ``client_id`` a string (the unit of privacy, a device).
Extra columns (a timestamp, a cohort id, ...) are preserved but not required.

Formats, chosen by extension: ``.csv`` (with header), ``.jsonl`` (JSON Lines), either optionally
``.gz``; and ``.parquet``. Reading streams (CSV, Parquet) or is columnar (JSONL) with pyarrow, so a
10-million-row log never becomes 10 million Python objects. Client ids become dense integer codes
through ``ClientIndex``, a hash table over the ids' bytes vectorized with numpy.

The writer is atomic: rows go to a hidden temporary file next to the target, and ``close()`` fsyncs
and renames it to the final name. A crash never leaves a half-written log under the final name (the
``.partial`` file keeps the flushed rows for forensics).

This module is layer 2 (docs/architecture.md): numpy + pyarrow, no TensorFlow.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import pathlib
import sys
import zlib
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedmf import atomic_files
from fedmf.errors import FedmfUserError

ROUND = "round"
CLIENT_ID = "client_id"
REQUIRED_COLUMNS = (ROUND, CLIENT_ID)
SUFFIXES = (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".parquet")

# Rounds are integers in [0, 2^53]: a float round beyond 2^53 is not exact, and a round that large
# is a timestamp or a corrupt row, not a round (the auditor refuses per-round work beyond its limit).
MAX_ROUND_VALUE = 2**53
_CSV_BLOCK_SIZE = 1 << 22  # 4 MiB per streamed CSV block (~300k rows of a typical log).
_JSONL_CHUNK_ROWS = 100_000


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


# ---------------------------------------------------------------------------------------------------
# Reading.


def _open_text(path: str, fmt: LogFormat):
  # utf-8-sig: a byte-order mark before the header (as spreadsheet programs write) is not part of
  # the first column's name; pyarrow's CSV reader skips it too.
  return (
    gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    if fmt.gzip
    else open(path, "r", encoding="utf-8-sig", newline="")
  )


def _check_exists(path: str) -> None:
  if not os.path.exists(path):
    raise ParticipationLogError(f"{path}: no such participation log")
  if os.path.isdir(path):
    raise ParticipationLogError(f"{path}: is a directory, not a participation log")


def _csv_header(path: str, fmt: LogFormat) -> list[str]:
  try:
    with _open_text(path, fmt) as f:
      line = f.readline()
  except (OSError, EOFError, UnicodeDecodeError) as e:
    raise ParticipationLogError(f"{path}: cannot read: {e}") from None
  if not line.strip():
    raise ParticipationLogError(f"{path}: empty log (no header line)")
  return next(csv.reader([line]))


def _missing(path: str, names: Sequence[str]) -> None:
  for col in REQUIRED_COLUMNS:
    if col not in names:
      raise ParticipationLogError(
        f"{path}: missing column '{col}' (columns: {', '.join(map(str, names)) or 'none'})"
      )


def _validate_batch(path: str, batch: pa.RecordBatch | pa.Table, first_row: int) -> pa.Table:
  """Validates and normalizes ``round`` to int64 and ``client_id`` to string. Rows are 1-based."""
  table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
  rounds = table.column(ROUND)
  if pa.types.is_string(rounds.type) or pa.types.is_large_string(rounds.type):
    rounds = _numeric_rounds(path, rounds, first_row)
  rtype = rounds.type
  if pa.types.is_null(rtype) and len(rounds):
    raise ParticipationLogError(f"{path}: row {first_row}: missing round")
  if rounds.null_count:
    i = int(np.flatnonzero(rounds.is_null().to_numpy(zero_copy_only=False))[0])
    raise ParticipationLogError(f"{path}: row {first_row + i}: missing round")
  if pa.types.is_floating(rtype):
    r = rounds.to_numpy().astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
      bad = ~np.isfinite(r) | (r != np.floor(r)) | (np.abs(r) > MAX_ROUND_VALUE)
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      if not np.isfinite(r[i]):
        raise ParticipationLogError(
          f"{path}: row {first_row + i}: non-finite round {float(r[i])!r}"
        )
      if abs(r[i]) > MAX_ROUND_VALUE:
        raise _round_out_of_range(path, first_row + i, f"{float(r[i]):g}")
      raise ParticipationLogError(f"{path}: row {first_row + i}: non-integer round {float(r[i])!r}")
    r_int = r.astype(np.int64)
  elif pa.types.is_integer(rtype) or pa.types.is_null(rtype):
    raw = rounds.to_numpy() if len(rounds) else np.zeros(0, np.int64)
    if raw.dtype == np.uint64 and raw.size and raw.max() > MAX_ROUND_VALUE:
      i = int(np.flatnonzero(raw > MAX_ROUND_VALUE)[0])
      raise _round_out_of_range(path, first_row + i, str(int(raw[i])))
    r_int = raw.astype(np.int64, copy=False)
    big = np.abs(r_int) > MAX_ROUND_VALUE
    if big.any():
      i = int(np.flatnonzero(big)[0])
      raise _round_out_of_range(path, first_row + i, str(int(r_int[i])))
  else:
    raise ParticipationLogError(f"{path}: column 'round' must hold integers, found {rtype}")
  neg = r_int < 0
  if neg.any():
    i = int(np.flatnonzero(neg)[0])
    raise ParticipationLogError(f"{path}: row {first_row + i}: negative round {int(r_int[i])}")
  ids = table.column(CLIENT_ID)
  if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
    value_type = ids.type.value_type if pa.types.is_dictionary(ids.type) else ids.type
    if pa.types.is_boolean(value_type) or pa.types.is_floating(value_type):
      # true/false or 1.5 are not ids; reading them as the text "true" would merge clients.
      raise ParticipationLogError(
        f"{path}: column 'client_id' must hold strings or integers, found {_type_name(value_type)}"
      )
    try:
      ids = pc.cast(ids, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
      raise ParticipationLogError(
        f"{path}: column 'client_id' must hold strings, found {ids.type}"
      ) from None
  if ids.null_count or (len(ids) and pc.min(pc.binary_length(ids)).as_py() == 0):
    empty = pc.or_kleene(ids.is_null(), pc.equal(pc.binary_length(ids), 0))
    i = int(
      np.flatnonzero(
        empty.to_numpy(zero_copy_only=False)
        if isinstance(empty, pa.Array)
        else pa.concat_arrays(empty.chunks).to_numpy(zero_copy_only=False)
      )[0]
    )
    raise ParticipationLogError(f"{path}: row {first_row + i}: missing client_id")
  table = table.set_column(table.schema.get_field_index(ROUND), ROUND, pa.array(r_int, pa.int64()))
  table = table.set_column(table.schema.get_field_index(CLIENT_ID), CLIENT_ID, ids)
  return table


def _numeric_rounds(path: str, rounds: Any, first_row: int) -> Any:
  """Rounds read as text (some value is not a number) as float64, or an error naming the row.

  The rows before the first one that is not a number are numbers: the first of them that is not an
  integer (``1.5`` before ``x``) is named instead, as the float64 read would have.
  """
  try:
    return pc.cast(rounds, pa.float64())
  except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
    pass
  for i, text in enumerate(rounds.to_pylist()):  # An error path: the batch's rows one by one.
    if text is None:
      continue
    try:
      pc.cast(pa.scalar(text, pa.string()), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
      prefix = pc.cast(rounds.slice(0, i), pa.float64())
      _validate_batch(path, pa.table({ROUND: prefix, CLIENT_ID: pa.array(["-"] * i)}), first_row)
      shown = text if len(text) <= 30 else text[:27] + "..."
      raise ParticipationLogError(
        f"{path}: row {first_row + i}: round {shown!r} is not an integer"
      ) from None
  raise ParticipationLogError(f"{path}: column 'round' must hold integers")


def _round_out_of_range(path: str, row: int, shown: str) -> ParticipationLogError:
  return ParticipationLogError(
    f"{path}: row {row}: round {shown} is out of range (rounds are integers in [0, 2^53])"
  )


def _type_name(arrow_type: pa.DataType) -> str:
  """A column type in the words of the file: JSON true/false is 'true/false', not 'bool'."""
  if pa.types.is_boolean(arrow_type):
    return "true/false values"
  if pa.types.is_floating(arrow_type):
    return "non-integer numbers"
  return str(arrow_type)


def _arrow_error(path: str, e: Exception) -> ParticipationLogError:
  msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return ParticipationLogError(f"{path}: {msg}")


class _Progress:
  """A tqdm bar on stderr (when enabled): bytes of the file read for CSV, rows for Parquet/JSONL."""

  def __init__(self, path: str, enabled: bool, fmt: LogFormat):
    self.bar = None
    if not enabled:
      return
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top

    desc = f"reading {os.path.basename(path)}"
    if fmt.kind == "csv":  # Position in the file itself (compressed bytes for .csv.gz).
      self.bar = tqdm(
        total=os.path.getsize(path),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=sys.stderr,
        leave=False,
      )
    else:
      total = None
      if fmt.kind == "parquet":
        import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

        try:
          total = pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowInvalid, OSError):
          pass
      self.bar = tqdm(
        total=total, unit=" rows", unit_scale=True, desc=desc, file=sys.stderr, leave=False
      )

  def position(self, position: int) -> None:
    """CSV: the file has been read up to ``position`` bytes."""
    if self.bar is not None and self.bar.unit == "B":
      self.bar.update(max(0, min(position, self.bar.total) - self.bar.n))

  def rows(self, rows: int) -> None:
    if self.bar is not None and self.bar.unit != "B":
      self.bar.update(rows)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


class LogTail:
  """What the reader saw at the end of a CSV log (filled in as the last batch is read).

  ``cut_off_row``: the 1-based row number of the last row when the file's last line has no line
  end: a writer stopped mid-line leaves such a line, whose client id may be incomplete (``cli`` of
  ``client_7``). The row is read, and the caller reports it (``fedmf audit --strict`` fails).
  Mutable on purpose: the reader is a generator, and this is how it hands back what it found.
  """

  def __init__(self) -> None:
    self.cut_off_row: Optional[int] = None


# The last line is checked for an open quote from at most this many final bytes of the file.
_TAIL_BYTES = 1 << 16


class _TailKeepingStream(io.RawIOBase):
  """A readable stream passing through another's bytes and keeping the last ``_TAIL_BYTES``.

  For ``.csv.gz``: the end of the decompressed text is known only once it has been read, and this
  sees it on the way to pyarrow's CSV reader (one Python call per 4 MiB block).
  """

  def __init__(self, inner: Any):
    super().__init__()
    self._inner = inner
    self.tail = b""

  def readable(self) -> bool:
    return True

  def read(self, size: int = -1) -> bytes:
    data = self._inner.read(size) if size is not None and size >= 0 else self._inner.read()
    data = bytes(data)
    if data:
      self.tail = (
        (self.tail + data)[-_TAIL_BYTES:] if len(data) < _TAIL_BYTES else data[-_TAIL_BYTES:]
      )
    return data

  def readinto(self, buffer) -> int:
    data = self.read(len(buffer))
    buffer[: len(data)] = data
    return len(data)


def _file_tail(path: str) -> bytes:
  """The last ``_TAIL_BYTES`` bytes of an uncompressed file."""
  with open(path, "rb") as f:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - _TAIL_BYTES))
    return f.read()


def _open_quote(line: bytes) -> bool:
  """Whether a CSV line ends inside a quoted field (its quote never closed)."""
  try:
    list(csv.reader([line.decode("utf-8", errors="replace")], strict=True))
  except csv.Error:
    return True
  return False


def _check_last_line(path: str, tail: bytes, rows: int, last_ids: Optional[pa.Array], end: LogTail):
  """Checks the end of a CSV log whose ``rows`` rows have been read (docs/participation-log.md).

  * The file ends inside a quoted field: an error naming the row. Either the last line opens a
    quote and has no line end (a writer killed mid-field: ``3,"cli``), or a quote opened earlier
    never closed and swallowed every line after it into the last row's client id (which then ends
    with the file's own last bytes, line break included).
  * The last line has no line end: ``end.cut_off_row`` is set (reported, not refused).
  """
  if rows == 0 or not tail:
    return
  if tail[-1:] not in (b"\n", b"\r"):
    last_line = tail.rsplit(b"\n", 1)[-1]
    if _open_quote(last_line):
      raise ParticipationLogError(
        f"{path}: row {rows}: unterminated quote (the last line is cut off)"
      )
    end.cut_off_row = rows
    return
  if last_ids is not None and len(last_ids):
    last = last_ids[len(last_ids) - 1].as_py()
    if last and ("\n" in last or "\r" in last) and tail.endswith(last.encode("utf-8")):
      raise ParticipationLogError(
        f"{path}: row {rows}: unterminated quote (the client id runs to the end of the file)"
      )


def _iter_csv(
  path: str,
  fmt: LogFormat,
  columns: Sequence[str] | None,
  progress: Optional[_Progress] = None,
  end: Optional[LogTail] = None,
) -> Iterator[Any]:
  import pyarrow.csv as pacsv  # pylint: disable=g-import-not-at-top

  header = _csv_header(path, fmt)
  _missing(path, header)
  include = list(columns) if columns is not None else header
  for col in include:
    if col not in header:
      raise ParticipationLogError(f"{path}: missing column '{col}'")
  end = end if end is not None else LogTail()
  # Rounds are read as int64 first (twice as fast to parse as float64); if a value does not parse
  # as an integer ("3.0", "1.5", "nan", ...), the file is re-read with float64 rounds from the first
  # row not yet yielded, so that _validate_batch accepts integral floats and names the bad row; if
  # one is not a number at all ("x"), as text, for _validate_batch to name its row.
  emitted = 0
  last_ids = None
  for round_type in (pa.int64(), pa.float64(), pa.string()):
    convert = pacsv.ConvertOptions(
      column_types={ROUND: round_type, CLIENT_ID: pa.string()},
      include_columns=include,
      null_values=[""],
      strings_can_be_null=False,
      quoted_strings_can_be_null=False,
    )
    skip = emitted
    raw = None
    try:
      raw = pa.OSFile(path, "rb")
      tracked = _TailKeepingStream(pa.CompressedInputStream(raw, "gzip")) if fmt.gzip else None
      stream = pa.PythonFile(tracked, mode="r") if tracked is not None else raw
      reader = pacsv.open_csv(
        stream, read_options=pacsv.ReadOptions(block_size=_CSV_BLOCK_SIZE), convert_options=convert
      )
      while True:
        try:
          batch = reader.read_next_batch()
        except StopIteration:
          tail = tracked.tail if tracked is not None else _file_tail(path)
          _check_last_line(path, tail, emitted, last_ids, end)
          return
        if skip:
          if batch.num_rows <= skip:
            skip -= batch.num_rows
            continue
          batch = batch.slice(skip)
          skip = 0
        emitted += batch.num_rows
        if batch.num_rows:
          last_ids = batch.column(CLIENT_ID).slice(batch.num_rows - 1)
        if progress is not None:
          progress.position(raw.tell())
        yield batch
    except pa.ArrowInvalid as e:
      if not pa.types.is_string(round_type) and "conversion error to" in str(e):
        continue
      raise _arrow_error(path, e) from None
    except (pa.ArrowIOError, OSError, EOFError) as e:
      raise _arrow_error(path, e) from None
    finally:
      if raw is not None:
        raw.close()


def _iter_jsonl(path: str, fmt: LogFormat, columns: Sequence[str] | None) -> Iterator[Any]:
  import pyarrow.json as pajson  # pylint: disable=g-import-not-at-top

  try:
    with pa.input_stream(path, compression="gzip" if fmt.gzip else None) as stream:
      table = pajson.read_json(stream)
    if table.num_columns == 0 and table.num_rows == 0:
      raise ParticipationLogError(f"{path}: empty log")
    _missing(path, table.column_names)
    if CLIENT_ID in table.column_names and pa.types.is_floating(table.column(CLIENT_ID).type):
      # pyarrow reads an integer beyond int64 as a double, losing digits: parse the lines
      # exactly instead (ids that are really non-integer numbers are refused there).
      raise pa.ArrowInvalid("client ids beyond int64")
    tables: Iterable[Any] = [table]
  except pa.ArrowInvalid:
    # Mixed types across lines (e.g. integer and string client ids): parse line by line, in chunks.
    tables = _iter_jsonl_python(path, fmt)
  for t in tables:
    _missing(path, t.column_names)
    if columns is not None:
      for col in columns:
        if col not in t.column_names:
          raise ParticipationLogError(f"{path}: missing column '{col}'")
      t = t.select(list(columns))
    for batch in t.to_batches():
      yield batch


def _iter_jsonl_python(path: str, fmt: LogFormat) -> Iterator[pa.Table]:
  rows: list[dict[str, Any]] = []
  with _open_text(path, fmt) as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ParticipationLogError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
      if not isinstance(obj, dict):
        raise ParticipationLogError(f"{path}: line {lineno}: expected a JSON object")
      client = obj.get(CLIENT_ID)
      if isinstance(client, int) and not isinstance(client, bool):
        obj[CLIENT_ID] = str(client)  # Exact, however many digits (the docs: read as strings).
      elif client is not None and not isinstance(client, str):
        shown = json.dumps(client)
        shown = shown if len(shown) <= 30 else shown[:27] + "..."
        raise ParticipationLogError(
          f"{path}: line {lineno}: client_id must be a string or an integer, got {shown}"
        )
      if ROUND in obj and isinstance(obj[ROUND], (int, float)) and not isinstance(obj[ROUND], bool):
        if isinstance(obj[ROUND], int) and abs(obj[ROUND]) > MAX_ROUND_VALUE:
          raise _round_out_of_range(path, lineno, str(obj[ROUND])[:30])
        obj[ROUND] = float(obj[ROUND])
      elif ROUND in obj and obj[ROUND] is not None:
        raise ParticipationLogError(
          f"{path}: line {lineno}: round must be an integer, got {json.dumps(obj[ROUND])[:30]}"
        )
      rows.append(obj)
      if len(rows) >= _JSONL_CHUNK_ROWS:
        yield _pylist_table(path, rows)
        rows = []
  if rows:
    yield _pylist_table(path, rows)


def _pylist_table(path: str, rows: list[dict[str, Any]]) -> pa.Table:
  try:
    return pa.Table.from_pylist(rows)
  except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
    raise _arrow_error(path, e) from None


def _iter_parquet(path: str, columns: Sequence[str] | None) -> Iterator[Any]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    _missing(path, names)
    for col in columns or ():
      if col not in names:
        raise ParticipationLogError(f"{path}: missing column '{col}'")
    yield from pf.iter_batches(batch_size=1 << 20, columns=list(columns) if columns else None)
  except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
    raise _arrow_error(path, e) from None


def iter_log_batches(
  path: str | os.PathLike[str],
  columns: Sequence[str] | None = None,
  progress: bool = False,
  end: Optional[LogTail] = None,
) -> Iterator[pa.Table]:
  """Streams a participation log as validated tables (round: int64, client_id: string).

  Args:
    path: A ``.csv``, ``.csv.gz``, ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` file.
    columns: Columns to read (must include 'round' and 'client_id'); None reads all, extras kept.
    progress: Show a tqdm progress bar on stderr (the caller decides: e.g. only on a terminal).
    end: Receives what the end of a CSV file showed (``LogTail.cut_off_row``: a last line without
      its line end), once the last batch has been read.

  Raises:
    ParticipationLogError: missing file, empty log, missing column, bad round or client_id, a
      quote never closed.
  """
  path = os.fspath(path)
  fmt = log_format(path)
  _check_exists(path)
  if columns is not None:
    columns = list(dict.fromkeys(list(REQUIRED_COLUMNS) + list(columns)))
  bar = _Progress(path, progress, fmt)
  if fmt.kind == "csv":
    batches = _iter_csv(path, fmt, columns, bar, end)
  elif fmt.kind == "jsonl":
    batches = _iter_jsonl(path, fmt, columns)
  else:
    batches = _iter_parquet(path, columns)
  row = 1
  total = 0
  try:
    while True:
      try:
        batch = next(batches)
      except StopIteration:
        break
      except ParticipationLogError:
        raise
      except (OSError, EOFError, UnicodeDecodeError, zlib.error, pa.ArrowException) as e:
        # A truncated .gz, bytes that are not UTF-8, a file that vanished: one line, no traceback.
        raise _arrow_error(path, e) from None
      if batch.num_rows == 0:
        continue
      table = _validate_batch(path, batch, row)
      row += table.num_rows
      total += table.num_rows
      bar.rows(table.num_rows)
      yield table
  finally:
    bar.close()
    if hasattr(batches, "close"):
      batches.close()
  if total == 0:
    raise ParticipationLogError(f"{path}: empty log (no participation rows)")


def read_participation_log(
  path: str | os.PathLike[str], columns: Sequence[str] | None = None, progress: bool = False
) -> pa.Table:
  """The whole validated log as one pyarrow Table (columnar; extra columns preserved)."""
  tables = list(iter_log_batches(path, columns=columns, progress=progress))
  try:
    return pa.concat_tables(tables, promote_options="default")
  except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
    raise _arrow_error(os.fspath(path), e) from None


@dataclasses.dataclass(frozen=True)
class ParticipationArrays:
  """A log as flat arrays, for the auditor: row i is (rounds[i], client_ids[codes[i]]).

  Attributes:
    rounds: int64 [rows].
    codes: int32/int64 [rows], index into ``client_ids``.
    client_ids: pyarrow StringArray of the distinct client ids.
  """

  rounds: np.ndarray
  codes: np.ndarray
  client_ids: pa.Array
  cut_off_row: Optional[int] = None  # See LogTail.

  @property
  def rows(self) -> int:
    return int(self.rounds.shape[0])


def iter_participation_codes(
  path: str | os.PathLike[str],
  index: "ClientIndex",
  progress: bool = False,
  end: Optional[LogTail] = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Streams a log as (rounds int64, codes int32) per batch; ``index`` maps ids to codes.

  New ids are added to ``index`` (codes number the clients in order of first appearance), so a
  second pass with the same index gives the same codes. Memory: one batch plus the index.
  """
  for table in iter_log_batches(path, columns=REQUIRED_COLUMNS, progress=progress, end=end):
    rounds = table.column(ROUND).to_numpy()
    chunks = table.column(CLIENT_ID).chunks
    codes = (
      index.codes(chunks[0])
      if len(chunks) == 1
      else np.concatenate([index.codes(chunk) for chunk in chunks])
    )
    yield rounds, codes


def read_participation_arrays(
  path: str | os.PathLike[str], progress: bool = False
) -> ParticipationArrays:
  """Reads only (round, client_id) into numpy rounds + codes (12 bytes/row + the distinct ids).

  ``codes`` number the clients in order of first appearance in the log and ``client_ids`` lists them
  in that order (as ``pyarrow.compute.dictionary_encode`` would), through ``ClientIndex``.
  """
  index = ClientIndex()
  end = LogTail()
  round_chunks: list[np.ndarray] = []
  code_chunks: list[np.ndarray] = []
  for rounds, codes in iter_participation_codes(path, index, progress=progress, end=end):
    round_chunks.append(rounds)
    code_chunks.append(codes)
  return ParticipationArrays(
    rounds=np.concatenate(round_chunks).astype(np.int64, copy=False),
    codes=np.concatenate(code_chunks),
    client_ids=index.client_ids(),
    cut_off_row=end.cut_off_row,
  )


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [len+1], data uint8) of a string/large_string array, as zero-copy numpy views."""
  off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
  bufs = arr.buffers()
  offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset : arr.offset + len(arr) + 1]
  data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
  return offsets, data


# Masks keeping the first l bytes of a little-endian 64-bit word, l = 0..8.
_BYTE_MASKS = np.array([(1 << (8 * l)) - 1 for l in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
# Odd multipliers: words of a long id are combined with the next ones, the hash is a multiply,
# xor-shift, multiply (splitmix64's constants; Steele, Lea & Flood 2014).
_WORD_MULTIPLIERS = (0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x9E3779B97F4A7C15)
_HASH_1 = np.uint64(0x9E3779B97F4A7C15)
_HASH_2 = np.uint64(0xBF58476D1CE4E5B9)


def _id_words(arr: pa.Array, num_words: int) -> tuple[list[np.ndarray], np.ndarray, bool]:
  """Each id's bytes, zero-padded to ``num_words`` little-endian 64-bit words (vectorized).

  Returns (words: ``num_words`` uint64 arrays, lengths, whether some id has a NUL byte). Ids longer
  than ``8 * num_words`` bytes are the caller's to widen (``lengths`` tells). Each word is one
  unaligned 8-byte load per id through a byte-strided view of arrow's data buffer, masked to the
  id's length: no copy of the strings.
  """
  offsets, data = _string_buffers(arr)
  lengths = np.diff(offsets)
  lo, hi = int(offsets[0]), int(offsets[-1])
  has_nul = bool(hi > lo and np.count_nonzero(data[lo:hi]) != hi - lo)
  size = data.shape[0]
  if size < 16:  # Tiny buffer: a zero-padded copy is simplest.
    data = np.concatenate([data, np.zeros(16, np.uint8)])
    size = data.shape[0]
  # words_at[p] = the 8 bytes data[p:p+8], for p <= size - 8.
  words_at = np.ndarray(shape=(size - 7,), dtype="<u8", buffer=data, strides=(1,))
  # Loads starting in the last 8 bytes of the buffer read a zero-padded copy of its tail instead.
  tail = np.zeros(24, dtype=np.uint8)
  tail[:8] = data[size - 8 :]
  tail_words = np.ndarray(shape=(17,), dtype="<u8", buffer=tail, strides=(1,))
  starts = offsets[:-1]
  words = []
  for j in range(num_words):
    # Starts increase, so the ids whose j-th load would run past the buffer are a suffix.
    cut = int(np.searchsorted(starts, size - 8 - 8 * j, side="right"))
    word = np.empty(starts.shape[0], dtype=np.uint64)
    word[:cut] = words_at[starts[:cut] + 8 * j if j else starts[:cut]]
    if cut < starts.shape[0]:
      pos = starts[cut:].astype(np.int64) + 8 * j - (size - 8)
      word[cut:] = tail_words[np.clip(pos, 0, 16)]
    if j:
      word &= _BYTE_MASKS[np.clip(lengths - 8 * j, 0, 8)]
    else:
      word &= _BYTE_MASKS[np.minimum(lengths, 8)]
    words.append(word)
  return words, lengths, has_nul


class ClientIndex:
  """Client id strings -> dense int32 codes, numbered in order of first appearance.

  A hash table over the ids' bytes, vectorized over a batch of ids (no Python per row). An id's key
  is its bytes zero-padded to whole 64-bit words: injective as long as no id contains a NUL byte;
  once one does, the id's length is prepended as a further key word (and the table rebuilt). Key
  word 0 is never 0 (a length >= 1, or a first byte that is not NUL), so 0 marks an empty slot.

  Open addressing with linear probing (Knuth, TAOCP vol. 3, 6.4) at load <= 1/4, without
  wrap-around (a spill area follows the last home slot). A slot is one row of ``_cells``: the key
  words, then the code, so a lookup touches one cache line; about 88% of the ids are found in their
  home slot, and a random memory access is most of the cost, hence the low load. Arrow's own hash
  kernels (dictionary_encode, unique) are 10-100x slower than this on 10M-row logs
  (docs/benchmarks.md, section 2).

  Memory: 4 x 8 x (key words + 1) bytes per distinct client (64 bytes for ids of <= 8 bytes).
  """

  _LOAD_SHIFT = 2  # At most 2^-2 of the home slots hold a key.
  _SPILL = 64  # Slots after the last home slot that probes may use before the table grows.
  _INSERT_ROWS = 1 << 16
  _SLICE_ROWS = 1 << 19

  def __init__(self):
    self._num_words = 1  # Byte words per key.
    self._with_length = False  # Keys start with a length word (an id had a NUL byte).
    self._size = 0
    self._allocate(10)

  def __len__(self) -> int:
    return self._size

  @property
  def _width(self) -> int:
    return self._num_words + self._with_length

  def _allocate(self, bits: int) -> None:
    """Empty cells: 2^bits home slots + spill + one slot never used (it ends every probe)."""
    self._bits = bits
    self._cells = np.zeros(((1 << bits) + self._SPILL + 1, self._width + 1), np.uint64)

  def _key_col(self, j: int) -> np.ndarray:
    return self._cells[:, j]

  def _code_col(self) -> np.ndarray:
    return self._cells[:, -1].view(np.int64)

  # -- keys and hashing --------------------------------------------------------------------------

  def _batch_keys(self, ids: pa.Array) -> list[np.ndarray]:
    """The key words of a batch of ids, widening the index first if the batch needs it."""
    offsets, _ = _string_buffers(ids)
    needed = max(1, -(-int(np.diff(offsets).max()) // 8))
    if needed > self._num_words:  # Zero words change neither keys nor hashes: add empty columns.
      cells = np.zeros(
        (self._cells.shape[0], self._width + 1 + needed - self._num_words), np.uint64
      )
      cells[:, : self._width] = self._cells[:, : self._width]
      cells[:, -1] = self._cells[:, -1]
      self._cells = cells
      self._num_words = needed
    words, lengths, has_nul = _id_words(ids, self._num_words)
    if has_nul and not self._with_length:
      self._add_length_word()
    if self._with_length:
      return [lengths.astype(np.uint64)] + words
    return words

  def _add_length_word(self) -> None:
    """Prepends each key's length (no id so far had a NUL byte: its nonzero bytes), rehashes."""
    keys, codes = self._entries()
    mat = np.stack(keys, axis=1).astype("<u8").view(np.uint8).reshape(codes.shape[0], 8 * len(keys))
    lengths = np.count_nonzero(mat, axis=1).astype(np.uint64)
    self._with_length = True
    self._rebuild(self._bits, [lengths] + keys, codes)

  def _hash(self, keys: list[np.ndarray]) -> np.ndarray:
    """64-bit hashes: multiply, xor-shift, multiply of the words (combined by odd multipliers)."""
    h = keys[0] * _HASH_1
    for j, word in enumerate(keys[1:]):
      h ^= word * np.uint64(_WORD_MULTIPLIERS[j % len(_WORD_MULTIPLIERS)])
    h ^= h >> np.uint64(29)
    h *= _HASH_2
    return h

  def _hash_slots(self, keys: list[np.ndarray], bits: Optional[int] = None) -> np.ndarray:
    """Home slots: the top ``bits`` bits of the hash."""
    h = self._hash(keys)
    h >>= np.uint64(64 - (self._bits if bits is None else bits))
    return h.view(np.int64)

  def _entries(self) -> tuple[list[np.ndarray], np.ndarray]:
    """(key words, codes) of the occupied slots."""
    used = np.nonzero(self._key_col(0))[0]  # (flatnonzero would copy the strided column)
    return [self._key_col(j)[used] for j in range(self._width)], self._code_col()[used]

  def _lookup(self, slot: np.ndarray, keys: list[np.ndarray], rows=None):
    """(whether slot i holds row i's key, the slot's code): one take of whole cells."""
    cells = np.take(self._cells, slot, axis=0)
    match = None
    for j, word in enumerate(keys):
      eq = cells[:, j] == (word if rows is None else word[rows])
      match = eq if match is None else np.logical_and(match, eq, out=match)
    return match, cells[:, -1].view(np.int64)

  # -- lookups and inserts -----------------------------------------------------------------------

  def _find(self, keys: list[np.ndarray]) -> np.ndarray:
    """Codes of the keys, -1 where absent."""
    hit, codes = self._lookup(self._hash_slots(keys), keys)
    if hit.all():
      return codes
    codes = codes.copy()
    miss = np.flatnonzero(~hit)
    # Linear probing from the home slot: a probe ends at the key or at an empty slot.
    codes[miss] = -1
    pending, slot = miss, self._hash_slots([k[miss] for k in keys])
    key0 = self._key_col(0)
    while pending.size:
      occupied = key0[slot] != 0
      pending, slot = pending[occupied], slot[occupied] + 1
      if not pending.size:
        break
      hit, found = self._lookup(slot, keys, pending)
      codes[pending[hit]] = found[hit]
      miss = ~hit
      pending, slot = pending[miss], slot[miss]
    return codes

  def _rebuild(self, bits: int, keys: list[np.ndarray], codes: np.ndarray) -> None:
    """A table of 2^bits home slots (or more, if the spill overflows) holding the given entries.

    Linear probing that inserts keys in order of home slot puts key i at
    pos_i = max(home_i, pos_(i-1) + 1), i.e. pos = maximum.accumulate(home - i) + i: one stable
    argsort (the old table is nearly in home order) and sequential writes, no probing.
    """
    h = self._hash(keys)
    while True:
      home = (h >> np.uint64(64 - bits)).view(np.int64)
      order = np.argsort(home, kind="stable")
      rank = np.arange(order.shape[0], dtype=np.int64)
      pos = np.maximum.accumulate(home[order] - rank) + rank if order.shape[0] else rank
      if not pos.shape[0] or pos[-1] < (1 << bits) + self._SPILL:
        break
      bits += 1
    self._allocate(bits)
    for j, word in enumerate(keys):
      self._key_col(j)[pos] = word[order]
    self._code_col()[pos] = codes[order]

  def _insert(self, keys: list[np.ndarray]) -> np.ndarray:
    """Adds absent keys (repeats allowed), numbered in order of first appearance; their codes.

    No sort: each row probes for its key or a free slot; a free slot is claimed by writing the
    row's key and provisional code -1 - row into it (one claimant wins it, the others see its key
    and either share the slot or probe on). The largest mark of a slot is its key's first row, and
    the first rows, in row order, receive the next codes. (A key already present resolves to its
    slot, whose code is >= 0, and keeps it.)
    """
    rows = keys[0].shape[0]
    if ((self._size + rows) << self._LOAD_SHIFT) > (1 << self._bits):
      self._rebuild(
        max(self._bits, (((self._size + rows) << self._LOAD_SHIFT) - 1).bit_length()),
        *self._entries(),
      )
    mark = -1 - np.arange(rows, dtype=np.int64)
    # Cell contents each row would claim: its key words, then its mark.
    claims = np.empty((rows, self._cells.shape[1]), np.uint64)
    for j, word in enumerate(keys):
      claims[:, j] = word
    claims[:, -1] = mark.view(np.uint64)
    row_slot = np.empty(rows, dtype=np.int64)
    pending = np.arange(rows)
    slot = self._hash_slots(keys)
    limit = (1 << self._bits) + self._SPILL
    key0, code_col = self._key_col(0), self._code_col()
    while pending.size:
      if slot.max() >= limit:  # Spill full: grow, drop the provisional entries, start over.
        self._rebuild(self._bits + 1, *self._entries_below(self._size))
        return self._insert(keys)
      # Free slots get a whole claimed cell (rows claiming one slot: the last write wins it);
      # a row is resolved when its slot then holds its key (its own claim or another row's).
      free = np.flatnonzero(key0[slot] == 0)
      self._cells[slot[free]] = claims[pending[free]]
      resolved, _ = self._lookup(slot, keys, pending)
      done = np.flatnonzero(resolved)
      row_slot[pending[done]] = slot[done]
      rest = ~resolved
      pending, slot = pending[rest], slot[rest] + 1
    np.maximum.at(code_col, row_slot, mark)  # The mark of each new key's first row.
    first = mark == code_col[row_slot]
    new = int(np.count_nonzero(first))
    code_col[row_slot[first]] = np.arange(self._size, self._size + new)
    self._size += new
    return code_col[row_slot].astype(np.int32)

  def _entries_below(self, size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Entries with codes in [0, size): the table without provisional (negative) codes."""
    keys, codes = self._entries()
    keep = codes >= 0
    return [k[keep] for k in keys], codes[keep]

  def codes(self, ids: pa.Array) -> np.ndarray:
    """int32 codes of a string array of ids (non-null, non-empty), adding ids not seen before."""
    if len(ids) > self._SLICE_ROWS:  # Later slices then find what earlier ones added.
      return np.concatenate(
        [self.codes(ids.slice(lo, self._SLICE_ROWS)) for lo in range(0, len(ids), self._SLICE_ROWS)]
      )
    if not len(ids):
      return np.zeros(0, np.int32)
    keys = self._batch_keys(ids)
    codes = self._find(keys)
    missing = np.flatnonzero(codes < 0)
    # In slices, in row order (first appearance): a slice's probes stay short, and an id added by
    # an earlier slice just resolves to its slot.
    for lo in range(0, missing.shape[0], self._INSERT_ROWS):
      rows = missing[lo : lo + self._INSERT_ROWS]
      codes[rows] = self._insert([k[rows] for k in keys])
    return codes.astype(np.int32)

  # -- the dictionary ----------------------------------------------------------------------------

  def client_ids(self) -> pa.Array:
    """The distinct ids as a pyarrow string array, in code order."""
    count = self._size
    if not count:
      return pa.array([], pa.string())
    keys, codes = self._entries()
    by_code = np.empty((count, len(keys)), dtype="<u8")
    for j, k in enumerate(keys):
      by_code[codes, j] = k
    byte_words = by_code[:, 1:] if self._with_length else by_code
    mat = np.ascontiguousarray(byte_words).view(np.uint8).reshape(count, -1)
    if self._with_length:
      lengths = by_code[:, 0].astype(np.int64)
    else:
      lengths = np.count_nonzero(mat, axis=1)
    data = mat[np.arange(mat.shape[1]) < lengths[:, None]]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] < 2**31:
      return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)
      )
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))


# ---------------------------------------------------------------------------------------------------
# Writing.


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


# ---------------------------------------------------------------------------------------------------
# The durable, appendable log of a resumable training program.


def truncate_csv_by_round(path: str | os.PathLike[str], keep_below: int, key: str = ROUND) -> int:
  """Rewrites a CSV keeping the header and the rows whose `key` column is < `keep_below`.

  Rows are appended round by round, so the kept rows are a prefix; a torn last line (a crash in the
  middle of a write) or any row that does not parse ends the prefix. Written to a temporary file,
  fsynced and renamed over `path` (atomic). Returns the number of data rows kept. A missing file
  keeps nothing and is left missing.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return 0
  with open(path, "r", encoding="utf-8", newline="") as f:
    text = f.read()
  lines = text.split("\n")
  if not lines or not lines[0]:
    return 0
  header = next(csv.reader([lines[0]]))
  if key not in header:
    raise ParticipationLogError(f"{path}: no '{key}' column to resume from")
  col = header.index(key)
  kept = [lines[0]]
  complete = lines[1:-1] if not text.endswith("\n") else lines[1:]
  for line in complete:
    if not line:
      continue
    try:
      fields = next(csv.reader([line]))
      value = int(fields[col])
    except (StopIteration, IndexError, ValueError):
      break
    if len(fields) != len(header) or value >= keep_below:
      break
    kept.append(line)
  atomic_files.write_text(path, "\n".join(kept) + "\n", tag="truncate", newline="")
  return len(kept) - 1


def csv_rounds(path: str | os.PathLike[str], key: str = ROUND) -> int:
  """How many complete data rows a CSV written round by round holds (0 if it does not exist)."""
  path = pathlib.Path(path)
  if not path.exists():
    return 0
  with open(path, "r", encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f))
  return max(len(rows) - 1, 0)


class AppendableParticipationLog:
  """A CSV participation log a resumable program appends to, one durable round at a time.

  `write_round` appends the round's rows and fsyncs them before returning, so a crash never loses a
  round the program went on from; `open(path, resume_below=r)` first truncates the file to the
  rounds < r that the program's checkpoint covers (a round after it will be recomputed and
  written again, identically). Unlike `ParticipationLogWriter`, the file lives under its final
  name the whole time: it is a journal, not a write-once artifact.
  """

  def __init__(self, path: str | os.PathLike[str], *, resume_below: int = 0):
    self.path = pathlib.Path(path)
    if log_format(self.path).kind != "csv" or log_format(self.path).gzip:
      raise ParticipationLogError(f"{self.path}: an appendable log must be a plain .csv file")
    if self.path.exists():
      truncate_csv_by_round(self.path, resume_below)
    self._journal = atomic_files.Journal(self.path, f"{ROUND},{CLIENT_ID}\n", newline="")

  def write_round(self, round_index: int, client_ids: Sequence[Any]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for client in client_ids:
      client = str(client)
      if not client:
        raise ValueError("client ids must be non-empty")
      writer.writerow([int(round_index), client])
    self._journal.append(buf.getvalue())

  def close(self) -> None:
    self._journal.close()

  def __enter__(self) -> "AppendableParticipationLog":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
