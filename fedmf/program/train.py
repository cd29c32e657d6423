"""`fedmf train`: the training loop as a resumable `tff.program`-style program.

One concept: running the loop of `fedmf.program.loop` so that it survives crashes and never releases
a round twice with different noise. The program logic (`train_program`) is an async function of
its platform pieces, passed in as arguments: the round runner (in process or TFF workers), the
participation data source iterator, a `tff.program.FileProgramStateManager`, release managers for
metrics (`CSVFileReleaseManager` keyed by round, `TensorBoardReleaseManager`) and for the model, the
durable participation log and the release journal.

ROOT holds:
  state/                 checkpoints (owner-only: they hold the noise seed and buffers)
  participation.csv      appended and fsynced round by round; truncated to the checkpoint on resume
  metrics.csv            one row per round (CSVFileReleaseManager, append mode, keyed by round)
  tensorboard/           the same metrics for TensorBoard
  release/               model_round_R.npz every `checkpoint_every` rounds and final_model.npz
  journal.csv            (round, sha256 of the noisy aggregate) of every round ever released
  config.json, plan.json, strategy.json, audit.json, report.html, summary.json
  run.json               the run id (kept across resumes); "running" until the program has
                         finished, then every file's sha256: `fedmf audit ROOT` refuses an
                         unfinished ROOT (fedmf.program.run_manifest)

Crash safety (why each piece is there):
  * a checkpoint (state version = rounds completed) holds the model, the server optimizer, the noise
    stream, the participation iterator, the privacy meter and the seed; version 0 is saved before
    round 0. `FileProgramStateManager` writes a temporary directory and renames it (atomic);
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
from typing import Any, Optional

import numpy as np

from fedmf import atomic_files
from fedmf.errors import FedmfUserError
from fedmf.program import loop
from fedmf.program import outputs
from fedmf.program import run_manifest
from fedmf.program import server as server_lib
from fedmf.program.config import PLATFORM_KEYS, TrainingConfig
from fedmf.program.data_source import ParticipationIterator

logger = logging.getLogger("fedmf.train")

STATE_FORMAT = 1
JOURNAL = "journal.csv"


class ResumeError(FedmfUserError):
  """ROOT cannot be resumed safely (one line saying why)."""


# ---------------------------------------------------------------------------------------------
# Platform pieces.


class ModelReleaseManager:
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


def _metrics_value(record: loop.RoundRecord) -> dict[str, float]:
  """The released metrics of a round (evaluation keys only on evaluated rounds)."""
  out = {}
  for key in outputs.METRIC_COLUMNS[1:]:
    value = getattr(record, key)
    if value is not None:
      out[key] = float(value)
  return out


# ---------------------------------------------------------------------------------------------
# Program state.


def program_state(
  run: loop.TrainingRun, iterator: ParticipationIterator, seed: int, initial_accuracy: float
) -> dict:
  """The checkpointed state (numpy only: Python floats would come back as float32)."""
  meter = run.meter.state()
  return {
    "format": np.int64(STATE_FORMAT),
    "round": np.int64(run.server.round),
    "weights": [np.asarray(w) for w in run.server.weights],
    "momentum": [np.asarray(m) for m in run.server.momentum],
    "noise": run.noise.state() if run.noise is not None else [],
    "noise_seed": np.uint64(seed),
    "initial_accuracy": np.float64(initial_accuracy),
    "meter": {
      "last_round": meter["last_round"],
      "count": meter["count"],
      "min_gap": np.int64(meter["min_gap"]),
      "max_participations": np.int64(meter["max_participations"]),
    },
    "data_iterator": iterator,
  }


def restore_state(run: loop.TrainingRun, state: dict) -> tuple[ParticipationIterator, int, float]:
  """Puts a loaded program state into the run; returns (iterator, noise seed, initial accuracy)."""
  if int(state["format"]) != STATE_FORMAT:
    raise ResumeError(f"checkpoint format {int(state['format'])} is not {STATE_FORMAT}")
  run.server.weights = [np.array(w, np.float32) for w in state["weights"]]
  run.server.momentum = [np.array(m, np.float32) for m in state["momentum"]]
  run.server.round = int(state["round"])
  seed = int(np.uint64(state["noise_seed"]))
  if run.noise is not None:
    run.noise = server_lib.HostNoise(run.noise.stream, run.shapes, seed, overlap=True)
    run.noise.restore([np.asarray(x) for x in state["noise"]])
  meter = state["meter"]
  run.meter.restore({k: np.asarray(v) for k, v in meter.items()})
  iterator = state["data_iterator"]
  run.participation = iterator.model
  return iterator, seed, float(state["initial_accuracy"])


# ---------------------------------------------------------------------------------------------
# The program logic.


async def train_program(
  run: loop.TrainingRun,
  *,
  iterator: ParticipationIterator,
  seed: int,
  initial_accuracy: float,
  state_manager,
  metrics_managers: list,
  model_manager: ModelReleaseManager,
  participation_log,
  journal: ReleaseJournal,
  progress: outputs.Progress,
  budget: Optional[float],
) -> dict[str, Any]:
  """Rounds from the run's current round to `config.rounds` (see the module docstring)."""
  c = run.config
  records: list[loop.RoundRecord] = []
  stopped_by_budget = False
  last_eval: Optional[float] = None
  start_round = run.server.round
  last_saved = start_round
  for r in range(start_round, c.rounds):
    before = iterator.to_bytes() if budget is not None else None
    ids = iterator.select()
    cohort = iterator.last_cohort
    if budget is not None:
      eps_next = run.meter.epsilon_if(r, cohort.clients)
      if eps_next > budget:
        # Round r would take ε past the budget: stop before it, as if it had not been drawn.
        iterator_restored = ParticipationIterator.from_bytes(before)
        iterator_restored.client_id = iterator.client_id
        iterator = iterator_restored
        run.participation = iterator.model
        stopped_by_budget = True
        logger.info(
          "stopping before round %d: epsilon would reach %s > budget %g",
          r,
          loop.format_epsilon(eps_next),
          budget,
        )
        break
    try:
      record = loop.train_round(run, cohort)
    except loop.TrainingDiverged as e:
      # Nothing of round r is saved or released: the last checkpoint and release stay finite.
      raise loop.TrainingDiverged(
        f"{e}; the last checkpoint ({last_saved} rounds done) and its release are kept"
      ) from None
    journal.check_and_record(r, record.noisy_mean)
    done = r + 1
    if loop.is_eval_round(c, r):
      last_eval = loop.evaluate(run, record)["accuracy"]
    checkpoint = done % c.checkpoint_every == 0 or done == c.rounds
    if checkpoint:
      await state_manager.save(program_state(run, iterator, seed, initial_accuracy), done)
      last_saved = done
    participation_log.write_round(r, ids)
    for manager in metrics_managers:
      await manager.release(_metrics_value(record), done - 1)
    if checkpoint and done < c.rounds:
      await model_manager.release(run.server.weights, done)
    records.append(record)
    progress.update(
      r,
      {
        "loss": f"{record.loss:.3f}",
        "accuracy": "-" if last_eval is None else f"{last_eval:.4f}",
        "epsilon": loop.format_epsilon(run.meter.epsilon(done)),
      },
    )
  if stopped_by_budget or run.server.round < c.rounds:
    # The state of the last completed round, so a rerun does not redo released rounds.
    with contextlib.suppress(Exception):
      await state_manager.save(
        program_state(run, iterator, seed, initial_accuracy), run.server.round
      )
  await model_manager.release(run.server.weights, "final")
  return {"records": records, "stopped_by_budget": stopped_by_budget}


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
    participation_log.csv_rounds(root / "metrics.csv"), participation_log.csv_rounds(root / JOURNAL)
  )


