"""The durable, appendable participation log of a resumable training program.

``AppendableParticipationLog`` appends a round's rows and fsyncs them (`fedmf.atomic_files.Journal`);
on resume the CSV is first truncated to the rounds its checkpoint covers (``truncate_csv_by_round``,
an atomic rewrite).
"""

from __future__ import annotations

import csv
import io
import os
import pathlib
from typing import Any, Sequence

from fedmf import atomic_files
from fedmf.privacy.log_format import CLIENT_ID, ROUND, ParticipationLogError, log_format


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
