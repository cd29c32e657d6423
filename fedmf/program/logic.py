"""The program logic of `fedmf simulate` and `fedmf train`: one run's rounds, apart from its platform.

One concept, as in `tff.program`: the logic is a function of the run (`fedmf.program.training_run`, built
once by `training_run.build_run`) and of the platform pieces its caller passes in, a state manager and
release managers (`Program`). `fedmf simulate` passes non-resumable ones (no checkpoints, no model
releases, no journal, metrics into its staging directory); `fedmf train` file-backed ones
(checkpoints, CSV and TensorBoard releases, model releases, the release journal, the budget
guard). Both run every line of the round loop here:

  `start`        config.json, plan.json, strategy.json and the plan in words
  `run_rounds`   for r in [the run's round, rounds): draw the cohort (the data source iterator) →
                 budget guard → train the round → journal → evaluate → participation log →
                 release the metrics → release the model → checkpoint → progress; then the final
                 model (every record of a round is durable before the checkpoint that covers it)
  `finish`       the audit of the whole participation log, the report and summary.json
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import tensorflow_federated as tff

from fedmf import progress as progress_lib
from fedmf.mf import strategies
from fedmf.program import training_run
from fedmf.program import outputs
from fedmf.program import plan as plan_lib
from fedmf.program import run_dir

logger = logging.getLogger("fedmf.train")


# ---------------------------------------------------------------------------------------------
# The roles of the platform pieces. Release managers are TFF's (`tff.program.ReleaseManager`); the
# other roles have no TFF ABC: the state manager here saves the run itself (`fedmf train`'s turns
# it into a program state for a `tff.program.FileProgramStateManager`), so the logic never sees
# the state's structure.


@runtime_checkable
class Checkpoints(Protocol):
  """Saves the run as version `version` (the rounds completed); `resumable`: kept to resume from."""

  resumable: bool

  async def save(self, run: training_run.TrainingRun, version: int) -> None: ...


@runtime_checkable
class RoundLog(Protocol):
  """The participation log: round `round_index`'s participants, written before it is released."""

  def write_round(self, round_index: int, client_ids: Sequence[str]) -> None: ...


@runtime_checkable
class Journal(Protocol):
  """Refuses to release a round twice with different noise (raises), else records it."""

  def check_and_record(self, round_index: int, mean: Any) -> None: ...


# ---------------------------------------------------------------------------------------------
# The pieces of a non-resumable program (`fedmf simulate`).


class NoCheckpoints:
  """The state manager of a non-resumable run: saves nothing."""

  resumable = False

  async def save(self, run: training_run.TrainingRun, version: int) -> None:
    del run, version


class NoReleases(tff.program.ReleaseManager):
  """A release manager that releases nothing (a simulation releases no model files)."""

  async def release(self, value: Any, key: Any) -> None:
    del value, key


class NoJournal:
  """The release journal of a run that is never resumed: there is no earlier release to match."""

  def check_and_record(self, round_index: int, mean: Any) -> None:
    del round_index, mean


@dataclasses.dataclass(frozen=True)
class Program:
  """The platform pieces the program logic runs with.

  Attributes:
    checkpoints: `save(run, version)` (`NoCheckpoints`, or fedmf train's file-backed one);
      `resumable` says whether a checkpoint is kept to resume from.
    metrics_managers: release managers receiving each round's metrics (`metrics_value`), keyed by
      the round.
    model_manager: releases the weights every `checkpoint_every` rounds (key: the rounds done) and
      at the end (key 'final').
    participation_log: `write_round(r, client_ids)`.
    journal: `check_and_record(r, noisy_mean)`: refuses to release a round twice, differently.
    progress: `fedmf.progress.Progress`, told the rounds done after each round.
    budget: ε the run stops before exceeding (None: no guard).
  """

  checkpoints: Checkpoints
  metrics_managers: tuple[tff.program.ReleaseManager, ...]
  model_manager: tff.program.ReleaseManager
  participation_log: RoundLog
  journal: Journal
  progress: progress_lib.Progress
  budget: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Rounds:
  """What `run_rounds` did: the records of the rounds it ran, and whether the budget stopped it."""

  records: list
  stopped_by_budget: bool


def metrics_value(record: training_run.RoundRecord, adaptive: bool = False) -> dict[str, float]:
  """The released metrics of a round (evaluation keys only on evaluated rounds; ζ_t and the noisy
  fraction within it only with adaptive clipping)."""
  out = {}
  for key in outputs.metric_columns(adaptive)[1:]:
    value = getattr(record, key)
    if value is not None:
      out[key] = float(value)
  return out


