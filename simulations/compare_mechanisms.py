#!/usr/bin/env python3
"""Which mechanism gives the best model at a given privacy level? DP-SGD, TreeAgg, BandMF and BLT.

Trains each arm (a mechanism, or a variant of one) at the same target ε on the same task and
participation model, each with its noise calibrated for its own sensitivity under the declared
schema, for several seeds. Every run is a resumable `fedmf train` run (fedmf.program.train): an
interrupted comparison started again with the same arguments resumes each unfinished run from its
last checkpoint and keeps the finished ones, also those recorded finished in OUT/results.json whose
directories are gone (trained on another machine: copy results.json into OUT). OUT holds:

  runs/LABEL/ARM-seedS/   every run's ROOT (config.json, metrics.csv, strategy.json, audit, ...),
                          and code.json: the commit of each checkout that trained it
  logs/LABEL/ARM-seedS.log  each run's console output (with --jobs > 1)
  strategies/             strategy files of the arms that need one (e.g. blt-k1-2)
  results.json            every run of every LABEL in OUT: its config, σ, the strategy's analytic
                          MaxLoss and RmsLoss, final and end-of-training accuracy, and every
                          round's metrics (see `comparison_results.collect`); the runs of the
                          previous results.json whose directories are gone (another machine)
                          are kept
  results.md              the tables per LABEL: mean ± std over seeds, and each arm's gap to
                          BandMF paired by seed (end and second-half accuracy, last-100-round loss)
  accuracy-LABEL.png      test accuracy per evaluation, mean over seeds, one line per arm

  python simulations/compare_mechanisms.py --out OUT [--label LABEL] [--seeds 0,1,2]
      [--epsilon 8] [--arms dpsgd,tree,bandmf,blt] [--config FILE] [--set KEY=VALUE ...]
      [--setting LABEL:KEY=VALUE,... ...] [--jobs J] [--end-evaluations M] [--collect-only]

Arms: dpsgd, tree (online-Honaker decoder), bandmf (b̂ = min-sep), bandmf-B (b̂ = B), blt
(automatic buffers), blt-D (D buffers), blt-kK-D (a D-buffer BLT optimized for K participations
under the run's (n, b), trained and accounted under the run's declared schema, as BLT Table 3's
"k = 1" BLTs). `--mechanisms` is a synonym of `--arms`.

--jobs J > 1 runs J trainings at once, each in its own `fedmf train` process (started with this
script's niceness); the file OUT/jobs, if present, overrides J while the script runs. A run that
fails is retried once (it resumes), then reported and skipped.

End-of-training accuracy is the papers' average over nearby rounds (BLT Table 4: r ± 50): the mean
of the last M evaluations (default 4: with eval_every 50 and n = 2052, rounds 1950, 2000, 2050 and
2052).

The papers (BandMF §6, BLT §5 Table 3) predict BandMF ≳ BLT (k = 6) > TreeAgg, BLT (k = 1) > DP-SGD
without amplification.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The results half (results.json, tables, plots) is its own module beside this script: Python puts
# a script's directory first on sys.path, as tests.helpers.load_script does.
from comparison_results import CODE_FILE
from comparison_results import code_version
from comparison_results import collect
from comparison_results import keep_vanished
from comparison_results import paired_table
from comparison_results import plot
from comparison_results import progress_table
from comparison_results import read_results
from comparison_results import table
from comparison_results import trained_by
from comparison_results import write_results


# ---------------------------------------------------------------------------------------------
# Arms.


def arm_overrides(arm: str, out: Path, config) -> list[str]:
  """Config overrides of an arm (see the module docstring); may write a strategy file into OUT."""
  if arm in ("dpsgd", "tree", "bandmf", "blt"):
    return [f"mechanism={arm}"]
  m = re.fullmatch(r"bandmf-(\d+)", arm)
  if m:
    return ["mechanism=bandmf", f"bands={int(m.group(1))}"]
  m = re.fullmatch(r"blt-(\d+)", arm)
  if m:
    return ["mechanism=blt", f"buffers={int(m.group(1))}"]
  m = re.fullmatch(r"blt-k(\d+)-(\d+)", arm)
  if m:
    path = _blt_for_participations(
      out, config.program.rounds, config.participation.min_sep, int(m.group(1)), int(m.group(2))
    )
    return [f"strategy={path}"]
  raise SystemExit(f"compare_mechanisms.py: unknown arm {arm!r} (see --help)")


def _blt_for_participations(out: Path, n: int, min_sep: int, k: int, buffers: int) -> Path:
  """A `buffers`-buffer BLT optimized (MaxLoss, seed 0) for (n, b, k), saved once in OUT."""
  from fedmf.mf import strategies
  from fedmf.mf import strategy_cache
  from fedmf.mf.schema import ParticipationSchema
  from fedmf.mf.strategy import OptimizeOptions

  path = out / "strategies" / f"blt-n{n}-b{min_sep}-k{k}-{buffers}buffers.json"
  if not path.is_file():
    schema = ParticipationSchema(n, min_sep, k)
    strategy = strategy_cache.optimize_cached(
      "blt", schema, OptimizeOptions(buffers=buffers, seed=0), strategy_cache.cache_dir()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    strategies.save_strategy(
      strategy,
      path,
      optimized_for={"n": n, "min_sep": min_sep, "max_participations": k, "workload": "prefix"},
    )
  return path.resolve()


# ---------------------------------------------------------------------------------------------
# Runs.


def parse_settings(args) -> list[tuple[str, list[str]]]:
  """[(label, overrides)]: each --setting LABEL[:KEY=VALUE,...], or the one --label."""
  if not args.settings:
    return [(args.label, [])]
  out = []
  for spec in args.settings:
    label, _, rest = spec.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
      raise SystemExit(f"compare_mechanisms.py: bad --setting label {label!r}")
    out.append((label, [item for item in rest.split(",") if item]))
  return out


def run_overrides(args, arm: str, seed: int, out: Path, base: str, extra=()) -> list[str]:
  from fedmf.program.config import load_config

  from fedmf.config_parse import give_way

  # The script's seeds and arm settings win over the user's --set of the same key.
  common = give_way(
    give_way(args.overrides, extra),
    [
      f"seed={seed}",
      f"noise_seed={1000 + seed}",
      f"target_epsilon={args.epsilon}",
      "noise_multiplier=null",
      "strategy=null",
    ],
  )
  return give_way(common, arm_overrides(arm, out, load_config(base, common)))


def _finished(run_dir: Path, config_dict: dict) -> bool:
  """True if `run_dir` holds a finished run of exactly this config; refuses another config."""
  try:
    stored = json.loads((run_dir / "config.json").read_text())
  except (OSError, ValueError):
    return False
  if _as_stored(stored) != _as_stored(config_dict):
    raise SystemExit(
      f"compare_mechanisms.py: {run_dir} holds a run of another config; use another --out"
    )
  try:
    summary = json.loads((run_dir / "summary.json").read_text())
    manifest = json.loads((run_dir / "run.json").read_text())
  except (OSError, ValueError):
    return False
  return (
    summary.get("rounds_completed") == config_dict["rounds"]
    and manifest.get("finished") is not None
  )


def _recorded_finished(results) -> dict[tuple[str, str, int], dict[str, Any]]:
  """The finished runs of OUT's results.json by (label, arm, seed): on another machine their
  directories are gone, and training them again would cost hours for the same record."""
  if not results or not isinstance(results.get("runs"), list):
    return {}
  return {
    (r.get("label"), r.get("arm"), r.get("seed")): r
    for r in results["runs"]
    if isinstance(r, dict) and r.get("finished") is True
  }


def _as_stored(config_dict: dict) -> dict:
  """A run's flat config as config.json holds it (JSON types), without its run id."""
  config = json.loads(json.dumps(config_dict))
  config.pop("run_id", None)
  return config


