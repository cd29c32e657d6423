#!/usr/bin/env python3
"""Round time per mechanism where users see it: `fedmf simulate`'s median round_seconds.

Runs `fedmf simulate --set model=lstm-paper --set clients_per_round=10` (the default config
otherwise: synthetic data, 1,000 words) once per mechanism, one after the other in fresh
processes, and prints each run's median `round_seconds` (metrics.csv: the federated part, the
host noise and the server step; evaluation excluded) against DP-SGD's. BandMF runs with
b̂ = 64 bands, so every run uses the timer b = 64 and n = --rounds (> 64, so the banded ring
holds 63 model-sized buffers from round 63 on; --rounds 80 by default).

  .venv/bin/python benchmarks/simulate_round_seconds.py [--rounds 80] [--out /tmp/simrounds]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARMS = {
  "dpsgd": ["mechanism=dpsgd"],
  "blt": ["mechanism=blt"],
  "tree": ["mechanism=tree"],
  "bandmf-64": ["mechanism=bandmf", "bands=64"],
}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rounds", type=int, default=80)
  parser.add_argument("--out", default="/tmp/simrounds")
  parser.add_argument("--arms", default=",".join(ARMS))
  args = parser.parse_args(argv)
  fedmf = str(Path(sys.executable).with_name("fedmf"))
  medians, tails = {}, {}
  for name in args.arms.split(","):
    out = Path(args.out) / name
    sets = [
      "model=lstm-paper",
      "clients_per_round=10",
      f"rounds={args.rounds}",
      "participation.min_sep=64",
      "eval_every=1000",
      *ARMS[name],
    ]
    cmd = [fedmf, "simulate", "--out", str(out), "--force", "--no-progress"]
    for s in sets:
      cmd += ["--set", s]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ))
    with open(out / "metrics.csv", newline="") as f:
      seconds = [float(r["round_seconds"]) for r in csv.DictReader(f)]
    medians[name] = statistics.median(seconds)
    tails[name] = statistics.median(seconds[64:]) if len(seconds) > 64 else float("nan")
    summary = json.loads((out / "summary.json").read_text())
    print(
      f"{name}: median round {medians[name]:.3f} s (rounds 64+: {tails[name]:.3f} s), "
      f"{summary['strategy']}, run {time.perf_counter() - start:.0f} s, "
      f"load {os.getloadavg()[0]:.2f}",
      flush=True,
    )
  base, base_tail = medians.get("dpsgd"), tails.get("dpsgd")
  print("| mechanism | median round_seconds | × dpsgd | rounds 64+ | × dpsgd |")
  print("|---|---|---|---|---|")
  for name in medians:
    print(
      f"| {name} | {medians[name]:.3f} | {medians[name] / base:.3f} | {tails[name]:.3f} | "
      f"{tails[name] / base_tail:.3f} |"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
