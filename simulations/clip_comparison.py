#!/usr/bin/env python3
"""Fixed clip norms against adaptive clipping, per mechanism, from `compare_mechanisms.py` outputs.

Each ARM is a `simulations/compare_mechanisms.py --out DIR` run of the same setting with one clip
(`--set clip_norm=1.0`, `=10.0`, `=0.1`, `=adaptive`); this script reads their results.json and
runs/LABEL/ARM-seedS/metrics.csv and prints one markdown table: final test accuracy (mean ± std
over the finished seeds; `--accuracy end`: the end-of-training average) per mechanism and clip, σ
and the audited ε of each, and for the adaptive arm where ζ went (its median over the last half of
the rounds) and how close it tracked the target quantile (the fraction of
clients within ζ_t over the last half of the rounds, from metrics.csv: exact and as released).

  python simulations/clip_comparison.py NAME=DIR [NAME=DIR ...] [--label LABEL] [--accuracy end]

e.g. `ζ = 1=out/clip-default-fixed1 ζ = 10=out/clip-default-fixed10 adaptive=out/clip-default-adaptive`.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path


def _mean_std(values: list[float]) -> str:
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return "-"
  if len(values) == 1:
    return f"{values[0]:.4f}"  # One seed: no spread to state.
  return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def _tracking(run_dir: Path) -> dict[str, float] | None:
  """Median ζ and the mean fractions within ζ_t over the last half of the rounds (adaptive runs)."""
  with open(run_dir / "metrics.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  if not rows or "clip_norm" not in rows[0]:
    return None
  half = rows[len(rows) // 2 :]
  exact, noisy, clips = [], [], []
  for r in half:
    clients = int(float(r["clients"]))
    if clients:
      exact.append((clients - int(float(r["clipped"])) - int(float(r["zeroed"]))) / clients)
    if r["unclipped_fraction"]:
      noisy.append(float(r["unclipped_fraction"]))
    clips.append(float(r["clip_norm"]))
  return {
    "exact": statistics.fmean(exact),
    "noisy": statistics.fmean(noisy),
    "clip": statistics.median(clips),
  }


def _runs(path: Path, label: str | None) -> list[dict]:
  """The finished runs of one compare_mechanisms.py OUT (results.json, format 2 or 3), of one label."""
  results_path = path / "results.json"
  if not results_path.is_file():
    raise SystemExit(
      f"clip_comparison.py: error: {results_path} is missing (make it with "
      f"`python simulations/compare_mechanisms.py --out {path} ... --collect-only`)"
    )
  runs = json.loads(results_path.read_text())["runs"]
  labels = sorted({r["label"] for r in runs})
  if label is None and len(labels) > 1:
    raise SystemExit(f"clip_comparison.py: error: {path} holds labels {labels}: pick one, --label")
  return [r for r in runs if r["finished"] and (label is None or r["label"] == label)]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("arms", nargs="+", metavar="NAME=DIR")
  parser.add_argument("--label", help="the compare_mechanisms.py label (setting) to read")
  parser.add_argument(
    "--accuracy",
    choices=("final", "end"),
    default="final",
    help="final: the last evaluation's; end: the mean of the last evaluations (the papers' "
    "average over nearby rounds, compare_mechanisms.py --end-evaluations)",
  )
  args = parser.parse_args(argv)
  arms = []
  for item in args.arms:
    name, _, directory = item.rpartition("=")  # NAME may hold "=" (e.g. "ζ = 1"), as in docs.
    if not name or not directory:
      parser.error(f"expected NAME=DIR, got {item!r}")
    arms.append((name, Path(directory), _runs(Path(directory), args.label)))
  mechanisms = list(dict.fromkeys(r["arm"] for _, _, runs in arms for r in runs))
  head = (
    ["mechanism"]
    + [name for name, _, _ in arms]
    + ["adaptive ζ (last half)", "within ζ_t, last half: exact / released"]
  )
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  notes = []
  for mechanism in mechanisms:
    cells = [mechanism]
    tracking = []
    for name, path, runs in arms:
      rows = sorted((r for r in runs if r["arm"] == mechanism), key=lambda r: r["seed"])
      seeds = ",".join(str(r["seed"]) for r in rows)
      cells.append(
        _mean_std([r[f"{args.accuracy}_accuracy"] for r in rows])
        + (f" (seeds {seeds})" if rows else "")
      )
      for r in rows:
        t = _tracking(path / "runs" / r["label"] / f"{mechanism}-seed{r['seed']}")
        if t is not None:
          tracking.append(t)
        notes.append((name, mechanism, r["noise_multiplier"], r["audited_epsilon"]))
    if tracking:
      cells.append(" / ".join(f"{t['clip']:.3g}" for t in tracking))
      cells.append(" ; ".join(f"{t['exact']:.3f} / {t['noisy']:.3f}" for t in tracking))
    else:
      cells += ["-", "-"]
    lines.append("| " + " | ".join(cells) + " |")
  print("\n".join(lines))
  print()
  sigmas: dict[tuple[str, str], set] = {}
  for name, mechanism, sigma, eps in notes:
    sigmas.setdefault((name, mechanism), set()).add((round(sigma, 6), round(eps, 4)))
  for (name, mechanism), values in sigmas.items():
    text = ", ".join(f"σ {s:.6g} (audited ε {e:.4g})" for s, e in sorted(values))
    print(f"- {name}, {mechanism}: {text}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