def _comparable(config_dict: dict) -> dict:
  """`_as_stored`, with a strategy file named by its file name: a strategy written into OUT
  (blt-kK-D) has another path on another machine."""
  config = _as_stored(config_dict)
  if isinstance(config.get("strategy"), str):
    config["strategy"] = Path(config["strategy"]).name
  return config


def _check_recorded_config(record: dict[str, Any], config_dict: dict, run_dir: Path) -> None:
  """Refuses a results.json record of `run_dir`'s run whose config is not this run's."""
  stored = record.get("config")
  stored = _comparable(stored) if isinstance(stored, dict) else {}
  wanted = _comparable(config_dict)
  differing = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
  if differing:
    raise SystemExit(
      f"compare_mechanisms.py: results.json records {run_dir.parent.name}/{run_dir.name} with "
      f"another config ({', '.join(differing[:5])}); use another --out"
    )


def _locked_elsewhere(run_dir: Path) -> bool:
  """True if another `fedmf train` process holds the run's ROOT lock (it is running there)."""
  import fcntl  # pylint: disable=g-import-not-at-top

  try:
    with open(run_dir / ".lock") as lock:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError:
        return True
      fcntl.flock(lock, fcntl.LOCK_UN)
  except OSError:
    pass
  return False


def _job_slots(out: Path, default: int) -> int:
  try:
    return max(1, int((out / "jobs").read_text().strip()))
  except (OSError, ValueError):
    return default