# ---------------------------------------------------------------------------------------------
# The program logic.


def start(
  run: training_run.TrainingRun, out: Path, run_id: str, *, write_config: bool = True, log=print
):
  """Writes config.json (unless a resumed run has it), plan.json and strategy.json; says the plan."""
  if write_config:
    outputs.write_json(out / "config.json", {**run.config.to_dict(), "run_id": run_id})
  outputs.write_json(out / run_dir.PLAN_FILE, {**plan_record(run), "run_id": run_id})
  # The strategy the noise comes from, so that `fedmf audit OUT` needs no flags.
  strategies.save_strategy(run.plan.strategy, out / run_dir.STRATEGY_FILE)
  for line in describe_plan(run):
    log(line)


async def run_rounds(
  run: training_run.TrainingRun, program: Program, initial_accuracy: float
) -> Rounds:
  """Rounds from the run's current round to `config.program.rounds` (see the module docstring)."""
  c = run.config
  records: list[training_run.RoundRecord] = []
  accuracy = initial_accuracy  # The last evaluation's, for the progress line.
  last_saved = run.server.round
  stopped_by_budget = False
  for r in range(run.server.round, c.program.rounds):
    # Ctrl-C: `asyncio.run` (Python 3.11) answers SIGINT by cancelling this task, which takes effect
    # only where it suspends. The rounds' TFF calls are synchronous and the managers' awaits may not
    # suspend, so without this the interrupt waited until every round had run (42 s for a 400-round
    # run), then discarded them: yield once per round, so it stops between rounds.
    await asyncio.sleep(0)
    ids = _draw_within_budget(run, r, program.budget)
    if ids is None:
      stopped_by_budget = True
      break
    try:
      record = training_run.train_round(run, run.data_iterator.last_cohort)
    except training_run.TrainingDiverged as e:
      if not program.checkpoints.resumable:
        raise
      # Nothing of round r is saved or released: the last checkpoint and release stay finite.
      raise training_run.TrainingDiverged(
        f"{e}; the last checkpoint ({last_saved} rounds done) and its release are kept"
      ) from None
    program.journal.check_and_record(r, record.noisy_mean)
    done = r + 1
    if c.program.is_eval_round(r):
      accuracy = training_run.evaluate(run, record)["accuracy"]
    # Round r's records, each durable when written, go BEFORE the checkpoint that covers round r:
    # a crash after that checkpoint resumes from round r + 1 and never writes round r again, so a
    # record written after it could be lost for good (the participation log's rows: the audit
    # would under-count those devices; metrics.csv: the audit counts its rows as the rounds run).
    # A crash before the checkpoint is safe: resume truncates the logs to the checkpoint and
    # recomputes the rounds after it identically (the journal checks that).
    checkpoint = done % c.program.checkpoint_every == 0 or done == c.program.rounds
    program.participation_log.write_round(r, ids + record.canary_ids)
    for manager in program.metrics_managers:
      await manager.release(metrics_value(record, run.adaptive), r)
    if checkpoint and done < c.program.rounds:
      await program.model_manager.release(run.server.weights, done)
    if checkpoint:
      await program.checkpoints.save(run, done)
      last_saved = done
    records.append(record)
    # Lazy: the realized ε in the fields is an accountant call per new round count (1.9 s for a
    # tree at n = 1,500 on 2 shared cores), so it is computed only when a line shows it.
    program.progress.update(done, functools.partial(_progress_fields, run, records, accuracy))
  if run.server.round != last_saved:
    # A budget stop between checkpoints: the state of the last completed round, so a rerun does
    # not redo released rounds. Not when that round's checkpoint exists (a stop right after a
    # checkpoint round, or at once on resume): saving a version twice raises. Anything else that
    # fails here (a full disk, a permission) surfaces: the run is then unfinished and a rerun
    # resumes from the last checkpoint, recomputing the same rounds.
    await program.checkpoints.save(run, run.server.round)
  await program.model_manager.release(run.server.weights, "final")
  return Rounds(records, stopped_by_budget)


