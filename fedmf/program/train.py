"""`fedmf train`: the training loop as a resumable `tff.program`-style program.

One concept: the file-backed platform pieces that make a run survive crashes and never release a
round twice with different noise, and `run_training`, which runs the program logic of both commands
(`fedmf.program.logic.run_rounds`, an async function of its platform pieces) with them: the run's
round runner (in process or TFF workers) and participation data source iterator, a
`tff.program.FileProgramStateManager` (`FileCheckpoints`), release managers for metrics
(`metrics_csv.MetricsCsv.resumable` keyed by round, TFF's `TensorBoardReleaseManager`) and for the model
(`ModelReleaseManager`), the durable participation log and the release journal (`ReleaseJournal`).

ROOT holds:
  state/                 checkpoints (owner-only: they hold the noise seed and buffers)
  participation.csv      appended and fsynced round by round; truncated to the checkpoint on resume
  metrics.csv            one row per round, appended and fsynced, in `fedmf simulate`'s columns
  tensorboard/           the same metrics for TensorBoard
  release/               model_round_R.npz every `checkpoint_every` rounds and final_model.npz
  journal.csv            (round, sha256 of the noisy aggregate) of every round ever released
  config.json, plan.json, strategy.json, audit.json, report.html, summary.json
  run.json               the run id (kept across resumes); "running" until the program has
                         finished, then every file's sha256: `fedmf audit ROOT` refuses an
                         unfinished ROOT (fedmf.program.run_manifest)

Crash safety (why each piece is there):
  * a checkpoint (state version = rounds completed) holds the model, the server optimizer, the noise
    stream, the participation iterator, the privacy meter, the seed and, with adaptive clipping,
    ζ (float64, so the resumed ζ trajectory is bit-identical); version 0 is saved before round 0.
    `FileProgramStateManager` writes a temporary directory and renames it (atomic);
  * on resume the logs are truncated to the checkpoint and the rounds after it are recomputed:
    cohorts are keyed by (seed, round), the noise by (seed, round) with restored buffers, and the
    chunk sums are added in a fixed order, so the recomputed aggregate is the same; the journal
    checks that, and the program stops instead of releasing a different noisy aggregate;
  * a ROOT with released rounds but no checkpoint is refused (the noise would restart from scratch);
  * the budget guard stops before the round whose release would exceed `budget.epsilon`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_federated as tff

from fedmf import atomic_files
from fedmf import progress as progress_lib
from fedmf.errors import FedmfUserError
from fedmf.program import logic
from fedmf.program import metrics_csv
from fedmf.program import training_run
from fedmf.program import outputs
from fedmf.program import run_dir
from fedmf.program import run_manifest
from fedmf.program import simulate
from fedmf.program.config import PLATFORM_KEYS, TrainingConfig

logger = logging.getLogger("fedmf.train")

STATE_FORMAT = 1
JOURNAL = "journal.csv"


class ResumeError(FedmfUserError):
  """ROOT cannot be resumed safely (one line saying why)."""


# ---------------------------------------------------------------------------------------------
# Platform pieces.


class ModelReleaseManager(tff.program.ReleaseManager):
  """Releases the trainable weights as `numpy.savez` files under ROOT/release (atomic writes).

  The value released is the list of weights only, never the server state (the seed and the noise
  buffers are secret). Key: the round (`model_round_000010.npz`) or 'final' (`final_model.npz`).
  """

  def __init__(self, directory: Path):
    self.directory = Path(directory)
    self.directory.mkdir(parents=True, exist_ok=True)

  async def release(self, value: list[np.ndarray], key) -> None:
    name = "final_model.npz" if key == "final" else f"model_round_{int(key):06d}.npz"
    with atomic_files.open_atomic(self.directory / name, binary=True) as f:
      np.savez(f, *[np.asarray(w) for w in value])


class ReleaseJournal:
  """(round, sha256 of the noisy aggregate) of every released round; fsynced appends."""

  def __init__(self, path: Path):
    self.path = Path(path)
    self.digests: dict[int, str] = {}
    if self.path.exists():
      for line in self.path.read_text().splitlines()[1:]:
        parts = line.split(",")
        if len(parts) == 2 and parts[0].isdigit() and len(parts[1]) == 64:
          self.digests[int(parts[0])] = parts[1]
    self._journal = atomic_files.Journal(self.path, "round,sha256\n")

  @staticmethod
  def digest(mean: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for m in mean:
      h.update(np.ascontiguousarray(m, dtype=np.float32).tobytes())
    return h.hexdigest()

  def check_and_record(self, round_index: int, mean: list[np.ndarray]) -> None:
    """Refuses a second, different noisy aggregate for a round; records a new one."""
    digest = self.digest(mean)
    known = self.digests.get(round_index)
    if known is not None:
      if known != digest:
        raise ResumeError(
          f"round {round_index} was released before with a different noisy aggregate; refusing "
          "to release it again (was the config, the data or the software changed?)"
        )
      return
    self._journal.append(f"{round_index},{digest}\n")
    self.digests[round_index] = digest

  def close(self) -> None:
    self._journal.close()


# ---------------------------------------------------------------------------------------------
# Program state.


def program_state(
  run: training_run.TrainingRun, initial_accuracy: float, template: bool = False
) -> dict:
  """The checkpointed state (numpy only: Python floats would come back as float32). A template
  (the structure for loading; its values are never read) holds no copy of the noise buffers and
  needs no started noise stream."""
  meter = run.meter.state()
  if template:
    noise = training_run.noise_state_template(run)
  else:
    noise = run.noise.state() if run.noise is not None else []
  # ζ_t of an adaptive clip (a fixed clip's checkpoint keeps the layout it always had).
  clip = {"clip": np.float64(math.nan if template else run.clip.state())} if run.adaptive else {}
  # The canaries' seed, rounds and projections so far (only with `canaries:`: a run without them
  # keeps the checkpoint structure it always had).
  canaries = {} if run.canaries is None else {"canaries": run.canaries.state()}
  return {
    "format": np.int64(STATE_FORMAT),
    "round": np.int64(run.server.round),
    "weights": [np.asarray(w) for w in run.server.weights],
    "momentum": [np.asarray(m) for m in run.server.momentum],
    "noise": noise,
    "noise_seed": np.uint64(run.noise_seed),
    "initial_accuracy": np.float64(initial_accuracy),
    "meter": {
      "last_round": meter["last_round"],
      "count": meter["count"],
      "min_gap": np.int64(meter["min_gap"]),
      "max_participations": np.int64(meter["max_participations"]),
    },
    "data_iterator": run.data_iterator,
    **clip,
    **canaries,
  }


def restore_state(run: training_run.TrainingRun, state: dict) -> float:
  """Puts a loaded program state into the run; returns the initial accuracy."""
  if int(state["format"]) != STATE_FORMAT:
    raise ResumeError(f"checkpoint format {int(state['format'])} is not {STATE_FORMAT}")
  run.server.weights = [np.array(w, np.float32) for w in state["weights"]]
  run.server.momentum = [np.array(m, np.float32) for m in state["momentum"]]
  run.server.round = int(state["round"])
  training_run.start_noise(run, int(np.uint64(state["noise_seed"])))
  if run.noise is not None:
    run.noise.restore([np.asarray(x) for x in state["noise"]])
  if run.adaptive:
    run.clip.restore(np.float64(state["clip"]))
  meter = state["meter"]
  run.meter.restore({k: np.asarray(v) for k, v in meter.items()})
  run.data_iterator = state["data_iterator"]
  run.data_iterator.client_id = run.task.client_id
  if run.canaries is not None:
    run.canaries.restore(state["canaries"])
  return float(state["initial_accuracy"])


class FileCheckpoints:
  """The program logic's state manager in ROOT/state: a `tff.program.FileProgramStateManager`
  (version = rounds completed) of `program_state`."""

  resumable = True

  def __init__(self, state_dir: Path):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    self.manager = tff.program.FileProgramStateManager(
      str(state_dir), keep_total=3, keep_first=True
    )
    self.initial_accuracy = math.nan

  async def save(self, run: training_run.TrainingRun, version: int) -> None:
    await self.manager.save(program_state(run, self.initial_accuracy), version)

  def resume_or_start(self, run: training_run.TrainingRun, root: Path, log=print) -> int:
    """Restores the latest checkpoint into the run (built with `noise=False`: the noise stream
    starts with the checkpoint's seed), or starts the noise, evaluates the initial model and saves
    version 0; returns the rounds completed."""
    template = program_state(run, math.nan, template=True)
    loaded, version = asyncio.run(self.manager.load_latest(template))
    if loaded is not None:
      self.initial_accuracy = restore_state(run, loaded)
      log(f"resuming {root} after round {version} of {run.config.program.rounds}")
      return version
    if _released_rows(root):
      raise ResumeError(
        f"{root} has released rounds but no checkpoint: restarting would release them "
        "again with new noise; refusing to start (use a new --root)"
      )
    training_run.start_noise(run)
    self.initial_accuracy = run.task.evaluate(run.server.weights)["accuracy"]
    asyncio.run(self.save(run, 0))
    log(f"starting {outputs.plural(run.config.program.rounds, 'round')} in {root}")
    return 0


# ---------------------------------------------------------------------------------------------
# The platform: ROOT, locks, contexts, resume.


@contextlib.contextmanager
def _root_lock(root: Path):
  root.mkdir(parents=True, exist_ok=True)
  lock = open(root / ".lock", "w")
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    lock.close()
    raise ResumeError(f"{root} is in use by another fedmf train process") from None
  try:
    yield
  finally:
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()


def _check_root(root: Path) -> None:
  """Refuses a ROOT holding something other than a `fedmf train` run (before anything is written)."""
  run_manifest.check_train_root(root)


def _check_config(root: Path, config: TrainingConfig) -> bool:
  """True when ROOT already has this run's config; refuses another run's config."""
  path = root / "config.json"
  if not path.exists():
    return False
  saved = json.loads(path.read_text())
  saved.pop("run_id", None)
  current = json.loads(json.dumps(config.to_dict()))
  for key in PLATFORM_KEYS:  # Where the run executes may change between attempts.
    saved.pop(key, None)
    current.pop(key, None)
  if saved != current:
    changed = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
    raise ResumeError(
      f"{root} holds a run with another config (differs in: {', '.join(changed)}); "
      "resume with the same config or use another --root"
    )
  return True


def _clean_temp_states(state_dir: Path) -> None:
  """FileProgramStateManager leaves `*_temp*` directories behind after a crash; they are garbage."""
  if state_dir.is_dir():
    for entry in state_dir.iterdir():
      if "_temp" in entry.name:
        shutil.rmtree(entry, ignore_errors=True)


def _released_rows(root: Path) -> int:
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

  return max(
    participation_log.csv_rounds(root / "metrics.csv"),
    participation_log.csv_rounds(root / JOURNAL),
    participation_log.csv_rounds(root / "participation.csv"),
  )


def run_training(
  config: TrainingConfig,
  root: str | Path,
  *,
  progress: bool | progress_lib.Progress = True,
  log=print,
) -> dict[str, Any]:
  """Runs or resumes the training program in ROOT; returns summary.json's contents (`progress`:
  as `fedmf.program.simulate.run_simulation`'s)."""
  from fedmf.program import platform  # pylint: disable=g-import-not-at-top

  root = Path(root)
  _check_root(root)  # Before the lock: a refused ROOT is left as it was (no .lock in it).
  old_umask = os.umask(0o077)  # Checkpoints hold the noise seed: owner-only files.
  try:
    with _root_lock(root):
      resuming = _check_config(root, config)
      previous = run_manifest.read(root)
      run_id = previous["run_id"] if previous else run_manifest.new_run_id()
      # From here until the end ROOT holds an unfinished run, which `fedmf audit` refuses.
      manifest = run_manifest.start(root, "train", run_id, rounds=config.program.rounds)
      checkpoints = FileCheckpoints(_state_dir(root))
      start = time.perf_counter()
      # Off a terminal, lines from now on: building the run and resuming can take minutes.
      bar = simulate.run_progress(config.program.rounds, config.program.eval_every, progress)
      bar.set_stage("preparing the run")
      with bar:
        with platform.execution(
          config.platform,
          log_dir=str(root),
          concurrent_clients=config.concurrent_clients,
        ) as pool:
          # The noise seed may come from the checkpoint.
          run = training_run.build_run(config, noise=False, pool=pool)
          try:
            version = checkpoints.resume_or_start(run, root, log)
            logic.start(run, root, run_id, write_config=not resuming, log=log)
            bar.start_at(version)
            bar.set_stage(None)
            rounds = _run_program(run, root, checkpoints, version, bar)
          finally:
            if run.noise is not None:
              run.noise.close()
        bar.set_stage("auditing the participation log")
        summary = _finish(
          run, root, rounds, checkpoints.initial_accuracy, time.perf_counter() - start, run_id
        )
      run_manifest.finish(root, manifest)
      return summary
  finally:
    os.umask(old_umask)


def _state_dir(root: Path) -> Path:
  """ROOT/state, owner-only, without the temporary directories a crash left behind."""
  state_dir = root / "state"
  state_dir.mkdir(mode=0o700, exist_ok=True)
  os.chmod(state_dir, 0o700)
  _clean_temp_states(state_dir)
  return state_dir


def _run_program(
  run: training_run.TrainingRun,
  root: Path,
  checkpoints: FileCheckpoints,
  version: int,
  bar: progress_lib.Progress,
) -> logic.Rounds:
  """The program logic with the file-backed pieces, from round `version` on."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

  config = run.config
  metrics_file = metrics_csv.MetricsCsv.resumable(
    root / metrics_csv.METRICS_FILE,
    resume_below=version,
    columns=outputs.metric_columns(run.adaptive),
  )
  metrics = (metrics_file, tff.program.TensorBoardReleaseManager(str(root / "tensorboard")))
  journal = ReleaseJournal(root / JOURNAL)
  try:
    with participation_log.AppendableParticipationLog(
      root / "participation.csv", resume_below=version
    ) as plog:
      program = logic.Program(
        checkpoints=checkpoints,
        metrics_managers=metrics,
        model_manager=ModelReleaseManager(root / "release"),
        participation_log=plog,
        journal=journal,
        progress=bar,
        budget=config.program.budget.epsilon,
      )
      return asyncio.run(logic.run_rounds(run, program, checkpoints.initial_accuracy))
  finally:
    journal.close()
    metrics_file.close()


def _finish(
  run: training_run.TrainingRun,
  root: Path,
  rounds: logic.Rounds,
  initial_accuracy: float,
  seconds: float,
  run_id: str,
) -> dict[str, Any]:
  """The audit of the whole participation log, the report and summary.json."""
  return logic.finish(
    run,
    root,
    _all_records(root),
    {"accuracy": initial_accuracy},
    seconds,
    report=True,
    budget=run.config.program.budget.epsilon,
    stopped_by_budget=rounds.stopped_by_budget,
    extra={
      "stopped_by_budget": rounds.stopped_by_budget,
      "budget_epsilon": run.config.program.budget.epsilon,
      "workers": run.config.platform.workers,
      "run_id": run_id,
    },
  )


def _all_records(root: Path) -> list[training_run.RoundRecord]:
  """Every round's record, read back from metrics.csv (the resumed run saw only its own rounds)
  by its one reader, `run_dir.metrics_rows`."""
  records = []
  for row in run_dir.metrics_rows(root) or []:

    def value(key, cast=float, row=row):
      raw = row.get(key)
      return None if raw in (None, "", "None") else cast(float(raw))

    records.append(
      training_run.RoundRecord(
        round=int(float(row["round"])),
        clients=value("clients", int) or 0,
        loss=value("loss") if value("loss") is not None else math.nan,
        round_seconds=value("round_seconds") or 0.0,
        learning_rate=value("learning_rate") or 0.0,
        noise_stddev=value("noise_stddev") or 0.0,
        checked_in=value("checked_in", int) or 0,
        refused_checkins=value("refused_checkins", int) or 0,
        early_admitted=value("early_admitted", int) or 0,
        clipped=value("clipped", int) or 0,
        zeroed=value("zeroed", int) or 0,
        clip_norm=value("clip_norm"),
        unclipped_fraction=value("unclipped_fraction"),
        accuracy=value("accuracy"),
        test_loss=value("test_loss"),
        epsilon=value("epsilon"),
      )
    )
  return records
