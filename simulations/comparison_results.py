"""The results of `compare_mechanisms.py`: every run of an OUT directory collected into results.json,
and the tables and plots made from it.

  collect(OUT, M)        every run under OUT/runs, finished or not: config, σ, the strategy's
                         analytic MaxLoss and RmsLoss, accuracies, every round's metrics and the
                         code that trained it
  keep_vanished          with the runs of an earlier results.json whose directories are gone
  write_results          results.json, one run per line
  table, progress_table  markdown tables of one setting (finished runs over seeds; runs side by side)
  paired_table           finished runs over seeds, each arm's gap to a reference arm paired by seed
  plot                   test accuracy and the moving-mean training loss per arm

Kept apart from the script that runs the trainings: one reads run directories, the other makes them.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import statistics
import subprocess
from pathlib import Path
from typing import Any, Optional

# 3: each run names the code that trained it (`trained_by`), and a results.json keeps the runs of
# the previous one whose directories are gone. 2: one `code` for the whole file.
RESULTS_FORMAT = 3
# Written by compare_mechanisms.py into a run's directory at every launch (see `trained_by`).
CODE_FILE = "code.json"
# Per-round columns kept in results.json (metrics.csv has a few more, derived from the config).
ROUND_COLUMNS = ("loss", "clipped", "zeroed", "round_seconds")
EVAL_COLUMNS = ("accuracy", "test_loss")
_STRATEGY_EMBED_BYTES = 20_000  # Small strategies (BLT, tree, DP-SGD) go into results.json whole.


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
  here = code_version()
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
        **_accuracies(metrics, finished, end_evaluations),
        "initial_accuracy": summary.get("initial_test_accuracy"),
        "seconds": summary.get("seconds"),
        "config": config,
        "strategy_json": (
          json.loads(strategy_text) if len(strategy_text) <= _STRATEGY_EMBED_BYTES else None
        ),
        "metrics": metrics,
        # Launched before code.json existed: the collecting checkout is the best one can say.
        "trained_by": trained_by(run_dir) or [here],
      }
    )
  return {
    "format": RESULTS_FORMAT,
    "code": here,  # the code that collected; each run's own is its `trained_by`
    "end_evaluations": end_evaluations,
    "runs": records,
  }


def _accuracies(metrics: dict[str, Any], finished: bool, end_evaluations: int) -> dict[str, Any]:
  """Final (last evaluation), end (the papers' mean over the last M evaluations, BLT Table 4) and
  best test accuracy of a run's metrics; final and end only once the run has finished."""
  accuracies = [a for a in metrics["evaluations"]["accuracy"] if a is not None]
  return {
    "final_accuracy": accuracies[-1] if finished and accuracies else None,
    "end_accuracy": (
      statistics.fmean(accuracies[-end_evaluations:])
      if finished and len(accuracies) >= end_evaluations
      else None
    ),
    "best_accuracy": max(accuracies) if accuracies else None,
  }


def trained_by(run_dir: Path) -> list[dict[str, Any]]:
  """The code versions that trained RUN_DIR, in launch order (more than one if it was resumed by
  other code), from its code.json; [] if it has none."""
  try:
    return json.loads((run_dir / CODE_FILE).read_text())["trained_by"]
  except FileNotFoundError:
    return []
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise SystemExit(f"comparison_results: {run_dir / CODE_FILE} is unreadable ({e})") from None


def keep_vanished(previous: Optional[dict[str, Any]], current: dict[str, Any]) -> dict[str, Any]:
  """CURRENT (a `collect`) with every run of PREVIOUS (the results.json it replaces) that has no
  directory any more: run directories live on one machine, and a comparison spans several (a run
  directory, where present, always wins). Kept runs of a format-2 file are `trained_by` its one
  `code`; their end accuracy is recomputed for CURRENT's number of end evaluations."""
  if not previous:
    return current
  if not isinstance(previous.get("runs"), list):
    raise SystemExit("comparison_results: the previous results.json has no list of runs")
  present = {(r["label"], r["arm"], r["seed"]) for r in current["runs"]}
  legacy = [previous["code"]] if previous.get("format") == 2 and previous.get("code") else []
  kept = []
  for record in previous["runs"]:
    try:
      if (record["label"], record["arm"], record["seed"]) in present:
        continue
      record = {
        **record,
        **_accuracies(record["metrics"], record["finished"], current["end_evaluations"]),
      }
    except (KeyError, TypeError) as e:
      raise SystemExit(
        f"comparison_results: a run of the previous results.json lacks {e}"
      ) from None
    record.setdefault("trained_by", legacy)
    kept.append(record)
  runs = sorted(current["runs"] + kept, key=lambda r: (r["label"], r["arm"], r["seed"]))
  return {**current, "runs": runs}


def read_results(path: Path) -> Optional[dict[str, Any]]:
  """A results.json, or None if there is none; a malformed one is refused in one line."""
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise SystemExit(f"comparison_results: {path} is not a results.json ({e})") from None


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


def paired_table(
  results: dict[str, Any],
  label: str,
  arms: list[str],
  reference: str = "bandmf",
  late_from: int = 1000,
  loss_window: int = 100,
) -> list[str]:
  """Finished runs of LABEL over seeds, each arm beside REFERENCE: per arm, mean ± std over the
  seeds both finished of the end accuracy, the mean accuracy of the evaluations from round
  LATE_FROM on (1-based), the mean training loss of the last LOSS_WINDOW rounds, and each one's
  paired gap (the arm minus REFERENCE in the same seed: the runs of a seed share data, cohorts and
  noise seed, so the gap is free of the seed-to-seed spread the columns themselves carry)."""
  runs = {
    (r["arm"], r["seed"]): r for r in results["runs"] if r["label"] == label and r["finished"]
  }
  seeds = sorted(s for a, s in runs if a == reference)
  if not seeds:
    return []

  def measures(r: dict[str, Any]) -> tuple[float, float, float]:
    evals = r["metrics"]["evaluations"]
    late = [a for k, a in zip(evals["round"], evals["accuracy"]) if k + 1 >= late_from]
    losses = [x for x in r["metrics"]["loss"][-loss_window:] if x is not None]
    return (
      r["end_accuracy"],
      statistics.fmean(late) if late else math.nan,
      statistics.fmean(losses) if losses else math.nan,
    )

  def cell(values: list[float], digits: int = 4, sign: str = "") -> str:
    mean, std = _mean_std(values)
    return f"{mean:{sign}.{digits}f} ± {std:.{digits}f}"

  n = runs[(reference, seeds[0])]["rounds_completed"]
  lines = [
    f"| arm | seeds | end acc. | vs {reference} | mean acc. r{late_from}–{n} | vs {reference} | "
    f"train loss, last {loss_window} rounds | vs {reference} | RmsLoss |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for arm in [a for a in arms if any((a, s) in runs for s in seeds)]:
    paired = [s for s in seeds if (arm, s) in runs]
    own = [measures(runs[(arm, s)]) for s in paired]
    ref = [measures(runs[(reference, s)]) for s in paired]
    gaps = [[o[i] - r[i] for o, r in zip(own, ref)] for i in range(3)]
    columns = []
    for i in range(3):
      columns += [cell([o[i] for o in own]), "—" if arm == reference else cell(gaps[i], sign="+")]
    lines.append(
      f"| {arm} | {len(paired)} | {' | '.join(columns)} | {runs[(arm, paired[0])]['rms_loss']:.2f} |"
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