def record_launch(run_dir: Path) -> None:
  """Adds this checkout's code version to RUN_DIR/code.json unless it is the last one there: a
  run's record says which code trained it, also after its directory has gone (results.json)."""
  from fedmf import atomic_files

  versions = trained_by(run_dir)
  here = code_version()
  if not versions or versions[-1] != here:
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_files.write_text(
      run_dir / CODE_FILE, json.dumps({"trained_by": [*versions, here]}) + "\n"
    )


def train_all(args, out: Path, base: str, plan: list[tuple[str, list[str], int, str]]) -> list[str]:
  """Runs (or resumes) every (label, setting overrides, seed, arm) of `plan`, in its order;
  returns the failures."""
  from fedmf.program.config import load_config

  recorded = _recorded_finished(read_results(out / "results.json"))
  todo = []
  for label, extra, seed, arm in plan:
    overrides = run_overrides(args, arm, seed, out, base, extra)
    config = load_config(base, overrides)
    run_dir = out / "runs" / label / f"{arm}-seed{seed}"
    if _finished(run_dir, config.to_dict()):
      print(f"  finished: {run_dir}", file=sys.stderr)
      continue
    record = recorded.get((label, arm, seed))
    if record is not None and not (run_dir / "config.json").exists():
      _check_recorded_config(record, config.to_dict(), run_dir)
      print(f"  finished (in results.json, trained elsewhere): {run_dir}", file=sys.stderr)
      continue
    if _locked_elsewhere(run_dir):  # e.g. started by an earlier invocation that was stopped
      print(f"  running in another process, not waited for: {run_dir}", file=sys.stderr)
      continue
    todo.append((run_dir, config, overrides))
  failures = []
  if args.jobs <= 1:
    from fedmf.program.train import run_training

    for run_dir, config, _ in todo:
      record_launch(run_dir)
      run_training(
        config, run_dir, progress=False, log=lambda line: print(f"  {line}", file=sys.stderr)
      )
    return failures
  running: dict[Any, tuple] = {}
  attempts: dict[Path, int] = {}
  queue = list(todo)
  while queue or running:
    while queue and len(running) < _job_slots(out, args.jobs):
      run_dir, config, overrides = queue.pop(0)
      record_launch(run_dir)
      log_path = out / "logs" / run_dir.parent.name / f"{run_dir.name}.log"
      log_path.parent.mkdir(parents=True, exist_ok=True)
      cmd = [
        sys.executable,
        "-m",
        "fedmf.cli.main",
        "train",
        "--config",
        base,
        "--root",
        str(run_dir),
      ]
      for item in overrides:
        cmd += ["--set", item]
      cmd.append("--no-progress")
      with open(log_path, "a") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
      running[proc] = (run_dir, config, overrides)
      attempts[run_dir] = attempts.get(run_dir, 0) + 1
      print(
        f"  started {run_dir} (pid {proc.pid}, attempt {attempts[run_dir]})",
        file=sys.stderr,
        flush=True,
      )
    time.sleep(5)
    for proc in [p for p in running if p.poll() is not None]:
      item = running.pop(proc)
      if proc.returncode == 0:
        print(f"  done {item[0]}", file=sys.stderr, flush=True)
      elif attempts[item[0]] < 2:
        print(f"  {item[0]} exited {proc.returncode}; resuming it", file=sys.stderr, flush=True)
        queue.insert(0, item)
      else:
        print(f"  {item[0]} failed twice (exit {proc.returncode}); see its log", file=sys.stderr)
        failures.append(str(item[0]))
  return failures


