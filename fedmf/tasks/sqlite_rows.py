"""Which rows of a StackOverflow sqlite file hold which client, for a file without an index.

One concept: TFF's own `save_to_sql_client_data` writes the `examples` table with no index on
`client_id`, so every per-client query would scan the whole file. fedmf never modifies the user's
file (it may be read-only or shared): one sequential scan (in rowid order, no sort) records, per
(split, client), the runs of consecutive rows it holds, and the result is cached as a small sqlite
file keyed by the data file's path, size and modification time:

  $FEDMF_CACHE_DIR/stackoverflow-rows/KEY.sqlite   (else ~/.cache/fedmf/stackoverflow-rows/)

A client's rows are then read by rowid ranges (the table's own B-tree), in the same order as an
indexed `WHERE client_id = ?` query returns them (rowid order). The cost of the first open is in
docs/simulation.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Optional

from fedmf import atomic_files

# Rows between two progress updates of the scan.
_PROGRESS_EVERY = 200_000


def cache_root() -> Path:
  """$FEDMF_CACHE_DIR, else $XDG_CACHE_HOME/fedmf, else ~/.cache/fedmf (as the strategy cache)."""
  base = os.environ.get("FEDMF_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fedmf"
  )
  return Path(base) / "stackoverflow-rows"


def cache_path(path: str) -> Path:
  """The cache file of data file `path`: a new one whenever the file changes (size, mtime)."""
  st = os.stat(path)
  key = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
  return cache_root() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.sqlite"


class ClientRows:
  """(split, client_id) → runs of rowids [first, last] holding that client's examples."""

  def __init__(self, runs: dict[tuple[str, str], list[tuple[int, int]]]):
    self._runs = runs

  def runs(self, split: str, client_id: str) -> list[tuple[int, int]]:
    return self._runs.get((split, client_id), [])

  def __len__(self) -> int:
    return len(self._runs)


def scan(path: str, *, progress: bool = True, stream=None) -> ClientRows:
  """One sequential read of `examples` (rowid order) into client row runs."""
  stream = stream or sys.stderr
  runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
  with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
    (total,) = con.execute("SELECT max(rowid) FROM examples").fetchone()
    bar = None
    if progress and stream.isatty():
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top

      bar = tqdm(total=total or 0, unit="row", desc="indexing clients", file=stream)
    elif progress:
      print(
        f"indexing the clients of {path} (no index on client_id): one scan of {total or 0:,} "
        f"rows, cached in {cache_root()}",
        file=stream,
        flush=True,
      )
    key, first, last, seen = None, None, None, 0
    for rowid, split, client in con.execute(
      "SELECT rowid, split_name, client_id FROM examples ORDER BY rowid"
    ):
      if (split, client) != key:
        if key is not None:
          runs.setdefault(key, []).append((first, last))
        key, first = (split, client), rowid
      last = rowid
      seen += 1
      if bar is not None and seen % _PROGRESS_EVERY == 0:
        bar.update(_PROGRESS_EVERY)
    if key is not None:
      runs.setdefault(key, []).append((first, last))
    if bar is not None:
      bar.update(seen % _PROGRESS_EVERY)
      bar.close()
  return ClientRows(runs)


def _save(rows: ClientRows, out: Path) -> None:
  out.parent.mkdir(parents=True, exist_ok=True)
  with atomic_files.partial_path(out) as tmp:
    with contextlib.closing(sqlite3.connect(tmp)) as con:
      con.execute("CREATE TABLE runs (split TEXT, client_id TEXT, first INTEGER, last INTEGER)")
      con.executemany(
        "INSERT INTO runs VALUES (?, ?, ?, ?)",
        ((s, c, a, b) for (s, c), rs in rows._runs.items() for a, b in rs),  # pylint: disable=protected-access
      )
      con.commit()


def _load(path: Path) -> ClientRows:
  runs: dict[tuple[str, str], list[tuple[int, int]]] = {}
  with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
    for split, client, first, last in con.execute("SELECT * FROM runs ORDER BY rowid"):
      runs.setdefault((split, client), []).append((first, last))
  return ClientRows(runs)


def client_rows(path: str, *, progress: bool = True) -> ClientRows:
  """The cached client rows of `path`, built by one scan on first use (a read-only cache
  directory only means the scan is not kept)."""
  cached: Optional[Path] = cache_path(path)
  if cached.is_file():
    try:
      return _load(cached)
    except sqlite3.Error:
      pass  # A broken cache file is rebuilt.
  start = time.perf_counter()
  rows = scan(path, progress=progress)
  try:
    _save(rows, cached)
  except (OSError, sqlite3.Error) as e:
    print(f"could not cache the client index in {cached.parent}: {e}", file=sys.stderr)
  if progress and not sys.stderr.isatty():
    print(f"indexed {len(rows):,} clients in {time.perf_counter() - start:.1f} s", file=sys.stderr)
  return rows


def fetch(con: sqlite3.Connection, rows: ClientRows, split: str, client_id: str) -> list[bytes]:
  """The client's serialized examples, in rowid order (an indexed query's order)."""
  out: list[bytes] = []
  for first, last in rows.runs(split, client_id):
    out.extend(
      blob
      for (blob,) in con.execute(
        "SELECT serialized_example_proto FROM examples WHERE rowid BETWEEN ? AND ? "
        "AND client_id = ? AND split_name = ? ORDER BY rowid",
        (first, last, client_id, split),
      )
    )
  return out
