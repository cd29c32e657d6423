"""What a run writes: metrics.csv's format, JSON files, output directories, progress for people.

One concept: the run's outputs, written so that a crash never leaves a half-written file under its
final name (`fedmf.atomic_files`).

* metrics.csv's columns and rows (written by `fedmf.program.metrics_csv.MetricsCsv`): one row per
  round; `accuracy`, `test_loss` and `epsilon` on evaluated rounds only; with adaptive clipping also
  `clip_norm` (ζ_t) and `unclipped_fraction` (the noisy fraction of clients within ζ_t that moved
  ζ), columns a fixed clip's file does not have.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Optional

from fedmf import jsonio

METRIC_COLUMNS = (
  "round",
  "loss",
  "round_seconds",
  "accuracy",
  "test_loss",
  "epsilon",
  "clients",
  "checked_in",
  "refused_checkins",
  "early_admitted",
  "clipped",
  "zeroed",
  "noise_stddev",
  "learning_rate",
)
# The columns adaptive clipping adds (after the others, so a fixed clip's metrics.csv is unchanged).
ADAPTIVE_COLUMNS = ("clip_norm", "unclipped_fraction")


def metric_columns(adaptive: bool) -> tuple[str, ...]:
  """metrics.csv's columns: `METRIC_COLUMNS`, and `ADAPTIVE_COLUMNS` with adaptive clipping."""
  return METRIC_COLUMNS + ADAPTIVE_COLUMNS if adaptive else METRIC_COLUMNS


# The one JSON writer (strict JSON: null, never NaN), kept where every layer can import it.
strict_json = jsonio.strict_json
json_text = jsonio.json_text
write_json = jsonio.write_json


def _cell(value) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    # 9 significant digits: a float32 metric (loss, accuracy) reads back exactly, so a run's
    # record (compare_mechanisms' results.json) holds what the run computed, and a replay of it
    # can be compared at float32 precision. (6 digits lost the last three.)
    return "inf" if math.isinf(value) else ("" if math.isnan(value) else f"{value:.9g}")
  return str(value)


def metrics_row(record: dict[str, Any], columns: tuple[str, ...] = METRIC_COLUMNS) -> str:
  buf = io.StringIO()
  csv.writer(buf, lineterminator="\n").writerow([_cell(record.get(k)) for k in columns])
  return buf.getvalue()


# Files that show a directory holds a run (--force needed to replace it).
RUN_MARKERS = ("summary.json", "participation.csv", "metrics.csv", "config.json", "audit.json")

# What a run directory holds besides its own files (a `fedmf train` ROOT, a rerun's report).
_RUN_ENTRIES = (
  "run.json",
  "plan.json",
  "strategy.json",
  "summary.json",
  "config.json",
  "metrics.csv",
  "participation.csv",
  "audit.json",
  "report.html",
  "report.md",
  "epsilon_curve.csv",
  "tensorboard",
  "release",
  "state",
  "journal.csv",
  "tuning.csv",  # fedmf public-features --tune
)


def check_output_dir(out: Path, force: bool, marker_files: tuple[str, ...]) -> None:
  """Refuses an output directory holding another run's files, unless `force`, and a directory
  holding files no run wrote (--force replaces the directory as a whole: they would be lost)."""
  from fedmf.errors import FedmfUserError  # pylint: disable=g-import-not-at-top

  out = Path(out)
  if out.exists() and not out.is_dir():
    raise FedmfUserError(f"output path exists and is not a directory: {out}")
  if not out.is_dir():
    return
  found = [name for name in marker_files + ("run.json",) if (out / name).exists()]
  if found and not force:
    raise FedmfUserError(
      f"{out} already holds a run ({found[0]}); choose another --out or pass --force to replace it"
    )
  foreign = sorted(
    entry.name
    for entry in out.iterdir()
    if not entry.name.startswith(".")
    and entry.name not in _RUN_ENTRIES
    and not (entry.is_file() and entry.suffix == ".png")
  )
  if foreign:
    shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
    raise FedmfUserError(
      f"{out} holds files that are not a fedmf run's ({shown}); a run replaces its --out "
      "directory as a whole: choose a new or empty directory"
    )


def plural(count: int, word: str) -> str:
  """'1 round', '2 rounds'."""
  return f"{count} {word}{'' if count == 1 else 's'}"


def optional_float(value: Optional[float]) -> Optional[float]:
  return None if value is None else float(value)
