"""Reading a participation log: validated pyarrow batches, streamed, never one Python object a row.

Reading streams (CSV, Parquet) or is columnar (JSONL) with pyarrow, so a 10-million-row log never
becomes 10 million Python objects. Each batch is checked (columns, integer rounds in range, non-empty
ids) and errors name the file and the row; a torn or cut last line is reported through ``LogTail``.
Layer 2: numpy + pyarrow, no TensorFlow.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import zlib
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedmf.mf import resources
from fedmf.privacy.log_format import (
  CLIENT_ID,
  MAX_ROUND_VALUE,
  REQUIRED_COLUMNS,
  ROUND,
  LogFormat,
  ParticipationLogError,
  log_format,
)

_CSV_BLOCK_SIZE = 1 << 22  # 4 MiB per streamed CSV block (~300k rows of a typical log).
_JSONL_CHUNK_ROWS = 100_000


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
  """The read's progress (`fedmf.progress`: a bar on a terminal, lines with an ETA every 30 s
  otherwise, so only a large log shows any): bytes of the file read for CSV (compressed bytes for
  .csv.gz), rows for Parquet/JSONL."""

  def __init__(self, path: str, enabled: bool, fmt: LogFormat):
    self.bar = None
    self.by_bytes = fmt.kind == "csv"
    if not enabled:
      return
    from fedmf import progress  # pylint: disable=g-import-not-at-top

    label = f"reading {os.path.basename(path)}"
    if self.by_bytes:
      total = os.path.getsize(path)
    else:
      total = None
      if fmt.kind == "parquet":
        import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

        try:
          total = pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowInvalid, OSError):
          pass
    self.bar = progress.Progress(
      total, unit="row", label=label, every=None, byte_sizes=self.by_bytes
    )

  def position(self, position: int) -> None:
    """CSV: the file has been read up to ``position`` bytes."""
    if self.bar is not None and self.by_bytes:
      self.bar.update(min(position, self.bar.total))

  def rows(self, rows: int) -> None:
    if self.bar is not None and not self.by_bytes:
      self.bar.update(self.bar.done + rows)

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
      if "straddl" in str(e):  # Arrow's "straddling object straddles two block boundaries".
        raise _long_line_error(path, fmt) from None
      raise _arrow_error(path, e) from None
    except (pa.ArrowIOError, OSError, EOFError) as e:
      raise _arrow_error(path, e) from None
    finally:
      if raw is not None:
        raw.close()


def _long_line_error(path: str, fmt: LogFormat) -> ParticipationLogError:
  """The one-line error for a CSV line longer than a read block (pyarrow says only "straddling
  object straddles two block boundaries"): which row, how long, and what a row should be."""
  found = _first_long_line(path, fmt, _CSV_BLOCK_SIZE)
  limit = f"{_CSV_BLOCK_SIZE >> 20} MiB"
  if found is None:  # (not expected: the reader saw one)
    return ParticipationLogError(f"{path}: a line is longer than {limit}: not a participation log?")
  line, length = found
  where = "the header line" if line == 1 else f"row {line - 1} (line {line})"
  return ParticipationLogError(
    f"{path}: {where} is {length / 2**20:.1f} MiB long, beyond the {limit} a row may have (a "
    "round and a client id): is this a participation log?"
  )


def _first_long_line(path: str, fmt: LogFormat, limit: int) -> Optional[tuple[int, int]]:
  """(1-based line number, length in bytes) of the first line longer than `limit`, or None; one
  streamed pass, 1 MiB at a time."""
  opener = gzip.open if fmt.gzip else open
  number, length = 1, 0
  with opener(path, "rb") as f:
    while True:
      chunk = f.read(1 << 20)
      if not chunk:
        return (number, length) if length > limit else None
      start = 0
      while True:
        end = chunk.find(b"\n", start)
        if end < 0:
          length += len(chunk) - start
          break
        length += end - start
        if length > limit:
          return number, length
        number, length, start = number + 1, 0, end + 1


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
    progress: Show progress on stderr (`fedmf.progress`: a bar on a terminal, else a line with
      the ETA every 30 s of reading).
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
      resources.check_time()  # --max-seconds: a huge log is stopped between batches.
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
