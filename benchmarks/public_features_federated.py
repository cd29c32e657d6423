#!/usr/bin/env python3
"""Federated AM-SSP (Algorithm 8 through TFF) against the centralized run on the same data and seed
(docs/benchmarks.md §5, "Federated"): the time of each, their ratio, and the largest difference
between the statistics they release.

Every user is one TFF client; `--clients-per-call` lists the batch sizes tried (users per TFF call;
a release takes ceil(users / batch) calls). Times are training seconds as `algorithms.train`
counts them (releases and item updates, not evaluation), measured after a warm-up run that traces
the TFF computations; the first federated run's time (tracing included) is reported too.

  .venv/bin/python benchmarks/public_features_federated.py --data-dir /work/data/ml-100k \\
      --out out/pf-federated
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import fedmf.console

fedmf.console.quiet_tensorflow()

from fedmf.public_features import algorithms  # noqa: E402
from fedmf.public_features import config  # noqa: E402
from fedmf.public_features import driver  # noqa: E402
from fedmf.public_features import federated  # noqa: E402
from fedmf.tff.context import local_execution_context  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data-dir", help="MovieLens-100K (u.data, u.item); default: synthetic")
  parser.add_argument("--out", required=True)
  parser.add_argument("--clients-per-call", default="64,256,1024")
  parser.add_argument("--epsilon", type=float, default=5.0)
  parser.add_argument("--outer-steps", type=int, default=2)
  parser.add_argument("--num-users", type=int, default=943, help="synthetic data only")
  args = parser.parse_args(argv)
  keys = {"epsilon": args.epsilon, "outer_steps": args.outer_steps, "item_id": True}
  if args.data_dir:
    keys.update(data="movielens-100k", data_dir=args.data_dir)
  else:
    keys.update(num_users=args.num_users, num_items=400, num_people=1000)
  cfg = config.from_mapping(keys)
  dataset = driver.build_dataset(cfg)
  hyper = driver.hyperparameters(cfg)
  budget = algorithms.budget_of("am-ssp", cfg.epsilon, cfg.delta, hyper)

  def run(releaser):
    start = time.perf_counter()
    result = algorithms.train(
      dataset,
      "am-ssp",
      cfg.epsilon,
      cfg.delta,
      0,
      hyper,
      releaser,
      keep_released=True,
      budget=budget,
    )
    return result, time.perf_counter() - start

  say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
  run(algorithms.CENTRAL)  # warm-up (imports, caches)
  central, central_wall = run(algorithms.CENTRAL)
  say(f"centralized: {central.train_seconds:.2f} s training, {central_wall:.2f} s in all")
  users = len(np.unique(dataset.train.users))
  rows = []
  with local_execution_context():
    for per_call in [int(x) for x in args.clients_per_call.split(",")]:
      releaser = federated.releaser(per_call)
      _, first_wall = run(releaser)  # traces the TFF computations
      fed, wall = run(releaser)
      diff = max(
        max(np.abs(f.a - c.a).max(), np.abs(f.b - c.b).max())
        for f, c in zip(fed.released, central.released)
      )
      calls = -(-users // per_call)
      row = (per_call, calls, fed.train_seconds, wall, first_wall, diff)
      rows.append(row)
      say(
        f"federated, {per_call} users per call ({calls} call{'s' if calls > 1 else ''} per release): {fed.train_seconds:.2f} s "
        f"training ({fed.train_seconds / central.train_seconds:.1f}x), first run {first_wall:.1f} s, "
        f"max |difference| of the statistics {diff:.2e}"
      )
  lines = [
    f"{cfg.data}: {users} users (TFF clients), {dataset.features.num_items} items, "
    f"{len(dataset.train):,} training ratings; AM-SSP, epsilon {cfg.epsilon:g}, "
    f"{cfg.outer_steps} outer steps, item_id",
    "",
    "| users per TFF call | calls per release | training s | x centralized | first run s (tracing) "
    "| max abs difference of the statistics |",
    "|---|---|---|---|---|---|",
    f"| centralized | - | {central.train_seconds:.2f} | 1 | - | - |",
  ]
  for per_call, calls, seconds, _, first, diff in rows:
    lines.append(
      f"| {per_call} | {calls} | {seconds:.2f} | {seconds / central.train_seconds:.1f} | "
      f"{first:.1f} | {diff:.1e} |"
    )
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
