#!/usr/bin/env python3
"""The results table of docs/public-features.md: every method at every ε, tuned on validation,
mean ± std of the test metric over the seeds, beside the trivial baselines (global mean, per-item
mean, the DP bias model at the same ε).

Each cell is one `fedmf public-features --tune` run (the commands are printed and kept in
OUT/commands.sh; each run's directory is OUT/METHOD-eps-E, its progress log OUT/METHOD-eps-E.log).
A run whose directory already holds a finished summary is not run again (delete it to redo);
`--no-run` only tabulates what OUT holds.

  nice -n 19 .venv/bin/python benchmarks/public_features_table.py \\
      --config simulations/configs/public-features-ml100k.yaml --data-dir /work/data/ml-100k \\
      --out out/pf-table-ml100k
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

METHODS = ("am-ssp", "dp-als", "dp-cmf", "am-dpsgd", "dp-bias")
FLOORS = {"outer_steps": 1.0, "dim": 1.0}  # values no grid can go below: not an edge to widen


def command(args, method: str, epsilon: str) -> list[str]:
  out = Path(args.out) / f"{method}-eps-{epsilon}"
  argv = [sys.executable, "-m", "fedmf.cli.main", "public-features", "--config", args.config]
  if args.data_dir:
    argv += ["--data-dir", args.data_dir]
  argv += ["--set", f"algorithm={method}", "--set", f"epsilon={epsilon}", "--set"]
  argv += [
    f"seeds={args.seeds}",
    "--set",
    f"baselines={'true' if method == 'dp-bias' else 'false'}",
  ]
  return [*argv, "--tune", "--force", "--max-seconds", str(args.max_seconds), "--out", str(out)]


def cell(summary: dict, key: str) -> str:
  if not summary:
    return "not run"
  mean, std = summary.get(key), summary.get(f"{key}_std")
  if mean is None or not math.isfinite(mean):
    return "diverged"
  return f"{mean:.4f} ± {std:.4f}" if std is not None else f"{mean:.4f}"


def grid_edges(tuning_csv: Path, choice: dict, ignore: tuple[str, ...] = ()) -> list[str]:
  """The axes of `choice` at the lowest or highest value the run's grid tried (booleans and
  one-value axes have no edge to widen; `ignore`: axes without effect, whose value is the first of
  equals): where a wider grid might choose otherwise. Only numeric axes have edges."""
  if not tuning_csv.is_file():
    return []
  with open(tuning_csv, newline="") as f:
    rows = list(csv.DictReader(f))
  edges = []
  for axis, value in choice.items():
    if not isinstance(value, (int, float)) or isinstance(value, bool) or axis in ignore:
      continue  # booleans and words (dpsgd_optimizer) have no order to widen along
    if axis not in (rows[0] if rows else {}):
      continue
    tried = sorted({float(row[axis]) for row in rows})
    at_floor = float(value) == FLOORS.get(axis)
    if len(tried) > 1 and float(value) in (tried[0], tried[-1]) and not at_floor:
      edges.append(f"{axis} {value:g} ({'lowest' if float(value) == tried[0] else 'highest'})")
  return edges


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True)
  parser.add_argument("--data-dir")
  parser.add_argument("--out", required=True)
  parser.add_argument("--epsilons", default="1,5,20,inf")
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--metric", default="test_rmse")
  parser.add_argument("--max-seconds", type=float, default=36000.0, help="per run (estimated)")
  parser.add_argument(
    "--no-run", action="store_true", help="only tabulate the finished runs in OUT (others: not run)"
  )
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  epsilons, methods = args.epsilons.split(","), args.methods.split(",")
  commands, failed = [], []
  for epsilon in epsilons:
    for method in methods:
      argv_run = command(args, method, epsilon)
      commands.append(shlex.join(argv_run))
      run_dir = Path(argv_run[-1])
      if (run_dir / "summary.json").is_file() or args.no_run:
        continue
      print(f"running: {commands[-1]}", file=sys.stderr, flush=True)
      with open(out / f"{method}-eps-{epsilon}.log", "w") as log:
        code = subprocess.run(argv_run, stdout=subprocess.DEVNULL, stderr=log).returncode
      if code:
        failed.append(f"{method} ε = {epsilon}")
        print(f"  failed (exit {code}): see {log.name}", file=sys.stderr, flush=True)
  (out / "commands.sh").write_text("\n".join(commands) + "\n")
  head = "| method | " + " | ".join(f"ε = {e}" for e in epsilons) + " |"
  lines = [head, "|---" * (len(epsilons) + 1) + "|"]
  summaries = {}
  for method in methods:
    for epsilon in epsilons:
      path = out / f"{method}-eps-{epsilon}" / "summary.json"
      summaries[method, epsilon] = json.loads(path.read_text()) if path.is_file() else {}
  for method in methods:
    cells = [cell(summaries[method, e], args.metric) for e in epsilons]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  for name, key in (
    ("global mean (non-private)", "global_mean"),
    ("per-item mean (non-private)", "item_mean"),
  ):
    for epsilon in epsilons:
      base = summaries.get(("dp-bias", epsilon), {}).get("baselines", {}).get(key)
      if base:
        lines.append(f"| {name} | " + " | ".join([cell(base, args.metric)] * len(epsilons)) + " |")
        break
  chosen = [
    "",
    "Chosen on validation (per method and ε; axes whose chosen value is the lowest or",
    "",
  ]
  chosen[1] += " highest the run tried, from its tuning.csv, are named):"
  for (method, epsilon), summary in summaries.items():
    if summary.get("chosen") is not None:
      line = f"- {method}, ε = {epsilon}: {json.dumps(summary['chosen'])}"
      # Without noise reg_noise has no effect (tuning.no_noise_key): its value is the first.
      ignore = ("reg_noise",) if summary.get("private") is False else ()
      edges = grid_edges(out / f"{method}-eps-{epsilon}" / "tuning.csv", summary["chosen"], ignore)
      chosen.append(line + (f"; at the grid's edge: {', '.join(edges)}" if edges else ""))
  text = "\n".join(lines + chosen) + "\n"
  (out / "results.md").write_text(text)
  print(text)
  if failed:  # the table is written either way; the exit code says a cell is missing
    print(f"failed: {', '.join(failed)} (see their logs in {out})", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
