"""metrics.csv's one writer, for `fedmf simulate` and `fedmf train` alike (its one reader is
`fedmf.program.run_dir.metrics_rows`).

One concept: a run's per-round metrics as CSV rows in `outputs.metric_columns` order, released by
the program logic keyed by the round (a `tff.program.ReleaseManager`). The rows are the same for
both commands; what differs is how the file survives a crash, chosen by the constructor:

* `MetricsCsv.fresh(out_dir, columns)` (simulate): rows go to a hidden partial file that `close()`
  renames into place and `abort()` removes (`atomic_files.PartialFile`, also removed on SIGTERM), so
  OUT never holds half a metrics.csv. Nothing resumes a simulation, so nothing is fsynced per row.
* `MetricsCsv.resumable(path, resume_below, columns)` (train): the file lives under its name and
  grows by appends fsynced before `release` returns (`atomic_files.Journal`). The program logic
  (`logic.run_rounds`) releases round r's metrics before the checkpoint that covers r, so after a
  kill -9 the file holds every round the checkpoint covers, and maybe a few more; on resume it is
  first cut to exactly the checkpoint's rounds (`truncate_csv_by_round`, as the participation log
  is) and, if an earlier version wrote it in another column order, rewritten in this one.

Why not TFF's `CSVFileReleaseManager`: it orders columns alphabetically (it flattens the value as a
sorted structure), rewrites the whole file whenever a round brings a new key (the first evaluated
round), and does not fsync.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Callable

import tensorflow_federated as tff

from fedmf import atomic_files
from fedmf.program import outputs
from fedmf.program import training_run

METRICS_FILE = "metrics.csv"


class MetricsCsv(tff.program.ReleaseManager):
  """metrics.csv as a release manager keyed by the round; build it with `fresh` or `resumable`."""

  def __init__(
    self,
    path: Path,
    columns: tuple[str, ...],
    append: Callable[[str], None],
    commit: Callable[[], None],
    abort: Callable[[], None],
  ):
    """Use `fresh` or `resumable`: `append` writes one line durably enough for the command,
    `commit` publishes the file (`close`), `abort` drops what a failed run wrote."""
    self.path = Path(path)
    self.columns = tuple(columns)
    self._append, self._commit, self._abort = append, commit, abort

  @classmethod
  def fresh(cls, out_dir: Path, columns: tuple[str, ...] = outputs.METRIC_COLUMNS) -> "MetricsCsv":
    """OUT_DIR/metrics.csv written whole or not at all (renamed into place by `close`)."""
    path = Path(out_dir) / METRICS_FILE
    partial = atomic_files.PartialFile(path, tag="partial", encoding="utf-8")
    partial.file.write(_header(columns))

    def append(line: str) -> None:
      partial.file.write(line)
      partial.file.flush()  # Whole lines in the partial file; it is renamed only when complete.

    return cls(path, columns, append, partial.commit, partial.abort)

  @classmethod
  def resumable(
    cls, path: Path, resume_below: int, columns: tuple[str, ...] = outputs.METRIC_COLUMNS
  ) -> "MetricsCsv":
    """`path` cut to rounds < `resume_below` (the checkpoint's), then grown by fsynced appends."""
    from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

    path = Path(path)
    if path.exists():
      participation_log.truncate_csv_by_round(path, resume_below)
      _reorder_columns(path, columns)
    journal = atomic_files.Journal(path, _header(columns), newline="")
    # A resumable file is never dropped: the rows on disk are the rounds the run released.
    return cls(path, columns, journal.append, journal.close, journal.close)

  async def release(self, value: dict[str, float], key: int) -> None:
    row = {k: int(v) if k in training_run.INT_METRICS else v for k, v in value.items()}
    self._append(outputs.metrics_row({"round": int(key), **row}, self.columns))

  def close(self) -> None:
    """Publishes the file (fresh: renamed into place; resumable: closed, already on disk)."""
    self._commit()

  def abort(self) -> None:
    """A failed run: a fresh file is removed, a resumable one kept for the resume."""
    self._abort()


def _header(columns: tuple[str, ...]) -> str:
  return ",".join(columns) + "\n"


def _reorder_columns(path: Path, columns: tuple[str, ...]) -> None:
  """Rewrites a CSV (atomically) with `columns` in this order, if its header is another order;
  columns it lacks are left empty."""
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.reader(f)
    header = next(reader, None)
    rows = [dict(zip(header, row)) for row in reader] if header else []
  if header is None or tuple(header) == columns:
    return
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(columns)
  for row in rows:
    writer.writerow(["" if row.get(k) in (None, "None") else row[k] for k in columns])
  atomic_files.write_text(path, buf.getvalue(), tag="reorder", newline="")
