"""A run directory read back: what `fedmf audit RUN_DIR` needs from a run's own files.

One concept: the privacy inputs of a finished (or stopped) run, from the files `fedmf simulate` and
`fedmf train` write into OUT (docs/simulation.md):

  plan.json       σ as accounted (noise_multiplier), δ, the declared schema, the cheap-simulation note
  strategy.json   the strategy the noise came from (`fedmf.mf.strategies.save_strategy`)
  run.json        the run id and the sha256 of every file (`fedmf.program.run_manifest`): a
                  directory mixing runs, or holding an unfinished one, is refused
  summary.json    rounds_completed; initial_test_accuracy (for the report's training plot)
  metrics.csv     the per-round metrics the report plots (`read_metrics`)
  config.json     the resolved config (rounds, delta), a fallback for plan.json's values
  participation.csv (or .csv.gz, .jsonl, .jsonl.gz, .parquet)   the participation log

Only JSON and paths: no TensorFlow, so `fedmf audit` stays light.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path
from typing import Any, Optional

from fedmf.errors import FedmfUserError

STRATEGY_FILE = "strategy.json"
PLAN_FILE = "plan.json"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"
LOG_NAMES = tuple(
  f"participation{suffix}" for suffix in (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".parquet")
)


class RunDirError(FedmfUserError):
  """A run directory whose files cannot give what was asked (one line naming the file)."""


@dataclasses.dataclass(frozen=True)
class RunInputs:
  """A run's privacy inputs; a value is None when the run's files do not say it.

  Attributes:
    directory: The run directory.
    log: Its participation log.
    strategy: Path of strategy.json, or None if the run did not save it.
    noise_multiplier: σ as accounted (plan.json; 0 = trained without DP).
    delta: δ (plan.json, else config.json).
    rounds: Rounds released: summary.json's rounds_completed, else the configured rounds.
    rounds_source: Which file and field gave `rounds`, in words.
    min_sep, max_participations: The declared schema over `rounds` (plan.json).
    planned_epsilon: The ε the run planned (plan.json), for comparison.
    notes: What a reader of the audit should know about the run (a cheap simulation, ...).
    sources: For each value, the file it came from (for messages).
    sampling: The cyclic Poisson sampling config.json declares (`participation.model:
      cyclic-poisson`), checked by the audit and credited if the log complies; else None.
    count_noise_multiplier: z_b of the run's adaptive clipping as accounted (plan.json's
      adaptive_clip.count_noise_multiplier); None for a fixed clip.
  """

  directory: Path
  log: Path
  strategy: Optional[Path]
  noise_multiplier: Optional[float]
  delta: Optional[float]
  rounds: Optional[int]
  rounds_source: str
  min_sep: Optional[int]
  max_participations: Optional[int]
  planned_epsilon: Optional[float]
  notes: tuple[str, ...]
  sources: dict[str, str]
  sampling: Optional[Any] = None
  count_noise_multiplier: Optional[float] = None


def is_run_dir(path: str | Path) -> bool:
  return Path(path).is_dir()


def _read_json(path: Path) -> Optional[dict[str, Any]]:
  if not path.is_file():
    return None
  try:
    obj = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
    reason = getattr(e, "msg", None) or getattr(e, "strerror", None) or type(e).__name__
    raise RunDirError(f"{path}: not a readable JSON file ({reason})") from None
  if not isinstance(obj, dict):
    raise RunDirError(f"{path}: expected a JSON object")
  return obj


def finite_number(value: Any) -> Optional[float]:
  """`value` as a finite float, or None: not a number, a bool, non-finite, or an integer beyond
  float64 (a JSON file may hold a 400-digit integer; `float()` of it raises OverflowError)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    return None
  try:
    number = float(value)
  except OverflowError:
    return None
  return number if math.isfinite(number) else None


def _number(obj: dict[str, Any], key: str, path: Path, *, integer: bool = False):
  value = obj.get(key)
  if value is None:
    return None
  number = finite_number(value)
  ok = number is not None and number >= 0
  if ok and integer:
    ok = number.is_integer() and number >= 1
  if not ok:
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
    raise RunDirError(f"{path}: field '{key}' must be a finite number >= 0, got {shown}")
  return int(value) if integer else number


def plan_notes(plan: dict[str, Any], sampling_audited: bool = False) -> tuple[str, ...]:
  """What an audit of the run must say about its plan (plan.json as a dict).

  `sampling_audited`: the audit checks the run's declared cyclic Poisson sampling and says itself
  whether it credits the amplification, so the plan's amplification needs no note here.
  """
  notes = []
  if isinstance(plan.get("cheap_simulation"), str) and plan.get("noise_multiplier"):
    training_sigma = finite_number(plan.get("training_noise_multiplier"))
    training_sigma = (
      f" (training noise multiplier {training_sigma:.4g})" if training_sigma is not None else ""
    )
    notes.append(
      "cheap simulation (BandMF App. I): " + plan["cheap_simulation"] + ". The noise actually "
      f"added in this simulation was smaller{training_sigma}, so the simulated run itself is not "
      "protected at this epsilon."
    )
  accounting = plan.get("accounting")
  if isinstance(accounting, str) and "amplif" in accounting.lower() and not sampling_audited:
    notes.append(
      f"the run planned its epsilon with privacy amplification ({accounting}); this audit "
      "credits no amplification: it accounts the log's realized participation as "
      "b-min-separation, so its epsilon differs from the planned one (usually it is larger)"
    )
  return tuple(notes)


