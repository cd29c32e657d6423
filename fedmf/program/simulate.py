"""`fedmf simulate`: the program logic with non-resumable pieces, ending in an audit of its log.

One concept: a simulation run from a config to its outputs in OUT. It runs the program logic of
`fedmf train` (`fedmf.program.logic`) with a simulation's pieces: no checkpoints, no model
releases, no journal, no budget guard, metrics.csv written whole or not at all
(`metrics_csv.MetricsCsv.fresh`), and the run written into a staging directory that replaces OUT at the end:

  config.json       the resolved config (the noise seed only if the user fixed it)
  plan.json         the privacy plan: strategy, declared schema, σ, planned ε, how it was accounted
  participation.csv who took part in which round (docs/participation-log.md)
  metrics.csv       one row per round (loss, round_seconds, accuracy on evaluated rounds, ...)
  tensorboard/      the same metrics for TensorBoard
  strategy.json     the strategy the noise came from (so `fedmf audit OUT` needs no flags)
  audit.json, report.html, report.md, plots   the audit of participation.csv (`fedmf audit OUT`)
  summary.json      what a pipeline needs: rounds_completed, noise_multiplier, initial and final
                    test accuracy, refused check-ins, violations, and the audit's min-sep and ε
  run.json          the run's id, and every file above with its sha256 (`fedmf.program.run_manifest`)

The JSON files carry the run id (`run_id`). The run is written into a staging directory beside OUT
(`.OUT.staging-RUNID`) and replaces OUT only when it has finished: an interrupted run (Ctrl-C, a
crash, a kill) leaves the earlier run in OUT as it was.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import tensorflow_federated as tff

from fedmf import progress as progress_lib
from fedmf.program import logic
from fedmf.program import metrics_csv
from fedmf.program import training_run
from fedmf.program import outputs
from fedmf.program import run_manifest
from fedmf.program.config import TrainingConfig

logger = logging.getLogger("fedmf.simulate")

RUN_FILES = outputs.RUN_MARKERS


def run_simulation(
  config: TrainingConfig,
  out_dir: str | Path,
  *,
  progress: bool | progress_lib.Progress = True,
  force: bool = False,
  report: bool = True,
  log=print,
  task=None,
) -> dict[str, Any]:
  """Runs the simulation described by `config`, writing OUT (see the module docstring).

  `task`: your own `fedmf.tasks.Task` instead of the config's (docs/simulation.md). `progress`:
  whether to show progress, or the `run_progress` the caller started (e.g. before it imported
  TensorFlow, which can take minutes on a loaded machine); it is closed here.
  """
  from fedmf.program import platform  # pylint: disable=g-import-not-at-top

  out = Path(out_dir)
  outputs.check_output_dir(out, force, RUN_FILES)
  for leftover in run_manifest.leftover_staging(Path(os.path.realpath(out))):
    logger.warning("%s", run_manifest.leftover_message(leftover))
  start = time.perf_counter()
  # Off a terminal, lines from now on: building the run (data, strategy, tracing) can take minutes.
  bar = run_progress(config.program.rounds, config.program.eval_every, progress)
  bar.set_stage("preparing the run")
  with (
    bar,
    platform.execution(config.platform, concurrent_clients=config.concurrent_clients) as pool,
  ):
    # Every check happens here, before OUT is touched.
    run = training_run.build_run(config, task=task, pool=pool)
    # The run is written beside OUT and moved into place only when it has finished.
    run_id = run_manifest.new_run_id()
    # Beside the real directory (a symlinked OUT is followed): the final rename stays in one file
    # system and replaces the directory, not the link.
    real_out = Path(os.path.realpath(out))
    stage = run_manifest.staging_path(real_out, run_id)
    stage.mkdir(parents=True)
    try:
      manifest = run_manifest.start(stage, "simulate", run_id, target=str(out))
      summary = _simulate_into(run, stage, run_id, start, bar, report, log)
      _rename_paths(stage, out)
      run_manifest.finish(stage, manifest)
      run_manifest.replace_dir(stage, real_out)
    except BaseException:
      shutil.rmtree(stage, ignore_errors=True)
      raise
  return summary


def run_progress(rounds: int, eval_every: int, progress: bool | progress_lib.Progress):
  """The progress of a run of `rounds` rounds (`fedmf.progress`: a line every `eval_every` rounds or
  30 s off a terminal), or the one given."""
  if isinstance(progress, progress_lib.Progress):
    return progress
  return progress_lib.Progress(rounds, enabled=progress, every=eval_every, stage="starting")


def _rename_paths(stage: Path, out: Path) -> None:
  """The report names the log by its path: the final one, not the staging directory's."""
  import html  # pylint: disable=g-import-not-at-top

  old, new = str(stage), str(Path(os.path.abspath(out)))
  for name in ("audit.json", "report.md", "report.html", "summary.json"):
    path = stage / name
    if path.is_file():
      text = path.read_text(encoding="utf-8")
      replaced = text.replace(old, new).replace(html.escape(old), html.escape(new))
      if replaced != text:
        path.write_text(replaced, encoding="utf-8")


class TensorBoardScalars(tff.program.ReleaseManager):
  """tensorboard/ of a simulation: each round's finite values of metrics.csv's columns as scalars,
  keyed by the round. `fedmf train` uses TFF's `TensorBoardReleaseManager`, which writes every
  value it is given under its own names; this one is kept so that a simulation's tensorboard/
  stays as it was (one TensorBoard writer for both is not done yet)."""

  def __init__(self, directory: Path, columns: tuple[str, ...]):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self.columns = columns
    self._writer = tf.summary.create_file_writer(str(directory))

  async def release(self, value: dict[str, float], key: int) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    with self._writer.as_default(step=int(key)):
      for name in self.columns[1:]:
        v = value.get(name)
        if isinstance(v, (int, float)) and math.isfinite(v):
          tf.summary.scalar(name, int(v) if name in training_run.INT_METRICS else v)

  def flush(self) -> None:
    self._writer.flush()


def _simulate_into(run, out: Path, run_id: str, start: float, bar, report: bool, log):
  """The program logic with a simulation's pieces: nothing to resume, metrics into OUT."""
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

  logic.start(run, out, run_id, log=log)
  bar.set_stage("evaluating the initial model")
  initial = run.task.evaluate(run.server.weights)
  log(f"initial test accuracy {initial['accuracy']:.4f} ({run.task.accuracy_note})")
  columns = outputs.metric_columns(run.adaptive)
  metrics = metrics_csv.MetricsCsv.fresh(out, columns)
  tensorboard = TensorBoardScalars(out / "tensorboard", columns)
  bar.set_stage(None)
  try:
    with participation_log.ParticipationLogWriter(out / "participation.csv") as log_writer:
      program = logic.Program(
        checkpoints=logic.NoCheckpoints(),
        metrics_managers=(metrics, tensorboard),
        model_manager=logic.NoReleases(),
        participation_log=log_writer,
        journal=logic.NoJournal(),
        progress=bar,
      )
      rounds = asyncio.run(logic.run_rounds(run, program, initial["accuracy"]))
  except BaseException:
    metrics.abort()
    raise
  finally:
    if run.noise is not None:
      run.noise.close()
  metrics.close()
  tensorboard.flush()
  bar.set_stage("auditing the participation log")
  seconds = time.perf_counter() - start
  return logic.finish(
    run, out, rounds.records, initial, seconds, report=report, log=log, extra={"run_id": run_id}
  )
