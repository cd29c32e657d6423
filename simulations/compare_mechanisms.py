#!/usr/bin/env python3
"""Which mechanism gives the best model at a given privacy level? DP-SGD, TreeAgg, BandMF and BLT.

Runs `fedmf simulate` for each mechanism at the same target ε on the same task and participation
model (each mechanism's noise calibrated for its own sensitivity under the declared schema), for
several seeds, and writes into OUT:

  results.json   one record per run (final and best test accuracy, σ, audited ε, seconds)
  results.md     the table: mean ± std of the final test accuracy over seeds, per mechanism
  accuracy.png   test accuracy per round, mean over seeds, one line per mechanism
  runs/          every run's own output directory

  python simulations/compare_mechanisms.py --out out/compare [--seeds 0,1,2] [--epsilon 8]
      [--mechanisms dpsgd,tree,bandmf,blt] [--config FILE] [--set KEY=VALUE ...] [--reuse]

--reuse keeps a finished run whose directory holds the same resolved config (config.json) and a
summary.json, so an interrupted or extended comparison (more seeds) only runs what is missing.

The papers (BandMF §6, BLT §5) predict BandMF ≳ BLT > TreeAgg > DP-SGD without amplification.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path


def _accuracy_curve(run_dir: Path) -> dict[int, float]:
  with open(run_dir / "metrics.csv", newline="") as f:
    return {int(r["round"]): float(r["accuracy"]) for r in csv.DictReader(f) if r["accuracy"]}


def _finished_with(run_dir: Path, config: dict) -> bool:
  """True if `run_dir` holds a finished run of exactly this resolved config."""
  try:
    stored = json.loads((run_dir / "config.json").read_text())
    stored.pop("run_id", None)  # Which run wrote it, not part of the config.
    return stored == json.loads(json.dumps(config)) and (run_dir / "summary.json").is_file()
  except (OSError, ValueError):
    return False


def _mean_std(values: list[float]) -> tuple[float, float]:
  if not values:
    return math.nan, math.nan
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--out", required=True)
  parser.add_argument("--config", default=None, help="base config (default: the default config)")
  parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--epsilon", type=float, default=8.0)
  parser.add_argument("--mechanisms", default="dpsgd,tree,bandmf,blt")
  parser.add_argument(
    "--reuse", action="store_true", help="keep finished runs with the same config (see above)"
  )
  args = parser.parse_args(argv)

  from fedmf.cli.simulate import default_config_path
  from fedmf.program.config import load_config
  from fedmf.program.simulate import config_record, run_simulation

  out = Path(args.out)
  (out / "runs").mkdir(parents=True, exist_ok=True)
  seeds = [int(s) for s in args.seeds.split(",")]
  mechanisms = args.mechanisms.split(",")
  base = args.config or str(default_config_path())
  records = []
  for seed in seeds:
    for mechanism in mechanisms:
      run_dir = out / "runs" / f"{mechanism}-seed{seed}"
      config = load_config(
        base,
        [
          *args.overrides,
          f"mechanism={mechanism}",
          f"seed={seed}",
          f"noise_seed={1000 + seed}",
          f"target_epsilon={args.epsilon}",
          "noise_multiplier=null",
          "strategy=null",
        ],
      )
      start = time.perf_counter()
      if args.reuse and _finished_with(run_dir, config_record(config)):
        summary = json.loads((run_dir / "summary.json").read_text())
        print(f"  reusing {run_dir}", file=sys.stderr)
      else:
        summary = run_simulation(
          config,
          run_dir,
          progress=False,
          force=True,
          log=lambda line: print(f"  {line}", file=sys.stderr),
        )
      curve = _accuracy_curve(run_dir)
      records.append(
        {
          "mechanism": mechanism,
          "seed": seed,
          "strategy": summary["strategy"],
          "noise_multiplier": summary["noise_multiplier"],
          "final_test_accuracy": summary["final_test_accuracy"],
          "best_test_accuracy": max(curve.values()) if curve else None,
          "audited_epsilon": summary["audit"]["epsilon"],
          "seconds": summary.get("seconds", time.perf_counter() - start),
          "curve": curve,
        }
      )
      print(
        f"{mechanism:>7} seed {seed}: accuracy {summary['final_test_accuracy']:.4f}, "
        f"sigma {summary['noise_multiplier']:.4g}, audited epsilon "
        f"{summary['audit']['epsilon']:.4g}",
        flush=True,
      )
  (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")

  config = load_config(
    base, [*args.overrides, f"target_epsilon={args.epsilon}", "noise_multiplier=null"]
  )
  lines = [
    f"Final test accuracy at ε = {args.epsilon:g}, δ = {config.privacy.delta:g} "
    f"({config.task.name}, {config.task.model}, {config.program.rounds} rounds of {config.program.clients_per_round} "
    f"clients"
    + (
      f" with the noise of {config.privacy.reference_clients_per_round}"
      if config.privacy.reference_clients_per_round
      else ""
    )
    + f", participation {config.participation.model}), mean ± std over seeds "
    f"{args.seeds}; accuracy excludes pad, OOV, bos and eos.",
    "",
    "| mechanism | strategy | σ | final accuracy | best accuracy | audited ε |",
    "|---|---|---|---|---|---|",
  ]
  for mechanism in mechanisms:
    rows = [r for r in records if r["mechanism"] == mechanism]
    final = _mean_std([r["final_test_accuracy"] for r in rows])
    best = _mean_std([r["best_test_accuracy"] for r in rows])
    lines.append(
      f"| {mechanism} | {rows[0]['strategy']} | {rows[0]['noise_multiplier']:.4g} | "
      f"{final[0]:.4f} ± {final[1]:.4f} | {best[0]:.4f} ± {best[1]:.4f} | "
      f"{max(r['audited_epsilon'] for r in rows):.4g} |"
    )
  (out / "results.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))

  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(7, 4))
  for mechanism in mechanisms:
    rows = [r for r in records if r["mechanism"] == mechanism]
    rounds = sorted(rows[0]["curve"])
    means = [statistics.fmean(r["curve"][k] for r in rows) for k in rounds]
    ax.plot([k + 1 for k in rounds], means, marker="o", ms=3, label=mechanism)
  ax.set_xlabel("round")
  ax.set_ylabel("test accuracy (excl. pad, OOV, bos, eos)")
  ax.set_title(f"Mechanisms at equal privacy (ε = {args.epsilon:g})")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(out / "accuracy.png", dpi=110)
  return 0


if __name__ == "__main__":
  sys.exit(main())
