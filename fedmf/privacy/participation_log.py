"""The participation log: THE reader and writer of who joined which round (format: docs/participation-log.md).

One row per (round, client_id) participation. ``round`` is a 0-based integer (the round whose noisy
aggregate included the client's update), ``client_id`` a string (the unit of privacy, a device).
Extra columns (a timestamp, a cohort id, ...) are preserved but not required.

Formats, chosen by extension: ``.csv`` (with header), ``.jsonl`` (JSON Lines), either optionally
``.gz``; and ``.parquet``. Reading streams (CSV, Parquet) or is columnar (JSONL) with pyarrow, so a
10-million-row log never becomes 10 million Python objects.

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
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fedmf.errors import FedmfUserError

ROUND = "round"
CLIENT_ID = "client_id"
REQUIRED_COLUMNS = (ROUND, CLIENT_ID)
SUFFIXES = (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".parquet")

_CSV_BLOCK_SIZE = 1 << 24  # 16 MiB per streamed CSV block.
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
  for suffix, fmt in ((".csv.gz", LogFormat("csv", True)), (".jsonl.gz", LogFormat("jsonl", True)),
                      (".csv", LogFormat("csv", False)), (".jsonl", LogFormat("jsonl", False)),
                      (".parquet", LogFormat("parquet", False))):
    if name.endswith(suffix):
      return fmt
  raise ParticipationLogError(
      f"{path}: unknown participation log extension (expected one of {', '.join(SUFFIXES)})")


# ---------------------------------------------------------------------------------------------------
# Reading.


def _open_text(path: str, fmt: LogFormat):
  return gzip.open(path, "rt", encoding="utf-8", newline="") if fmt.gzip else open(
      path, "r", encoding="utf-8", newline="")


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
          f"{path}: missing column '{col}' (columns: {', '.join(map(str, names)) or 'none'})")


def _validate_batch(path: str, batch: pa.RecordBatch | pa.Table, first_row: int) -> pa.Table:
  """Validates and normalizes ``round`` to int64 and ``client_id`` to string. Rows are 1-based."""
  table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
  rounds = table.column(ROUND)
  rtype = rounds.type
  if pa.types.is_null(rtype) and len(rounds):
    raise ParticipationLogError(f"{path}: row {first_row}: missing round")
  if rounds.null_count:
    i = int(np.flatnonzero(rounds.is_null().to_numpy(zero_copy_only=False))[0])
    raise ParticipationLogError(f"{path}: row {first_row + i}: missing round")
  if pa.types.is_floating(rtype):
    r = rounds.to_numpy().astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
      bad = ~np.isfinite(r) | (r != np.floor(r))
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      kind = "non-finite" if not np.isfinite(r[i]) else "non-integer"
      raise ParticipationLogError(f"{path}: row {first_row + i}: {kind} round {float(r[i])!r}")
    r_int = r.astype(np.int64)
  elif pa.types.is_integer(rtype) or pa.types.is_null(rtype):
    r_int = rounds.to_numpy().astype(np.int64, copy=False) if len(rounds) else np.zeros(0, np.int64)
  else:
    raise ParticipationLogError(f"{path}: column 'round' must hold integers, found {rtype}")
  neg = r_int < 0
  if neg.any():
    i = int(np.flatnonzero(neg)[0])
    raise ParticipationLogError(f"{path}: row {first_row + i}: negative round {int(r_int[i])}")
  ids = table.column(CLIENT_ID)
  if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)):
    if pa.types.is_floating(ids.type):
      raise ParticipationLogError(f"{path}: column 'client_id' must hold strings or integers")
    try:
      ids = pc.cast(ids, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
      raise ParticipationLogError(
          f"{path}: column 'client_id' must hold strings, found {ids.type}") from None
  if ids.null_count or (len(ids) and pc.min(pc.binary_length(ids)).as_py() == 0):
    empty = pc.or_kleene(ids.is_null(), pc.equal(pc.binary_length(ids), 0))
    i = int(np.flatnonzero(empty.to_numpy(zero_copy_only=False) if isinstance(empty, pa.Array)
                           else pa.concat_arrays(empty.chunks).to_numpy(
                               zero_copy_only=False))[0])
    raise ParticipationLogError(f"{path}: row {first_row + i}: missing client_id")
  table = table.set_column(table.schema.get_field_index(ROUND), ROUND, pa.array(r_int, pa.int64()))
  table = table.set_column(table.schema.get_field_index(CLIENT_ID), CLIENT_ID, ids)
  return table


def _arrow_error(path: str, e: Exception) -> ParticipationLogError:
  msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return ParticipationLogError(f"{path}: {msg}")


def _progress(path: str, enabled: bool):
  if not enabled:
    return None
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(total=None, unit=" rows", unit_scale=True, desc=f"reading {os.path.basename(path)}",
              file=sys.stderr, leave=False)


def _iter_csv(path: str, fmt: LogFormat, columns: Sequence[str] | None) -> Iterator[Any]:
  import pyarrow.csv as pacsv  # pylint: disable=g-import-not-at-top
  header = _csv_header(path, fmt)
  _missing(path, header)
  include = list(columns) if columns is not None else header
  for col in include:
    if col not in header:
      raise ParticipationLogError(f"{path}: missing column '{col}'")
  # Rounds are read as int64 first (twice as fast to parse as float64); if a value does not parse
  # as an integer ("3.0", "1.5", "nan", ...), the file is re-read with float64 rounds from the first
  # row not yet yielded, so that _validate_batch accepts integral floats and names the bad row.
  emitted = 0
  for round_type in (pa.int64(), pa.float64()):
    convert = pacsv.ConvertOptions(
        column_types={ROUND: round_type, CLIENT_ID: pa.string()}, include_columns=include,
        null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False)
    skip = emitted
    try:
      stream = pa.input_stream(path, compression="gzip" if fmt.gzip else None)
      reader = pacsv.open_csv(stream, read_options=pacsv.ReadOptions(block_size=_CSV_BLOCK_SIZE),
                              convert_options=convert)
      while True:
        try:
          batch = reader.read_next_batch()
        except StopIteration:
          return
        if skip:
          if batch.num_rows <= skip:
            skip -= batch.num_rows
            continue
          batch = batch.slice(skip)
          skip = 0
        emitted += batch.num_rows
        yield batch
    except pa.ArrowInvalid as e:
      if pa.types.is_integer(round_type) and "conversion error to int64" in str(e):
        continue
      raise _arrow_error(path, e) from None
    except (pa.ArrowIOError, OSError, EOFError) as e:
      raise _arrow_error(path, e) from None


def _iter_jsonl(path: str, fmt: LogFormat, columns: Sequence[str] | None) -> Iterator[Any]:
  import pyarrow.json as pajson  # pylint: disable=g-import-not-at-top
  try:
    stream = pa.input_stream(path, compression="gzip" if fmt.gzip else None)
    table = pajson.read_json(stream)
    if table.num_columns == 0 and table.num_rows == 0:
      raise ParticipationLogError(f"{path}: empty log")
    _missing(path, table.column_names)
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
      if CLIENT_ID in obj and obj[CLIENT_ID] is not None and not isinstance(obj[CLIENT_ID], str):
        obj[CLIENT_ID] = str(obj[CLIENT_ID])
      if ROUND in obj and isinstance(obj[ROUND], (int, float)) and not isinstance(obj[ROUND], bool):
        obj[ROUND] = float(obj[ROUND])
      elif ROUND in obj and obj[ROUND] is not None:
        raise ParticipationLogError(f"{path}: line {lineno}: round must be an integer, "
                                    f"got {obj[ROUND]!r}")
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


def iter_log_batches(path: str | os.PathLike[str], columns: Sequence[str] | None = None,
                     progress: bool = False) -> Iterator[pa.Table]:
  """Streams a participation log as validated tables (round: int64, client_id: string).

  Args:
    path: A ``.csv``, ``.csv.gz``, ``.jsonl``, ``.jsonl.gz`` or ``.parquet`` file.
    columns: Columns to read (must include 'round' and 'client_id'); None reads all, extras kept.
    progress: Show a tqdm row counter on stderr.

  Raises:
    ParticipationLogError: missing file, empty log, missing column, bad round or client_id.
  """
  path = os.fspath(path)
  fmt = log_format(path)
  _check_exists(path)
  if columns is not None:
    columns = list(dict.fromkeys(list(REQUIRED_COLUMNS) + list(columns)))
  if fmt.kind == "csv":
    batches = _iter_csv(path, fmt, columns)
  elif fmt.kind == "jsonl":
    batches = _iter_jsonl(path, fmt, columns)
  else:
    batches = _iter_parquet(path, columns)
  bar = _progress(path, progress)
  row = 1
  total = 0
  try:
    for batch in batches:
      if batch.num_rows == 0:
        continue
      table = _validate_batch(path, batch, row)
      row += table.num_rows
      total += table.num_rows
      if bar is not None:
        bar.update(table.num_rows)
      yield table
  finally:
    if bar is not None:
      bar.close()
  if total == 0:
    raise ParticipationLogError(f"{path}: empty log (no participation rows)")


def read_participation_log(path: str | os.PathLike[str], columns: Sequence[str] | None = None,
                           progress: bool = False) -> pa.Table:
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

  @property
  def rows(self) -> int:
    return int(self.rounds.shape[0])


def read_participation_arrays(path: str | os.PathLike[str],
                              progress: bool = False) -> ParticipationArrays:
  """Reads only (round, client_id) into numpy rounds + dictionary codes (≈ 8 bytes/row + the ids).

  ``codes`` number the clients in order of first appearance in the log and ``client_ids`` lists them
  in that order (as ``pyarrow.compute.dictionary_encode`` would). Fast path: when the ids are short
  enough to be packed losslessly into an int64 (``_IdPacker``), the int64 keys are hashed instead of
  the strings (≈ 5× faster); otherwise the strings are dictionary-encoded. Same result either way.
  """
  round_chunks: list[np.ndarray] = []
  id_chunks: list[pa.Array] = []
  packer = _IdPacker()
  for table in iter_log_batches(path, columns=REQUIRED_COLUMNS, progress=progress):
    round_chunks.append(table.column(ROUND).to_numpy())
    for chunk in table.column(CLIENT_ID).chunks:
      packer.observe(chunk)
      id_chunks.append(chunk)
  rounds = np.concatenate(round_chunks)
  del round_chunks
  if packer.fits():
    # Pack chunk by chunk, freeing the strings as we go, then hash int64 keys.
    key_chunks = []
    while id_chunks:
      key_chunks.append(pa.array(packer.pack(id_chunks.pop(0)), pa.int64()))
    encoded = pc.dictionary_encode(pa.chunked_array(key_chunks, type=pa.int64()))
    del key_chunks
    codes = np.concatenate([c.indices.to_numpy() for c in encoded.chunks])
    dictionary = packer.unpack(encoded.chunks[0].dictionary.to_numpy())
    return ParticipationArrays(rounds=rounds, codes=codes, client_ids=dictionary)
  encoded = pc.dictionary_encode(pa.chunked_array(id_chunks, type=pa.string()))
  del id_chunks
  codes = np.concatenate([c.indices.to_numpy() for c in encoded.chunks])
  dictionary = encoded.chunks[0].dictionary if encoded.num_chunks else pa.array([], pa.string())
  return ParticipationArrays(rounds=rounds, codes=codes, client_ids=dictionary)


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [len+1], data uint8) of a string/large_string array, as zero-copy numpy views."""
  off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
  bufs = arr.buffers()
  offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset:arr.offset + len(arr) + 1]
  data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
  return offsets, data