def declared_sampling(
  config: dict[str, Any], summary: dict[str, Any], min_sep: Optional[int], path: Path
) -> Optional[Any]:
  """The cyclic Poisson sampling of config.json's `participation`, or None if it declares none.

  P: participation.partitions, else the declared min-sep (the run's groups); N: the population
  the run sampled (summary.json's num_clients, else config.json's); q: participation.
  sampling_probability, else P·clients_per_round/N (`fedmf.participation.CyclicPoisson`).
  """
  from fedmf.privacy.partition_audit import DeclaredSampling  # pylint: disable=g-import-not-at-top

  participation = config.get("participation")
  if not isinstance(participation, dict) or participation.get("model") not in (
    "cyclic-poisson",
    "cyclic_poisson",
  ):
    return None
  partitions = _number(participation, "partitions", path, integer=True)
  partitions = partitions or _number(participation, "min_sep", path, integer=True) or min_sep
  population = _number(summary, "num_clients", path, integer=True) or _number(
    config, "num_clients", path, integer=True
  )
  q = _number(participation, "sampling_probability", path)
  cohort = _number(config, "clients_per_round", path, integer=True)
  if q is None and None not in (partitions, population, cohort):
    q = partitions * cohort / population
  if None in (partitions, population, q):
    raise RunDirError(
      f"{path}: participation.model cyclic-poisson without its partitions, population "
      "(num_clients) or sampling probability: the audit cannot check the declared sampling"
    )
  return DeclaredSampling(partitions, population, q)


def read_run(path: str | Path) -> RunInputs:
  """The privacy inputs of run directory `path` (validated; one-line errors naming the file)."""
  from fedmf.mf.schema import ParticipationSchema  # pylint: disable=g-import-not-at-top

  from fedmf.program import run_manifest  # pylint: disable=g-import-not-at-top

  directory = Path(path)
  # Files of one finished run only (run.json): never one run's log with another run's sigma.
  legacy_note = run_manifest.check(directory)
  logs = [directory / name for name in LOG_NAMES if (directory / name).is_file()]
  if not logs:
    raise RunDirError(
      f"{directory} is a directory without a participation log ({', '.join(LOG_NAMES[:2])}, ...): "
      "give a run directory written by fedmf simulate or fedmf train, or a log file"
    )
  plan_path, summary_path, config_path = (
    directory / PLAN_FILE,
    directory / SUMMARY_FILE,
    directory / CONFIG_FILE,
  )
  plan = _read_json(plan_path) or {}
  summary = _read_json(summary_path) or {}
  config = _read_json(config_path) or {}
  sources: dict[str, str] = {}
  notes: list[str] = [legacy_note] if legacy_note else []

  sigma = _number(plan, "noise_multiplier", plan_path)
  if sigma is not None:
    sources["noise_multiplier"] = str(plan_path)
  delta = _number(plan, "delta", plan_path)
  if delta is not None:
    sources["delta"] = str(plan_path)
  elif _number(config, "delta", config_path) is not None:
    delta = _number(config, "delta", config_path)
    sources["delta"] = str(config_path)
  if delta is not None and not 0 < delta < 1:
    raise RunDirError(f"{sources['delta']}: field 'delta' must lie in (0, 1), got {delta!r}")

  rounds = _number(summary, "rounds_completed", summary_path, integer=True)
  rounds_source = f"rounds_completed in {summary_path}"
  if rounds is None:
    configured = _number(config, "rounds", config_path, integer=True)
    schema = plan.get("declared_schema")
    if configured is None and isinstance(schema, dict):
      configured = _number(schema, "n", plan_path, integer=True)
    rounds = configured
    rounds_source = f"the configured rounds in {config_path if config else plan_path}"
    if rounds is not None:
      notes.append(
        f"{summary_path.name} is missing (the run did not finish?): assuming all {rounds} "
        "configured rounds were released, which may over-count"
      )
  if rounds is not None:
    sources["rounds"] = rounds_source

  min_sep = max_participations = None
  schema = plan.get("declared_schema")
  if isinstance(schema, dict) and rounds is not None:
    try:
      declared = ParticipationSchema(
        _number(schema, "n", plan_path, integer=True) or rounds,
        _number(schema, "min_sep", plan_path, integer=True),
        _number(schema, "max_participations", plan_path, integer=True),
      ).with_rounds(rounds)
    except FedmfUserError as e:
      raise RunDirError(f"{plan_path}: declared_schema: {e}") from None
    # As the run's own audit (fedmf.program.logic.finish) declares it.
    min_sep, max_participations = declared.min_sep, declared.max_participations
    sources["min_sep"] = sources["max_participations"] = str(plan_path)

  strategy = directory / STRATEGY_FILE
  if strategy.is_file():
    sources["strategy"] = str(strategy)
  else:
    strategy = None

  planned = finite_number(plan.get("epsilon"))
  count_noise = None
  adaptive = plan.get("adaptive_clip")
  if adaptive is not None:
    if (
      not isinstance(adaptive, dict)
      or _number(adaptive, "count_noise_multiplier", plan_path) is None
    ):
      raise RunDirError(
        f"{plan_path}: field 'adaptive_clip' must hold the run's count_noise_multiplier, got "
        f"{str(adaptive)[:60]!r}"
      )
    count_noise = _number(adaptive, "count_noise_multiplier", plan_path)
    sources["count_noise_multiplier"] = str(plan_path)
  sampling = declared_sampling(config, summary, min_sep, config_path)
  notes.extend(plan_notes(plan, sampling_audited=sampling is not None))
  return RunInputs(
    directory=directory,
    log=logs[0],
    strategy=strategy,
    noise_multiplier=sigma,
    delta=delta,
    rounds=rounds,
    rounds_source=rounds_source,
    min_sep=min_sep,
    max_participations=max_participations,
    planned_epsilon=planned,
    notes=tuple(notes),
    sources=sources,
    sampling=sampling,
    count_noise_multiplier=count_noise,
  )