def replay(record: dict[str, Any], rounds: int) -> dict[str, Any]:
  """Re-runs the first `rounds` rounds of a results.json run from its recorded config (its seeds
  included) and its recorded σ: every round's training loss and the evaluations among them, to
  compare with the record's `metrics` (the check of tests/program/test_papers_results.py).

  σ is the run's, not recalibrated: a later calibrator may land a few 1e-4 away (issue 39's one
  calibrator moved 1.54579 to 1.54564), which would change every noisy round after the first."""
  from fedmf.program import platform
  from fedmf.program import training_run
  from fedmf.program.config import config_from_dict

  raw = dict(record["config"])  # config.json's flat keys
  if record.get("noise_multiplier") is not None:
    raw["noise_multiplier"] = record["noise_multiplier"]
  config = config_from_dict(raw)
  losses, accuracy = [], {}
  with platform.execution(config.platform, concurrent_clients=config.concurrent_clients) as pool:
    run = training_run.build_run(config, pool=pool)
    try:
      for r in range(rounds):
        run.data_iterator.select()
        result = training_run.train_round(run, run.data_iterator.last_cohort)
        losses.append(float(result.loss))
        if config.program.is_eval_round(r):
          accuracy[r] = float(training_run.evaluate(run, result)["accuracy"])
    finally:
      if run.noise is not None:
        run.noise.close()
  return {"loss": losses, "accuracy": accuracy, "noise_multiplier": run.plan.noise_multiplier}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--out", required=True)
  parser.add_argument("--label", default="default", help="the setting's name (runs/LABEL/)")
  parser.add_argument(
    "--setting",
    dest="settings",
    action="append",
    default=[],
    metavar="LABEL[:KEY=VALUE,...]",
    help="a setting: its label and its own overrides (repeatable; replaces --label). Runs go "
    "seed by seed: every setting's arms for the first seed, then the next seed",
  )
  parser.add_argument("--config", default=None, help="base config (default: the default config)")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument(
    "--order",
    metavar="LABEL:SEED,...",
    help="the (setting, seed) pairs to run, in this order (default: every setting for each seed, "
    "seed by seed)",
  )
  parser.add_argument("--epsilon", type=float, default=8.0)
  parser.add_argument("--arms", "--mechanisms", dest="arms", default="dpsgd,tree,bandmf,blt")
  parser.add_argument("--jobs", type=int, default=1, help="trainings at once (subprocesses)")
  parser.add_argument("--end-evaluations", type=int, default=4)
  parser.add_argument("--collect-only", action="store_true", help="only rebuild the results")
  args = parser.parse_args(argv)

  from fedmf.cli.simulate import default_config_path

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  arms = args.arms.split(",")
  base = args.config or str(default_config_path())
  failures = []
  if not args.collect_only:
    settings = dict(parse_settings(args))
    if args.order:
      pairs = [item.rsplit(":", 1) for item in args.order.split(",")]
      unknown = [label for label, _ in pairs if label not in settings]
      if unknown:
        raise SystemExit(f"compare_mechanisms.py: --order names no --setting {unknown[0]!r}")
      order = [(label, int(seed)) for label, seed in pairs]
    else:
      order = [(label, seed) for seed in seeds for label in settings]
    plan = [(label, settings[label], seed, arm) for label, seed in order for arm in arms]
    failures = train_all(args, out, base, plan)
  results = keep_vanished(read_results(out / "results.json"), collect(out, args.end_evaluations))
  write_results(results, out / "results.json")
  labels = sorted({r["label"] for r in results["runs"]})
  all_arms = list(dict.fromkeys([*arms, *(r["arm"] for r in results["runs"])]))
  lines = []
  for label in labels:
    lines += table(results, label, all_arms)
    rounds = max(r["config"]["rounds"] for r in results["runs"] if r["label"] == label)
    lines += paired_table(results, label, all_arms, late_from=rounds // 2 + 1)
    if not all(r["finished"] for r in results["runs"] if r["label"] == label):
      lines += [f"Unfinished runs of {label}, where all of them have data:", ""]
      lines += progress_table(results, label, all_arms)
    plot(results, label, all_arms, out / f"accuracy-{label}.png")
  (out / "results.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  if failures:
    print("failed runs: " + ", ".join(failures), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
