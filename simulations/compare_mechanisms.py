#!/usr/bin/env python3
"""Which mechanism gives the best model at a given privacy level? DP-SGD, TreeAgg, BandMF and BLT.

Trains each arm (a mechanism, or a variant of one) at the same target ε on the same task and
participation model, each with its noise calibrated for its own sensitivity under the declared
schema, for several seeds. Every run is a resumable `fedmf train` run (fedmf.program.train): an
interrupted comparison started again with the same arguments resumes each unfinished run from its
last checkpoint and keeps the finished ones. OUT holds:

  runs/LABEL/ARM-seedS/   every run's ROOT (config.json, metrics.csv, strategy.json, audit, ...)
  logs/LABEL/ARM-seedS.log  each run's console output (with --jobs > 1)
  strategies/             strategy files of the arms that need one (e.g. blt-k1-2)
  results.json            every run of every LABEL in OUT: its config, σ, the strategy's analytic
                          MaxLoss and RmsLoss, final and end-of-training accuracy, and every
                          round's metrics (see `collect`)
  results.md              the table per LABEL: mean ± std over seeds
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
import csv
import hashlib
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

RESULTS_FORMAT = 2
# Per-round columns kept in results.json (metrics.csv has a few more, derived from the config).
ROUND_COLUMNS = ("loss", "clipped", "zeroed", "round_seconds")
EVAL_COLUMNS = ("accuracy", "test_loss")
_STRATEGY_EMBED_BYTES = 20_000  # Small strategies (BLT, tree, DP-SGD) go into results.json whole.


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
  stored.pop("run_id", None)
  if stored != json.loads(json.dumps(config_dict)):
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


def train_all(args, out: Path, base: str, plan: list[tuple[str, list[str], int, str]]) -> list[str]:
  """Runs (or resumes) every (label, setting overrides, seed, arm) of `plan`, in its order;
  returns the failures."""
  from fedmf.program.config import load_config

  todo = []
  for label, extra, seed, arm in plan:
    overrides = run_overrides(args, arm, seed, out, base, extra)
    config = load_config(base, overrides)
    run_dir = out / "runs" / label / f"{arm}-seed{seed}"
    if _finished(run_dir, config.to_dict()):
      print(f"  finished: {run_dir}", file=sys.stderr)
      continue
    if _locked_elsewhere(run_dir):  # e.g. started by an earlier invocation that was stopped
      print(f"  running in another process, not waited for: {run_dir}", file=sys.stderr)
      continue
    todo.append((run_dir, config, overrides))
  failures = []
  if args.jobs <= 1:
    from fedmf.program.train import run_training

    for run_dir, config, _ in todo:
      run_dir.parent.mkdir(parents=True, exist_ok=True)
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
      run_dir.parent.mkdir(parents=True, exist_ok=True)
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


# ---------------------------------------------------------------------------------------------
# Results.


def _number(text: str) -> Optional[float]:
  if text in ("", "None", None):
    return None
  return float(text)


def read_metrics(run_dir: Path) -> dict[str, list]:
  """metrics.csv as columns: every round's ROUND_COLUMNS, and EVAL_COLUMNS on evaluated rounds."""
  rounds, cols = [], {k: [] for k in ROUND_COLUMNS}
  evals = {"round": [], **{k: [] for k in EVAL_COLUMNS}}
  with open(run_dir / "metrics.csv", newline="") as f:
    for row in csv.DictReader(f):
      r = int(float(row["round"]))
      rounds.append(r)
      for k in ROUND_COLUMNS:
        v = _number(row.get(k))
        cols[k].append(None if v is None else (int(v) if k in ("clipped", "zeroed") else v))
      if _number(row.get("accuracy")) is not None:
        evals["round"].append(r)
        for k in EVAL_COLUMNS:
          evals[k].append(_number(row.get(k)))
  # float32 values: 9 significant digits round-trip them; seconds to the centisecond.
  cols["loss"] = [None if v is None else float(f"{v:.9g}") for v in cols["loss"]]
  cols["round_seconds"] = [None if v is None else round(v, 2) for v in cols["round_seconds"]]
  for k in EVAL_COLUMNS:
    evals[k] = [None if v is None else float(f"{v:.9g}") for v in evals[k]]
  return {"round": rounds, **cols, "evaluations": evals}


