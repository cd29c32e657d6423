#!/usr/bin/env python3
"""AM-SSP vs AM-DPSGD vs DP-ALS on the synthetic two-tower data at several ε (docs/benchmarks.md §5).

The paper's Figures 1-3 at a small scale: test RMSE against ε, and against training time, mean and
standard deviation over seeds (each seed draws new data, splits and noise). Writes OUT/results.csv,
OUT/results.md and OUT/public_features.png.

  .venv/bin/python benchmarks/public_features_benchmark.py --out out/pf --seeds 3
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from fedmf.public_features import algorithms
from fedmf.public_features import driver
from fedmf.public_features.config import PublicFeaturesConfig

ALGORITHMS = ("am-ssp", "am-dpsgd", "dp-als")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--epsilons", default="1,5,20")
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--num-users", type=int, default=10000)
  parser.add_argument("--num-items", type=int, default=100)
  parser.add_argument("--num-people", type=int, default=5000)
  parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  epsilons = [float(e) for e in args.epsilons.split(",")]
  rows = []
  for seed in range(args.seeds):
    cfg = PublicFeaturesConfig(
      seed=seed, num_users=args.num_users, num_items=args.num_items, num_people=args.num_people
    ).validate()
    dataset = driver.build_dataset(cfg)
    hyper = driver.hyperparameters(cfg)
    for algorithm in args.algorithms.split(","):
      for eps in epsilons:
        try:
          result = algorithms.train(dataset, algorithm, eps, cfg.delta, seed, hyper)
          last, seconds = result.metrics[-1], result.train_seconds
        except FloatingPointError:  # a diverged run is reported as NaN, not as a crash
          last, seconds = {"test_rmse": float("nan"), "test_recall_at_20": float("nan")}, 0.0
        row = {
          "algorithm": algorithm,
          "epsilon": eps,
          "seed": seed,
          "test_rmse": last["test_rmse"],
          "test_recall_at_20": last["test_recall_at_20"],
          "train_seconds": seconds,
        }
        rows.append(row)
        print(
          ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
          file=sys.stderr,
          flush=True,
        )
  with open(out / "results.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  table = [
    "| algorithm | ε | test RMSE (mean ± std) | Recall@20 | train seconds |",
    "|---|---|---|---|---|",
  ]
  summary = {}
  for algorithm in args.algorithms.split(","):
    for eps in epsilons:
      sel = [r for r in rows if r["algorithm"] == algorithm and r["epsilon"] == eps]
      rmse = np.array([r["test_rmse"] for r in sel])
      secs = np.array([r["train_seconds"] for r in sel])
      recall = np.array([r["test_recall_at_20"] for r in sel])
      summary[algorithm, eps] = (rmse.mean(), rmse.std(), secs.mean())
      table.append(
        f"| {algorithm} | {eps:g} | {rmse.mean():.4f} ± {rmse.std():.4f} | "
        f"{recall.mean():.4f} | {secs.mean():.2f} |"
      )
  (out / "results.md").write_text("\n".join(table) + "\n")
  print("\n".join(table))
  _plot(summary, args.algorithms.split(","), epsilons, out / "public_features.png")
  return 0


def _plot(summary, algorithm_names, epsilons, path: Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  for algorithm in algorithm_names:
    mean = [summary[algorithm, e][0] for e in epsilons]
    std = [summary[algorithm, e][1] for e in epsilons]
    secs = [summary[algorithm, e][2] for e in epsilons]
    left.errorbar(epsilons, mean, yerr=std, marker="o", capsize=3, label=algorithm)
    right.scatter(secs, mean, label=algorithm)
    for e, s, m in zip(epsilons, secs, mean):
      right.annotate(f"ε={e:g}", (s, m), fontsize=7)
  left.set(xlabel="ε (user level, δ = 1e-5)", ylabel="test RMSE", title="RMSE against ε")
  right.set(
    xscale="log", xlabel="training seconds", ylabel="test RMSE", title="RMSE against training time"
  )
  left.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  sys.exit(main())