def _draw_within_budget(run: training_run.TrainingRun, r: int, budget: Optional[float]):
  """Round r's client ids from the run's data source, or None when releasing round r would take
  ε past the budget: the iterator is then put back as if the round had not been drawn."""
  from fedmf.program.data_source import ParticipationIterator  # pylint: disable=g-import-not-at-top

  iterator = run.data_iterator
  before = iterator.to_bytes() if budget is not None else None
  ids = iterator.select()
  if budget is None:
    return ids
  eps_next = run.meter.epsilon_if(r, iterator.last_cohort.clients)
  if eps_next <= budget:
    return ids
  restored = ParticipationIterator.from_bytes(before)
  restored.client_id = iterator.client_id
  run.data_iterator = restored
  logger.info(
    "stopping before round %d: epsilon would reach %s > budget %g",
    r,
    training_run.format_epsilon(eps_next),
    budget,
  )
  return None


def _progress_fields(
  run: training_run.TrainingRun, records: list, accuracy: float
) -> dict[str, str]:
  record = records[-1]
  fields = {"loss": f"{record.loss:.3f}", "accuracy": f"{accuracy:.4f}"}
  if run.plan.noise_multiplier:
    fields["epsilon"] = training_run.format_epsilon(run.meter.epsilon(record.round + 1))
  else:  # σ = 0: no ε to show (the meter's would be inf), as every other output says.
    fields["epsilon"] = "none (no privacy guarantee)"
  zeroed = sum(x.zeroed for x in records)
  if zeroed:  # Client updates dropped (non-finite or above zeroing_linf): said, not hidden.
    fields["zeroed"] = str(zeroed)
  return fields


# ---------------------------------------------------------------------------------------------
# The plan, in JSON and in words.


def plan_record(run: training_run.TrainingRun) -> dict[str, Any]:
  c = run.config
  out = run.plan.to_dict()
  out["participation"] = run.participation.describe()
  if c.cheap_simulation:
    out["cheap_simulation"] = (
      f"trained on {c.program.clients_per_round} clients per round with σ scaled by "
      f"{c.program.clients_per_round}/{c.privacy.reference_clients_per_round}, so the noise on the mean matches "
      f"a {c.privacy.reference_clients_per_round}-client cohort (BandMF App. I); privacy is that of the "
      f"{c.privacy.reference_clients_per_round}-client run"
    )
  return out


def describe_plan(run: training_run.TrainingRun) -> list[str]:
  p = run.plan
  lines = [
    f"strategy: {p.strategy.describe()}"
    if p.noise_multiplier
    else "strategy: none (no noise is added without DP)",
    f"participation: {run.participation.describe()}; declared {p.schema.describe()}",
    f"noise multiplier: {p.noise_multiplier:.6g}"
    + (
      f" (training uses {p.training_noise_multiplier:.6g}: cheap simulation of "
      f"{run.config.privacy.reference_clients_per_round} clients per round)"
      if run.config.cheap_simulation and p.noise_multiplier
      else ""
    ),
    f"planned privacy: epsilon {training_run.format_epsilon(p.epsilon)} at delta {p.delta:g} "
    f"({p.accounting})"
    if p.noise_multiplier
    else "planned privacy: none (noise multiplier 0 trains without DP: no privacy guarantee)",
  ]
  if p.adaptive_clip is not None:
    clip = p.adaptive_clip
    lines.append(
      f"clip norm: adaptive, to the {clip.target_quantile:g} quantile of the update norms "
      f"(initial {clip.initial:g}, learning rate {clip.learning_rate:g}, count noise multiplier "
      f"{clip.count_noise_multiplier:.6g}"
      + (
        f", training uses {p.training_count_noise_multiplier:.6g}"
        if p.training_count_noise_multiplier != clip.count_noise_multiplier
        else ""
      )
      + ")"
    )
  budget = run.config.program.budget.epsilon
  if budget is not None and p.noise_multiplier and p.epsilon > budget:
    # Said before the rounds, not found out after them (issue 38 item 7).
    warning = (
      f"warning: the planned epsilon {training_run.format_epsilon(p.epsilon)} exceeds budget.epsilon "
      f"{budget:g}: the budget guard will stop the run early"
    )
    if p.sensitivity is not None:  # (b-min-separation accounting; not an amplified plan)
      fit = plan_lib.rounds_within_budget(p, budget)
      warning += (
        f", at the earliest before round {fit} (the first {fit} of "
        f"{run.config.program.rounds} rounds fit the budget under the declared participation)"
      )
    lines.append(warning + "; lower the rounds, raise noise_multiplier, or use target_epsilon")
  return lines