def run_training(
  config: TrainingConfig, root: str | Path, *, progress: bool = True, log=print
) -> dict[str, Any]:
  """Runs or resumes the training program in ROOT; returns summary.json's contents."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top
  from fedmf.program import simulate  # pylint: disable=g-import-not-at-top
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
      manifest = run_manifest.start(root, "train", run_id, rounds=config.rounds)
      state_dir = root / "state"
      state_dir.mkdir(mode=0o700, exist_ok=True)
      os.chmod(state_dir, 0o700)
      _clean_temp_states(state_dir)
      start = time.perf_counter()
      with platform.execution(config, log_dir=str(root)) as pool:
        run = loop.build_run(config)
        platform.attach(run, pool)
        state_manager = tff.program.FileProgramStateManager(
          str(state_dir), keep_total=3, keep_first=True
        )
        iterator = ParticipationIterator.create(
          config.participation,
          run.task.num_clients,
          config.clients_per_round,
          config.seed,
          loop.poisson_groups(config),
          client_id=run.task.client_id,
        )
        run.participation = iterator.model
        seed = config.noise_seed if config.noise_seed is not None else server_lib.draw_seed()
        if run.noise is not None:
          run.noise = server_lib.HostNoise(run.noise.stream, run.shapes, seed, overlap=True)
        template = program_state(run, iterator, seed, math.nan)
        loaded, version = asyncio.run(state_manager.load_latest(template))
        if loaded is None:
          if _released_rows(root) or participation_log.csv_rounds(root / "participation.csv"):
            raise ResumeError(
              f"{root} has released rounds but no checkpoint: restarting would release them "
              "again with new noise; refusing to start (use a new --root)"
            )
          initial_accuracy = run.task.evaluate(run.server.weights)["accuracy"]
          asyncio.run(state_manager.save(program_state(run, iterator, seed, initial_accuracy), 0))
          version = 0
          log(f"starting {outputs.plural(config.rounds, 'round')} in {root}")
        else:
          iterator, seed, initial_accuracy = restore_state(run, loaded)
          iterator.client_id = run.task.client_id
          log(f"resuming {root} after round {version} of {config.rounds}")
        if not resuming:
          outputs.write_json(root / "config.json", {**config.to_dict(), "run_id": run_id})
        outputs.write_json(root / "plan.json", {**simulate.plan_record(run), "run_id": run_id})
        strategies.save_strategy(run.plan.strategy, root / "strategy.json")
        for line in simulate.describe_plan(run):
          log(line)
        participation_log.truncate_csv_by_round(root / "metrics.csv", version)
        metrics = [
          tff.program.CSVFileReleaseManager(
            str(root / "metrics.csv"),
            save_mode=tff.program.CSVSaveMode.APPEND,
            key_fieldname="round",
          ),
          tff.program.TensorBoardReleaseManager(str(root / "tensorboard")),
        ]
        journal = ReleaseJournal(root / JOURNAL)
        bar = outputs.Progress(
          config.rounds, enabled=progress, every=config.eval_every, initial=version
        )
        try:
          with participation_log.AppendableParticipationLog(
            root / "participation.csv", resume_below=version
          ) as plog:
            result = asyncio.run(
              train_program(
                run,
                iterator=iterator,
                seed=seed,
                initial_accuracy=initial_accuracy,
                state_manager=state_manager,
                metrics_managers=metrics,
                model_manager=ModelReleaseManager(root / "release"),
                participation_log=plog,
                journal=journal,
                progress=bar,
                budget=config.budget.epsilon,
              )
            )
        finally:
          bar.close()
          journal.close()
          if run.noise is not None:
            run.noise.close()
      summary = _finish(
        run, root, result, initial_accuracy, time.perf_counter() - start, run_id=run_id, log=log
      )
      run_manifest.finish(root, manifest)
      return summary
  finally:
    os.umask(old_umask)


def _finish(
  run: loop.TrainingRun,
  root: Path,
  result: dict,
  initial_accuracy: float,
  seconds: float,
  *,
  run_id: str,
  log=print,
) -> dict[str, Any]:
  """The audit of the whole participation log, the report and summary.json."""
  from fedmf.program import simulate  # pylint: disable=g-import-not-at-top

  return simulate.finish(
    run,
    root,
    _all_records(root),
    {"accuracy": initial_accuracy},
    seconds,
    report=True,
    log=log,
    extra={
      "stopped_by_budget": result["stopped_by_budget"],
      "budget_epsilon": run.config.budget.epsilon,
      "workers": run.config.workers,
      "run_id": run_id,
    },
  )


def _all_records(root: Path) -> list[loop.RoundRecord]:
  """Every round's record, read back from metrics.csv (the resumed run saw only its own rounds)."""
  import csv  # pylint: disable=g-import-not-at-top

  path = root / "metrics.csv"
  records = []
  if not path.exists():
    return records
  with open(path, newline="") as f:
    for row in csv.DictReader(f):

      def value(key, cast=float):
        raw = row.get(key)
        return None if raw in (None, "", "None") else cast(float(raw))

      records.append(
        loop.RoundRecord(
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
          accuracy=value("accuracy"),
          test_loss=value("test_loss"),
          epsilon=value("epsilon"),
        )
      )
  return records