def analytic_losses(strategy_path: Path, n: int, b: int, k: int, cache: dict) -> dict[str, Any]:
  """MaxLoss and RmsLoss (unsquared, sensitivity included) of the run's strategy under (n, b, k)."""
  digest = hashlib.sha256(strategy_path.read_bytes()).hexdigest()
  key = (digest, n, b, k)
  if key not in cache:
    from fedmf.mf import evaluation
    from fedmf.mf import strategies

    ev = evaluation.evaluate(strategies.load_strategy(strategy_path), n, b, k)
    cache[key] = {
      "max_loss": ev.max_loss,
      "rms_loss": ev.rms_loss,
      "sensitivity": ev.sensitivity,
      "sensitivity_method": ev.sensitivity_method,
      "strategy_sha256": digest,
    }
  return cache[key]


def collect(out: Path, end_evaluations: int) -> dict[str, Any]:
  """results.json of every run under OUT/runs (finished or not: `rounds_completed` says)."""
  records, cache = [], {}
  for run_dir in sorted((out / "runs").glob("*/*-seed*")):
    if not (run_dir / "metrics.csv").is_file():
      continue
    config = json.loads((run_dir / "config.json").read_text())
    config.pop("run_id", None)
    plan = json.loads((run_dir / "plan.json").read_text())
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    metrics = read_metrics(run_dir)
    schema = plan["declared_schema"]
    losses = analytic_losses(
      run_dir / "strategy.json", schema["n"], schema["min_sep"], schema["max_participations"], cache
    )
    arm, seed = run_dir.name.rsplit("-seed", 1)
    accuracies = [a for a in metrics["evaluations"]["accuracy"] if a is not None]
    finished = len(metrics["round"]) == config["rounds"] and bool(summary)
    strategy_text = (run_dir / "strategy.json").read_text()
    records.append(
      {
        "label": run_dir.parent.name,
        "arm": arm,
        "seed": int(seed),
        "strategy": plan["strategy"],
        "noise_multiplier": plan["noise_multiplier"],
        "training_noise_multiplier": plan["training_noise_multiplier"],
        "planned_epsilon": plan["epsilon"],
        "audited_epsilon": summary.get("audit", {}).get("epsilon"),
        **losses,
        "rounds_completed": len(metrics["round"]),
        "finished": finished,
        "final_accuracy": accuracies[-1] if finished and accuracies else None,
        "end_accuracy": (
          statistics.fmean(accuracies[-end_evaluations:])
          if finished and len(accuracies) >= end_evaluations
          else None
        ),
        "best_accuracy": max(accuracies) if accuracies else None,
        "initial_accuracy": summary.get("initial_test_accuracy"),
        "seconds": summary.get("seconds"),
        "config": config,
        "strategy_json": (
          json.loads(strategy_text) if len(strategy_text) <= _STRATEGY_EMBED_BYTES else None
        ),
        "metrics": metrics,
      }
    )
  return {
    "format": RESULTS_FORMAT,
    "code": code_version(),
    "end_evaluations": end_evaluations,
    "runs": records,
  }


def code_version() -> dict[str, Any]:
  """The commit of the code that ran (this script's checkout) and whether its tree was clean."""
  root = Path(__file__).resolve().parents[1]
  try:
    commit = subprocess.run(
      ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = bool(
      subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=True,
      ).stdout.strip()
    )
  except (OSError, subprocess.CalledProcessError):
    return {"commit": None, "dirty": None}
  return {"commit": commit, "dirty": dirty}