# ---------------------------------------------------------------------------------------------
# After the rounds: the audit and summary.json.


def finish(
  run: training_run.TrainingRun,
  out: Path,
  records: list[training_run.RoundRecord],
  initial: dict[str, float],
  seconds: float,
  *,
  report: bool,
  log=print,
  extra: Optional[dict[str, Any]] = None,
  budget: Optional[float] = None,
  stopped_by_budget: bool = False,
) -> dict[str, Any]:
  """Audits the run's participation log and writes audit.json, the report and summary.json.

  `budget` (fedmf train's budget.epsilon) is drawn on the report's ε curve and checked by the
  audit; `stopped_by_budget` says in the report why the run has fewer rounds than planned."""
  if run.canaries is not None:
    run.canaries.save(
      out / "canaries.npz",
      len(records),
      run.task.initial_weights(run.config.program.seed),
      run.server.weights,
    )
  c = run.config
  p = run.plan
  # The final accuracy is the final model's: the last round's evaluation, or, when the last round
  # was not an evaluation round (a budget stop of `fedmf train`), the model evaluated now (and
  # shown on the report's accuracy plot).
  final_accuracy = final_loss = None
  evaluated_after = None
  if records and records[-1].accuracy is not None:
    final_accuracy, final_loss = records[-1].accuracy, records[-1].test_loss
  elif records:
    final = run.task.evaluate(run.server.weights)
    final_accuracy, final_loss = final["accuracy"], final["loss"]
    evaluated_after = (records[-1].round + 1, float(final_accuracy))
  notes = []
  if budget is not None:
    done = len(records)
    notes.append(
      f"privacy budget (budget.epsilon): {budget:g}; the program stopped after {done} of "
      f"{c.program.rounds} rounds because releasing round {done} would have taken epsilon past "
      "it (the dotted line)"
      if stopped_by_budget
      else f"privacy budget (budget.epsilon): {budget:g}; the run stayed within it"
    )
  result, audit_dict = _audit(
    run, out, len(records), initial, report, budget, tuple(notes), evaluated_after
  )
  counts = result.violation_counts()
  summary = {
    "rounds": c.program.rounds,
    "rounds_completed": len(records),
    "task": c.task.name,
    "model": c.task.model,
    "strategy": p.strategy.describe(),
    "participation": run.participation.describe(),
    "clients_per_round": c.program.clients_per_round,
    "num_clients": run.task.num_clients,
    "noise_multiplier": p.noise_multiplier,
    "training_noise_multiplier": p.training_noise_multiplier,
    "planned_epsilon": p.epsilon,
    "delta": c.privacy.delta,
    "accounting": p.accounting,
    "accountant": p.accountant,
    "cross_check": p.cross_check,
    "initial_test_accuracy": initial["accuracy"],
    "final_test_accuracy": final_accuracy,
    "final_test_loss": final_loss,
    "accuracy_note": run.task.accuracy_note,
    "refused_checkins": int(sum(r.refused_checkins for r in records)),
    "early_checkins_admitted": int(sum(r.early_admitted for r in records)),
    "clipped_updates": int(sum(r.clipped for r in records)),
    **_clip_summary(run, records),
    "zeroed_updates": int(sum(r.zeroed for r in records)),
    "violations": int(sum(counts.values())),
    "violation_counts": counts,
    "median_round_seconds": _median([r.round_seconds for r in records]),
    "seconds": seconds,
    # The audit's claim (= `fedmf audit OUT --json`'s "epsilon"), also under audit.epsilon.
    "epsilon": audit_dict.get("epsilon"),
    "audit": _audit_summary(result, audit_dict, c.privacy.delta),
    **(extra or {}),
  }
  if c.cheap_simulation:
    summary["cheap_simulation"] = plan_record(run)["cheap_simulation"]
  outputs.write_json(out / "summary.json", summary)
  return summary


def _clip_summary(
  run: training_run.TrainingRun, records: list[training_run.RoundRecord]
) -> dict[str, Any]:
  """summary.json's keys of an adaptive clip (none for a fixed clip): ζ of the first and last
  rounds and ζ for the next round."""
  if not run.adaptive:
    return {}
  clips = [r.clip_norm for r in records if r.clip_norm is not None]
  return {
    "adaptive_clip": {
      **dataclasses.asdict(run.plan.adaptive_clip),
      "training_count_noise_multiplier": run.plan.training_count_noise_multiplier,
      "first_clip_norm": clips[0] if clips else None,
      "last_clip_norm": clips[-1] if clips else None,
      "next_clip_norm": run.clip_norm,
    }
  }


