#!/usr/bin/env python3
"""Fixed clip norms against adaptive clipping, per mechanism, from `compare_mechanisms.py` outputs.

Each ARM is a `simulations/compare_mechanisms.py --out DIR` run of the same setting with one clip
(`--set clip_norm=1.0`, `=10.0`, `=0.1`, `=adaptive`); this script reads their results.json and
runs/*/metrics.csv and prints one markdown table: final test accuracy (mean ± std over seeds) per
mechanism and clip, σ and the audited ε of each, and for the adaptive arm where ζ went (its median
over the last half of the rounds) and how close it tracked the target quantile (the fraction of
clients within ζ_t over the last half of the rounds, from metrics.csv: exact and as released).

  python simulations/clip_comparison.py LABEL=DIR [LABEL=DIR ...] [--target-quantile 0.5]

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
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return f"{statistics.fmean(values):.4f} ± {std:.4f}"


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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("arms", nargs="+", metavar="LABEL=DIR")
  parser.add_argument("--target-quantile", type=float, default=0.5)
  args = parser.parse_args(argv)
  arms = []
  for item in args.arms:
    label, _, directory = item.partition("=")
    if not directory:
      parser.error(f"expected LABEL=DIR, got {item!r}")
    path = Path(directory)
    records = json.loads((path / "results.json").read_text())
    arms.append((label, path, records))
  mechanisms = list(dict.fromkeys(r["mechanism"] for _, _, recs in arms for r in recs))
  head = (
    ["mechanism"]
    + [label for label, _, _ in arms]
    + ["adaptive ζ (last half)", "within ζ_t, last half: exact / released"]
  )
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  notes = []
  for mechanism in mechanisms:
    cells = [mechanism]
    tracking = []
    for label, path, records in arms:
      rows = [r for r in records if r["mechanism"] == mechanism]
      cells.append(_mean_std([r["final_test_accuracy"] for r in rows]))
      for r in rows:
        t = _tracking(path / "runs" / f"{mechanism}-seed{r['seed']}")
        if t is not None:
          tracking.append(t)
        notes.append((label, mechanism, r["seed"], r["noise_multiplier"], r["audited_epsilon"]))
    if tracking:
      cells.append(" / ".join(f"{t['clip']:.3g}" for t in tracking))
      cells.append(" ; ".join(f"{t['exact']:.3f} / {t['noisy']:.3f}" for t in tracking))
    else:
      cells += ["-", "-"]
    lines.append("| " + " | ".join(cells) + " |")
  print("\n".join(lines))
  print()
  sigmas = {}
  for label, mechanism, _, sigma, eps in notes:
    sigmas.setdefault((label, mechanism), set()).add((round(sigma, 6), round(eps, 4)))
  for (label, mechanism), values in sigmas.items():
    text = ", ".join(f"σ {s:.6g} (audited ε {e:.4g})" for s, e in sorted(values))
    print(f"- {label}, {mechanism}: {text}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