METRICS_FILE = "metrics.csv"


def metrics_rows(directory: str | Path) -> Optional[list[dict[str, str]]]:
  """THE reader of a run's metrics.csv (its one writer: `fedmf.program.metrics_csv.MetricsCsv`, for
  `fedmf simulate` and `fedmf train`): its rows as {column: text}, or None when it is absent,
  unreadable or has no `round` column."""
  import csv  # pylint: disable=g-import-not-at-top

  path = Path(directory) / METRICS_FILE
  if not path.is_file():
    return None
  try:
    with open(path, newline="", encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
  except (OSError, UnicodeDecodeError, csv.Error):
    return None
  if rows and "round" not in rows[0]:
    return None
  return rows


def read_metrics(
  directory: str | Path,
  initial_accuracy: Optional[float] = None,
  final_accuracy: Optional[tuple[int, float]] = None,
):
  """A run directory's metrics.csv as a `fedmf.privacy.report_model.RunMetrics` for its report, or
  None when absent or unreadable (the report goes on without the training plots).

  The accuracy before training is `initial_accuracy` when given, else summary.json's
  initial_test_accuracy (None if absent); `final_accuracy` (rounds completed, accuracy) is the
  final model's when it was evaluated after the last evaluation round, else summary.json's
  final_test_accuracy is used when its round has no accuracy in metrics.csv.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedmf.privacy.report_model import RunMetrics  # pylint: disable=g-import-not-at-top

  rows = metrics_rows(directory)
  if not rows:
    return None

  def number(text: Optional[str]) -> float:
    """A cell as a float; NaN (a gap in the plot) when empty, not a number or not finite (a
    diverged round's loss may be inf: matplotlib cannot place it)."""
    try:
      value = float(text) if text not in (None, "") else math.nan
    except ValueError:
      return math.nan
    return value if math.isfinite(value) else math.nan

  names = [k for k in rows[0] if k is not None]
  summary = {}
  if initial_accuracy is None or final_accuracy is None:
    try:
      summary = json.loads((Path(directory) / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
      pass
    summary = summary if isinstance(summary, dict) else {}

  finite = finite_number
  if initial_accuracy is None:
    initial_accuracy = finite(summary.get("initial_test_accuracy"))
  else:
    initial_accuracy = float(initial_accuracy)
  columns = {k: np.array([number(r.get(k)) for r in rows]) for k in names}
  rounds = columns["round"]
  bad = np.flatnonzero(~(np.isfinite(rounds) & (rounds >= 0) & (rounds == np.floor(rounds))))
  if bad.size:  # A row without its round has no place on the plots' x axis.
    shown = str(rows[bad[0]].get("round"))
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise RunDirError(
      f"{Path(directory) / METRICS_FILE}: row {bad[0] + 2}: 'round' must be a whole number >= 0, "
      f"got {shown!r}"
    )
  if final_accuracy is None and finite(summary.get("final_test_accuracy")) is not None:
    done = summary.get("rounds_completed")
    if isinstance(done, int) and done > 0:
      final_accuracy = (done, finite(summary["final_test_accuracy"]))
  if final_accuracy is not None and "accuracy" in columns:
    last = np.flatnonzero(columns["round"] == final_accuracy[0] - 1)
    if last.size and np.isfinite(columns["accuracy"][last[0]]):
      final_accuracy = None  # The last round was an evaluation round: metrics.csv has it.
  return RunMetrics(columns, initial_accuracy, final_accuracy)