def _audit(
  run: training_run.TrainingRun,
  out: Path,
  rounds_completed: int,
  initial,
  report: bool,
  budget: Optional[float] = None,
  notes: tuple[str, ...] = (),
  final_accuracy: Optional[tuple[int, float]] = None,
):
  """The audit of OUT/participation.csv (and the report); returns (result, its dict)."""
  from fedmf.privacy import audit  # pylint: disable=g-import-not-at-top

  p = run.plan
  declared = p.schema.with_rounds(max(rounds_completed, 1))
  sampling = declared_sampling(run)
  # σ as accounted; 0 (no DP) is audited for its participation and states no guarantee.
  result = audit.audit_log(
    out / "participation.csv",
    p.strategy,
    p.noise_multiplier,
    run.config.privacy.delta,
    rounds=max(rounds_completed, 1),
    min_sep=declared.min_sep,
    max_participations=declared.max_participations,
    progress=False,
    curve="every-round" if report else False,  # the meter's ε, round by round
    notes=run_dir.plan_notes(plan_record(run), sampling_audited=sampling is not None) + notes,
    sampling=sampling,
    count_noise_multiplier=p.count_noise_multiplier,  # adaptive clipping's counts (None: fixed)
    max_epsilon=budget,
  )
  if run.canaries is not None:
    from fedmf.program import canary_audit  # pylint: disable=g-import-not-at-top

    measured, warnings = canary_audit.measured_privacy(out, result)
    result = dataclasses.replace(
      result, empirical=measured, warnings=result.warnings + tuple(warnings)
    )
  audit_dict = result.to_dict()
  if report:
    from fedmf.privacy import report as report_lib  # pylint: disable=g-import-not-at-top

    strategy_file = out / run_dir.STRATEGY_FILE
    report_lib.write_report(
      result,
      out,
      strategy_path=str(strategy_file) if strategy_file.is_file() else None,
      # summary.json, which holds the initial accuracy, comes next.
      metrics=run_dir.read_metrics(
        out, initial_accuracy=initial["accuracy"], final_accuracy=final_accuracy
      ),
    )
  else:
    outputs.write_json(out / "audit.json", audit_dict)
  return result, audit_dict


def _audit_summary(result, audit_dict: dict[str, Any], delta: float) -> dict[str, Any]:
  return {
    "observed_min_sep": audit_dict.get("observed_min_sep"),
    "observed_max_participations": audit_dict.get("observed_max_participations"),
    "sensitivity": audit_dict.get("sensitivity"),
    "sensitivity_method": audit_dict.get("sensitivity_method"),
    "rho": audit_dict.get("rho"),
    "epsilon": audit_dict.get("epsilon"),
    "accountant": audit_dict.get("accountant"),
    "delta": delta,
    "privacy_guarantee": audit_dict.get("privacy_guarantee"),
    "statement": audit_dict.get("statement"),
    **(
      {
        "epsilon_amplified": audit_dict["epsilon_amplified"],
        "unamplified_epsilon": audit_dict["unamplified_epsilon"],
        "partition_violations": result.partition_violations,
      }
      if "epsilon_amplified" in audit_dict
      else {}
    ),
    **(
      {
        "empirical": {
          name: {
            key: audit_dict["empirical"][name][key]
            for key in ("epsilon_estimate", "epsilon_lower", "confidence", "analytic_epsilon")
          }
          for name in ("all_releases", "final_model")
          if name in audit_dict["empirical"]
        }
      }
      if "empirical" in audit_dict
      else {}
    ),
  }


def declared_sampling(run: training_run.TrainingRun):
  """The run's cyclic Poisson sampling as its audit checks it (`fedmf audit OUT` reads the same
  from config.json and summary.json: `run_dir.declared_sampling`), or None."""
  from fedmf.privacy import partition_audit  # pylint: disable=g-import-not-at-top

  amp = run.participation.amplification()
  if amp is None:
    return None
  return partition_audit.DeclaredSampling(
    amp.groups, run.task.num_clients, amp.sampling_probability
  )


def _median(values: list[float]) -> Optional[float]:
  if not values:
    return None
  values = sorted(values)
  mid = len(values) // 2
  return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])
