"""`fedmf simulate`: the training loop in process, ending in an audit of its own participation log.

One concept: a simulation run from a config to its outputs in OUT:

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

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Optional

from fedmf.mf import strategies
from fedmf.program import loop
from fedmf.program import outputs
from fedmf.program import run_dir
from fedmf.program import run_manifest
from fedmf.program.config import TrainingConfig

logger = logging.getLogger("fedmf.simulate")

RUN_FILES = outputs.RUN_MARKERS


def config_record(config: TrainingConfig) -> dict[str, Any]:
  return config.to_dict()


def plan_record(run: loop.TrainingRun) -> dict[str, Any]:
  c = run.config
  out = run.plan.to_dict()
  out["participation"] = run.participation.describe()
  if c.reference_clients_per_round is not None:
    out["cheap_simulation"] = (
      f"trained on {c.clients_per_round} clients per round with σ scaled by "
      f"{c.clients_per_round}/{c.reference_clients_per_round}, so the noise on the mean matches "
      f"a {c.reference_clients_per_round}-client cohort (BandMF App. I); privacy is that of the "
      f"{c.reference_clients_per_round}-client run"
    )
  return out


def describe_plan(run: loop.TrainingRun) -> list[str]:
  p = run.plan
  lines = [
    f"strategy: {p.strategy.describe()}"
    if p.noise_multiplier
    else "strategy: none (no noise is added without DP)",
    f"participation: {run.participation.describe()}; declared {p.schema.describe()}",
    f"noise multiplier: {p.noise_multiplier:.6g}"
    + (
      f" (training uses {p.training_noise_multiplier:.6g}: cheap simulation of "
      f"{run.config.reference_clients_per_round} clients per round)"
      if run.config.reference_clients_per_round and p.noise_multiplier
      else ""
    ),
    f"planned privacy: epsilon {loop.format_epsilon(p.epsilon)} at delta {p.delta:g} "
    f"({p.accounting})"
    if p.noise_multiplier
    else "planned privacy: none (noise multiplier 0 trains without DP: no privacy guarantee)",
  ]
  return lines


def run_simulation(
  config: TrainingConfig,
  out_dir: str | Path,
  *,
  progress: bool = True,
  force: bool = False,
  report: bool = True,
  log=print,
  task=None,
) -> dict[str, Any]:
  """Runs the simulation described by `config`, writing OUT (see the module docstring).

  `task`: your own `fedmf.tasks.Task` instead of the config's (docs/simulation.md).
  """
  from fedmf.program import platform  # pylint: disable=g-import-not-at-top

  out = Path(out_dir)
  outputs.check_output_dir(out, force, RUN_FILES)
  for leftover in run_manifest.leftover_staging(Path(os.path.realpath(out))):
    logger.warning("%s", run_manifest.leftover_message(leftover))
  start = time.perf_counter()
  with platform.execution(config) as pool:
    run = loop.build_run(config, task=task)  # Every check happens here, before OUT is touched.
    platform.attach(run, pool)
    # The run is written beside OUT and moved into place only when it has finished.
    run_id = run_manifest.new_run_id()
    # Beside the real directory (a symlinked OUT is followed): the final rename stays in one file
    # system and replaces the directory, not the link.
    real_out = Path(os.path.realpath(out))
    stage = run_manifest.staging_path(real_out, run_id)
    stage.mkdir(parents=True)
    try:
      manifest = run_manifest.start(stage, "simulate", run_id, target=str(out))
      summary = _simulate_into(run, stage, run_id, start, progress, report, log)
      _rename_paths(stage, out)
      run_manifest.finish(stage, manifest)
      run_manifest.replace_dir(stage, real_out)
    except BaseException:
      shutil.rmtree(stage, ignore_errors=True)
      raise
  return summary


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


def _simulate_into(run, out: Path, run_id: str, start: float, progress: bool, report: bool, log):
  from fedmf.privacy import participation_log  # pylint: disable=g-import-not-at-top

  config = run.config
  outputs.write_json(out / "config.json", {**config_record(config), "run_id": run_id})
  outputs.write_json(out / run_dir.PLAN_FILE, {**plan_record(run), "run_id": run_id})
  # The strategy the noise comes from, so that `fedmf audit OUT` needs no flags.
  strategies.save_strategy(run.plan.strategy, out / run_dir.STRATEGY_FILE)
  for line in describe_plan(run):
    log(line)
  initial = run.task.evaluate(run.server.weights)
  log(f"initial test accuracy {initial['accuracy']:.4f} ({run.task.accuracy_note})")
  metrics = outputs.MetricsWriter(out)
  bar = outputs.Progress(config.rounds, enabled=progress, every=config.eval_every)
  records: list[loop.RoundRecord] = []
  last_eval = dict(initial)
  try:
    with participation_log.ParticipationLogWriter(out / "participation.csv") as log_writer:
      for r in range(config.rounds):
        cohort = loop.draw_cohort(run, r)
        record = loop.train_round(run, cohort)
        log_writer.write_round(r, [run.task.client_id(int(i)) for i in cohort.clients])
        if loop.is_eval_round(config, r):
          last_eval = loop.evaluate(run, record)
        records.append(record)
        metrics.write(record.to_dict())
        fields = {
          "loss": f"{record.loss:.3f}",
          "accuracy": f"{last_eval['accuracy']:.4f}",
          "epsilon": loop.format_epsilon(run.meter.epsilon(r + 1)),
        }
        zeroed = sum(x.zeroed for x in records)
        if zeroed:  # Client updates dropped (non-finite or above zeroing_linf): said, not hidden.
          fields["zeroed"] = str(zeroed)
        bar.update(r, fields)
  except BaseException:
    metrics.abort()
    bar.close()
    raise
  finally:
    if run.noise is not None:
      run.noise.close()
  metrics.close()
  bar.close()
  seconds = time.perf_counter() - start
  return finish(
    run, out, records, initial, seconds, report=report, log=log, extra={"run_id": run_id}
  )


def finish(
  run: loop.TrainingRun,
  out: Path,
  records: list[loop.RoundRecord],
  initial: dict[str, float],
  seconds: float,
  *,
  report: bool,
  log=print,
  extra: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
  """Audits the run's participation log and writes audit.json, the report and summary.json."""
  from fedmf.privacy import audit  # pylint: disable=g-import-not-at-top

  c = run.config
  p = run.plan
  rounds_completed = len(records)
  declared = p.schema.with_rounds(max(rounds_completed, 1))
  sampling = declared_sampling(run)
  # σ as accounted; 0 (no DP) is audited for its participation and states no guarantee.
  result = audit.audit_log(
    out / "participation.csv",
    p.strategy,
    p.noise_multiplier,
    c.delta,
    rounds=max(rounds_completed, 1),
    min_sep=declared.min_sep,
    max_participations=declared.max_participations,
    progress=False,
    curve="every-round" if report else False,  # the meter's ε, round by round
    notes=run_dir.plan_notes(plan_record(run), sampling_audited=sampling is not None),
    sampling=sampling,
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
      metrics=run_dir.read_metrics(out, initial_accuracy=initial["accuracy"]),
    )
  else:
    outputs.write_json(out / "audit.json", audit_dict)
  # The final accuracy is the final model's: the last round's evaluation, or, when the last round
  # was not an evaluation round (a budget stop of `fedmf train`), the model evaluated now.
  final_accuracy = final_loss = None
  if records and records[-1].accuracy is not None:
    final_accuracy, final_loss = records[-1].accuracy, records[-1].test_loss
  elif records:
    final = run.task.evaluate(run.server.weights)
    final_accuracy, final_loss = final["accuracy"], final["loss"]
  counts = result.violation_counts()
  summary = {
    "rounds": c.rounds,
    "rounds_completed": rounds_completed,
    "task": c.task,
    "model": c.model,
    "strategy": p.strategy.describe(),
    "participation": run.participation.describe(),
    "clients_per_round": c.clients_per_round,
    "num_clients": run.task.num_clients,
    "noise_multiplier": p.noise_multiplier,
    "training_noise_multiplier": p.training_noise_multiplier,
    "planned_epsilon": p.epsilon,
    "delta": c.delta,
    "accounting": p.accounting,
    "initial_test_accuracy": initial["accuracy"],
    "final_test_accuracy": final_accuracy,
    "final_test_loss": final_loss,
    "accuracy_note": run.task.accuracy_note,
    "refused_checkins": int(sum(r.refused_checkins for r in records)),
    "early_checkins_admitted": int(sum(r.early_admitted for r in records)),
    "clipped_updates": int(sum(r.clipped for r in records)),
    "zeroed_updates": int(sum(r.zeroed for r in records)),
    "violations": int(sum(counts.values())),
    "violation_counts": counts,
    "median_round_seconds": _median([r.round_seconds for r in records]),
    "seconds": seconds,
    "audit": {
      "observed_min_sep": audit_dict.get("observed_min_sep"),
      "observed_max_participations": audit_dict.get("observed_max_participations"),
      "sensitivity": audit_dict.get("sensitivity"),
      "sensitivity_method": audit_dict.get("sensitivity_method"),
      "rho": audit_dict.get("rho"),
      "epsilon": audit_dict.get("epsilon"),
      "delta": c.delta,
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
    },
    **(extra or {}),
  }
  if c.reference_clients_per_round is not None:
    summary["cheap_simulation"] = plan_record(run)["cheap_simulation"]
  outputs.write_json(out / "summary.json", summary)
  return summary


def declared_sampling(run: loop.TrainingRun):
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