def write_results(results: dict[str, Any], path: Path) -> None:
  """One run per line: the file diffs run by run and stays readable."""
  lines = [
    "{",
    f' "format": {json.dumps(results["format"])},',
    f' "code": {json.dumps(results["code"])},',
    f' "end_evaluations": {json.dumps(results["end_evaluations"])},',
    ' "runs": [',
  ]
  runs = [json.dumps(r, separators=(",", ":")) for r in results["runs"]]
  lines.append(",\n".join(f"  {r}" for r in runs))
  lines += [" ]", "}"]
  # fedmf's atomic writer: its temporary name carries the pid, so two comparisons sharing OUT (two
  # terminals, one arm each) cannot rename each other's half-written file.
  from fedmf import atomic_files

  atomic_files.write_text(path, "\n".join(lines) + "\n")


def _mean_std(values: list[float]) -> tuple[float, float]:
  if not values:
    return math.nan, math.nan
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def table(results: dict[str, Any], label: str, arms: list[str]) -> list[str]:
  runs = [r for r in results["runs"] if r["label"] == label]
  if not runs:
    return []
  c = runs[0]["config"]
  ref = c.get("reference_clients_per_round")
  lines = [
    f"### {label}",
    "",
    f"{c['task']} task, {c['model']}, {c['rounds']} rounds of {c['clients_per_round']} clients"
    + (f" with the noise of {ref}" if ref else "")
    + f", participation {c['participation']['model']} (b = {c['participation'].get('min_sep')}),"
    f" ε = {c['target_epsilon']:g} at δ = {c['delta']:g}. End accuracy: mean of the last "
    f"{results['end_evaluations']} evaluations; mean ± std over the finished seeds.",
    "",
    "| arm | strategy | σ | sensitivity | MaxLoss | RmsLoss | end accuracy | final accuracy | seeds | audited ε |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for arm in [a for a in arms if any(r["arm"] == a for r in runs)]:
    rows = [r for r in runs if r["arm"] == arm]
    done = [r for r in rows if r["finished"]]
    end = _mean_std([r["end_accuracy"] for r in done if r["end_accuracy"] is not None])
    final = _mean_std([r["final_accuracy"] for r in done if r["final_accuracy"] is not None])
    audited = [r["audited_epsilon"] for r in done if r["audited_epsilon"] is not None]
    progress = "" if len(done) == len(rows) else f" (+{len(rows) - len(done)} running)"
    r0 = rows[0]
    lines.append(
      f"| {arm} | {r0['strategy']} | {r0['noise_multiplier']:.4g} | {r0['sensitivity']:.4g} | "
      f"{r0['max_loss']:.2f} | {r0['rms_loss']:.2f} | {end[0]:.4f} ± {end[1]:.4f} | "
      f"{final[0]:.4f} ± {final[1]:.4f} | {len(done)}{progress} | "
      f"{max(audited) if audited else math.nan:.4g} |"
    )
  return lines + [""]


def progress_table(
  results: dict[str, Any], label: str, arms: list[str], window: int = 10
) -> list[str]:
  """Unfinished runs of LABEL side by side: per run, the rounds done, the round a rerun resumes
  from (its last checkpoint), the test accuracy at every evaluation any run has (blank where the
  run has not reached it), the mean training loss over the last `window` rounds every run has,
  and the strategy's σ and analytic MaxLoss and RmsLoss. Numbers from results.json only, nothing
  extrapolated."""
  runs = [r for r in results["runs"] if r["label"] == label]
  runs = sorted(
    runs, key=lambda r: (arms.index(r["arm"]) if r["arm"] in arms else len(arms), r["seed"])
  )
  if not runs:
    return []
  evals = [
    dict(zip(r["metrics"]["evaluations"]["round"], r["metrics"]["evaluations"]["accuracy"]))
    for r in runs
  ]
  eval_rounds = sorted(set().union(*evals))
  common_rounds = min(r["rounds_completed"] for r in runs)
  lo = max(0, common_rounds - window)
  lines = [
    "| arm | seed | rounds done | resumes from | "
    + "".join(f"acc. r{k + 1} | " for k in eval_rounds)
    + f"train loss r{lo + 1}–{common_rounds} | σ | MaxLoss | RmsLoss |",
    "|---|---|---|---|" + "---|" * len(eval_rounds) + "---|---|---|---|",
  ]
  for r, e in zip(runs, evals):
    every = r["config"].get("checkpoint_every") or 1
    resumes = r["rounds_completed"] // every * every
    accs = "".join(f"{e[k]:.4f} | " if k in e else " | " for k in eval_rounds)
    losses = [x for x in r["metrics"]["loss"][lo:common_rounds] if x is not None]
    loss = f"{statistics.fmean(losses):.4f}" if losses else "—"
    lines.append(
      f"| {r['arm']} | {r['seed']} | {r['rounds_completed']} | {resumes} | {accs}{loss} | "
      f"{r['noise_multiplier']:.5g} | {r['max_loss']:.2f} | {r['rms_loss']:.2f} |"
    )
  return lines + [""]


def _moving_mean(values: list, window: int) -> tuple[list[int], list[float]]:
  """(1-based rounds, mean of the last `window` rounds' values) for each round with a full window
  of finite values (a training loss can be missing in a round that zeroed every update)."""
  rounds, means = [], []
  for end in range(window, len(values) + 1):
    chunk = values[end - window : end]
    if all(v is not None and math.isfinite(v) for v in chunk):
      rounds.append(end)
      means.append(statistics.fmean(chunk))
  return rounds, means


def plot(
  results: dict[str, Any], label: str, arms: list[str], path: Path, loss_window: int = 50
) -> None:
  """Two panels per LABEL, mean over each arm's seeds: test accuracy at every evaluation all its
  seeds have, and the training loss as a mean over the last `loss_window` rounds (a round's loss
  is that of 20 devices, too noisy alone to compare arms by)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  runs = [r for r in results["runs"] if r["label"] == label]
  fig, (ax, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
  # The loss axis spans the rounds after the first fifth (the early loss is far higher and would
  # flatten the differences between arms).
  late_from = max((r["config"]["rounds"] for r in runs), default=0) // 5
  late: list[float] = []
  for arm in [a for a in arms if any(r["arm"] == a for r in runs)]:
    rows = [r for r in runs if r["arm"] == arm]
    curves = [
      dict(zip(r["metrics"]["evaluations"]["round"], r["metrics"]["evaluations"]["accuracy"]))
      for r in rows
    ]
    common = sorted(set.intersection(*(set(c) for c in curves)))
    means = [statistics.fmean(c[k] for c in curves) for k in common]
    seeds = f"{len(rows)} seed{'s' if len(rows) > 1 else ''}"
    (line,) = ax.plot([k + 1 for k in common], means, marker="o", ms=2, label=f"{arm} ({seeds})")
    rounds_done = min(r["rounds_completed"] for r in rows)
    per_seed = [_moving_mean(r["metrics"]["loss"][:rounds_done], loss_window) for r in rows]
    shared = sorted(set.intersection(*(set(x) for x, _ in per_seed)))
    lookup = [dict(zip(x, y)) for x, y in per_seed]
    loss_means = [statistics.fmean(d[k] for d in lookup) for k in shared]
    ax_loss.plot(shared, loss_means, color=line.get_color(), label=arm)
    late += [v for k, v in zip(shared, loss_means) if k >= late_from]
  ax.set_xlabel("round")
  ax.set_ylabel("test accuracy (excl. pad, OOV, bos, eos)")
  ax.set_title(f"Mechanisms at equal privacy: {label}")
  ax.grid(alpha=0.3)
  ax.legend()
  ax_loss.set_xlabel("round")
  ax_loss.set_ylabel(f"training loss, mean of the last {loss_window} rounds")
  ax_loss.set_title("Training loss")
  if late and max(late) > min(late):  # equal limits would make matplotlib warn and widen them
    span = max(late) - min(late)
    ax_loss.set_ylim(min(late) - 0.05 * span, max(late) + 0.05 * span)
  ax_loss.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


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
  results = collect(out, args.end_evaluations)
  write_results(results, out / "results.json")
  labels = sorted({r["label"] for r in results["runs"]})
  all_arms = list(dict.fromkeys([*arms, *(r["arm"] for r in results["runs"])]))
  lines = []
  for label in labels:
    lines += table(results, label, all_arms)
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