class _IdPacker:
  """Packs short client ids losslessly into 64-bit keys, vectorized (no Python objects per row).

  Two encodings, chosen once all ids have been observed (``fits``):
  - ``raw``: ASCII ids of at most 8 bytes, right-padded with a byte that occurs in no id, are read
    as one little-endian 64-bit word each (injective since the pad byte only fills the end);
  - ``compact``: an id of bytes s_0..s_{L-1} becomes sum_j sym(s_j) · base^(Lmax-1-j), where sym maps
    the bytes occurring in the log to 1..A (in byte order) and the positions past the end of shorter
    ids are 0 (base = A + 1). Injective (0 only pads the end); requires base^Lmax < 2^63: e.g.
    decimal ids up to 18 characters, hex ids up to 15, alphanumeric ids up to 10.
  ``unpack`` inverts either encoding. Longer ids are not packed (the caller hashes the strings).
  """

  def __init__(self):
    self.present = np.zeros(256, dtype=bool)
    self.max_len = 0

  def observe(self, arr: pa.Array) -> None:
    if not len(arr):
      return
    offsets, data = _string_buffers(arr)
    self.max_len = max(self.max_len, int(np.diff(offsets).max()))
    if self.fits():  # Only worth scanning the bytes while packing is still possible.
      used = pc.unique(pa.array(data[int(offsets[0]):int(offsets[-1])])).to_numpy()
      self.present[used] = True

  @property
  def base(self) -> int:
    return int(self.present.sum()) + 1

  @property
  def pad(self) -> Optional[int]:
    """An ASCII byte (1..127) occurring in no id, when all ids are ASCII; else None."""
    if self.present[128:].any():
      return None
    free = np.flatnonzero(~self.present[1:128])
    return int(free[-1]) + 1 if free.size else None

  @property
  def raw(self) -> bool:
    return 0 < self.max_len <= 8 and self.pad is not None

  def fits(self) -> bool:
    return self.max_len > 0 and (self.raw or self.base ** self.max_len < 2**63)

  def _lut(self, dtype=np.int64) -> np.ndarray:
    lut = np.zeros(256, dtype=dtype)
    lut[self.present] = np.arange(1, self.base, dtype=dtype)
    return lut

  def _padded(self, arr: pa.Array, width: int) -> Optional[np.ndarray]:
    """[rows, width] uint8 matrix of the ids right-padded with ``pad`` (ASCII only), or None."""
    pad = self.pad
    if pad is None:
      return None
    padded = pc.ascii_rpad(arr, width=width, padding=chr(pad))
    offsets, data = _string_buffers(padded)
    n = len(padded)
    if int(offsets[-1]) - int(offsets[0]) != n * width:  # Not fixed-width: let the caller gather.
      return None
    return data[int(offsets[0]):int(offsets[-1])].reshape(n, width)

  def pack(self, arr: pa.Array) -> np.ndarray:
    if self.raw:
      mat = self._padded(arr, 8)
      if mat is not None:
        return np.ascontiguousarray(mat).view("<u8").reshape(-1).view(np.int64)
      raise AssertionError("raw id packing needs fixed-width padded ids")  # Unreachable for ASCII.
    base = self.base
    key = np.zeros(len(arr), dtype=np.int64)
    mat = self._padded(arr, self.max_len)
    if mat is not None:  # Pad byte maps to symbol 0.
      syms = np.take(self._lut(np.uint8), mat)
      for j in range(self.max_len):
        key *= base
        key += syms[:, j]
      return key
    offsets, data = _string_buffers(arr)
    lut = self._lut()
    starts = offsets[:-1].astype(np.int64)
    lengths = np.diff(offsets).astype(np.int64)
    last = max(int(offsets[-1]) - 1, 0)
    sym = np.empty(len(arr), dtype=np.int64)
    for j in range(self.max_len):
      pos = np.minimum(starts + j, last)
      np.take(lut, data[pos], out=sym)
      sym[lengths <= j] = 0
      key *= base
      key += sym
    return key

  def unpack(self, keys: np.ndarray) -> pa.Array:
    """The string ids of packed keys (same order)."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    u = keys.shape[0]
    if self.raw:
      mat = keys.view(np.uint8).reshape(u, 8)
      mask = mat != self.pad
      data = mat[mask]
    else:
      keys = keys.copy()
      base = self.base
      inv = np.flatnonzero(self.present).astype(np.uint8)  # symbol s (1-based) -> byte inv[s-1]
      syms = np.empty((u, self.max_len), dtype=np.int64)
      for j in range(self.max_len - 1, -1, -1):
        syms[:, j] = keys % base
        keys //= base
      mask = syms > 0
      data = inv[syms[mask] - 1]
    offsets = np.zeros(u + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1), out=offsets[1:])
    if offsets[-1] < 2**31:
      return pa.StringArray.from_buffers(u, pa.py_buffer(offsets.astype(np.int32)),
                                         pa.py_buffer(data))
    return pa.LargeStringArray.from_buffers(u, pa.py_buffer(offsets), pa.py_buffer(data))


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
  ``with`` block by an exception aborts: the temporary file is removed unless ``keep_partial``.
  """

  def __init__(self, path: str | os.PathLike[str], *, keep_partial: bool = False):
    self.path = pathlib.Path(path)
    self._fmt = log_format(self.path)
    if not self.path.parent.exists():
      raise ParticipationLogError(f"{self.path.parent}: no such directory")
    self.partial_path = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")
    self._keep_partial = keep_partial
    self._raw = open(self.partial_path, "wb")
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

  def write_round(self, round_index: int, client_ids: Sequence[Any] | np.ndarray,
                  **extra: Any) -> None:
    """Appends the participants of one round; each extra column is a scalar or a per-client list."""
    m = len(client_ids)
    cols = {k: (v if isinstance(v, (list, tuple, np.ndarray, pa.Array)) else [v] * m)
            for k, v in extra.items()}
    self.write_rows(np.full(m, round_index, dtype=np.int64), client_ids, **cols)

  def write_rows(self, rounds: Sequence[int] | np.ndarray, client_ids: Sequence[Any] | np.ndarray,
                 **extra: Sequence[Any] | np.ndarray) -> None:
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
    ids = pa.array([str(c) for c in client_ids], pa.string()) if not isinstance(
        client_ids, pa.Array) else pc.cast(client_ids, pa.string())
    if len(ids) != len(r):
      raise ValueError("rounds and client_ids differ in length")
    if len(ids) and pc.any(pc.equal(pc.utf8_length(ids), 0)).as_py():
      raise ValueError("client ids must be non-empty")
    arrays = {ROUND: pa.array(r, pa.int64()), CLIENT_ID: ids}
    for k, v in extra.items():
      if k in REQUIRED_COLUMNS:
        raise ValueError(f"extra column {k!r} clashes with a required column")
      arrays[k] = v if isinstance(v, pa.Array) else pa.array(list(v) if not isinstance(
          v, np.ndarray) else v)
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
      self._writer = pacsv.CSVWriter(self._sink, self._schema,
                                     write_options=pacsv.WriteOptions(quoting_style="needed"))
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
    self._raw.flush()
    os.fsync(self._raw.fileno())
    self._raw.close()
    os.replace(self.partial_path, self.path)
    try:  # Make the rename durable.
      dir_fd = os.open(self.path.parent, os.O_RDONLY)
      try:
        os.fsync(dir_fd)
      finally:
        os.close(dir_fd)
    except OSError:
      pass
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
      self._raw.close()
    except Exception:  # pylint: disable=broad-except
      pass
    if not self._keep_partial and self.partial_path.exists():
      self.partial_path.unlink()


def write_participation_log(path: str | os.PathLike[str], rounds: Sequence[int] | np.ndarray,
                            client_ids: Sequence[Any] | np.ndarray,
                            extra: Mapping[str, Sequence[Any]] | None = None) -> pathlib.Path:
  """Writes a whole log at once (atomically)."""
  with ParticipationLogWriter(path) as w:
    w.write_rows(rounds, client_ids, **(extra or {}))
  return pathlib.Path(path)

