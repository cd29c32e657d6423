#!/usr/bin/env python3
"""What canaries cost a training round: time and memory with 0, 100, 500 and 1000 canaries.

For each model (the default config's `lstm-small`, and `lstm-paper` on the same synthetic data),
builds the run once and times, interleaved round by round so that the machine's load hits every
arm alike:

  round        `fedmf.program.training_run.train_round` without canaries (the baseline)
  canaries-M   the canary work a round adds with M canaries (M/2 inserted, M/2 held out): one
               insertion of every inserted canary (the worst case: the worst-case pattern's rounds;
               most rounds insert none) and the projection of the released mean on every direction,
               the two randomized Hadamard transforms `fedmf.program.canaries.RunCanaries` runs

and prints the median seconds (wall and this process's CPU), each canary arm against the round,
and the canaries' memory over the configured rounds (projections and rounds joined, 5 bytes per
round and canary, plus the directions' tables of the model's size), measured with tracemalloc.

  .venv/bin/python benchmarks/canary_benchmark.py [--rounds 5] [--models lstm-small,lstm-paper]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
import tracemalloc

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = {
  "lstm-small": [],
  "lstm-paper": ["model=lstm-paper", "vocab_size=10000", "clients_per_round=10"],
}


def _cpu() -> float:
  t = os.times()
  return t.user + t.system


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--rounds", type=int, default=5, help="timed rounds per model")
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--counts", default="100,500,1000")
  args = parser.parse_args(argv)

  import numpy as np

  from fedmf.program import canaries as canaries_lib
  from fedmf.program import config as config_lib
  from fedmf.program import platform
  from fedmf.program import training_run as loop

  counts = [int(c) for c in args.counts.split(",")]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for model in args.models.split(","):
    sets = [*MODELS[model], "reference_clients_per_round=20", "eval_every=1000"]
    config = config_lib.load_config(os.path.join(root, "simulations/configs/default.yaml"), sets)
    with platform.execution(config.platform, concurrent_clients=config.concurrent_clients) as pool:
      run = loop.build_run(config, pool=pool)
      arms = {}
      memory = {}
      for count in counts:
        with_canaries = dataclasses.replace(
          config,
          canaries=dataclasses.replace(
            config.canaries, count=count // 2, held_out=count - count // 2, seed=1,
            pattern="worst-case",
          ),
        )  # fmt: skip
        tracemalloc.start()
        arms[count] = canaries_lib.build(
          with_canaries.canaries,
          with_canaries.participation,
          clients_per_round=with_canaries.program.clients_per_round,
          rounds=with_canaries.program.rounds,
          shapes=run.shapes,
          schema=run.plan.schema,
          strategy=run.plan.strategy,
          num_clients=run.task.num_clients,
        )
        memory[count] = tracemalloc.get_traced_memory()[0]  # what the arm keeps
        tracemalloc.stop()
      times = {"round": [], **{c: [] for c in counts}}
      cpu = {"round": [], **{c: [] for c in counts}}
      for r in range(args.rounds + 1):
        cohort_ids = run.data_iterator.select()
        del cohort_ids
        start, c0 = time.perf_counter(), _cpu()
        record = loop.train_round(run, run.data_iterator.last_cohort)
        wall, used = time.perf_counter() - start, _cpu() - c0
        if r:  # the first round compiles
          times["round"].append(wall)
          cpu["round"].append(used)
        clipped = [np.zeros(s, np.float32) for s in run.shapes]
        for count in counts:
          arm = arms[count]
          start, c0 = time.perf_counter(), _cpu()
          arm.insert(arm.worst.rounds[0], clipped, config.recipe.clip_norm)
          arm.project(arm.worst.rounds[0], record.noisy_mean, config.program.clients_per_round)
          if r:
            times[count].append(time.perf_counter() - start)
            cpu[count].append(_cpu() - c0)
      params = sum(int(np.prod(s)) for s in run.shapes)
      base, base_cpu = statistics.median(times["round"]), statistics.median(cpu["round"])
      print(
        f"\n{model}: {params:,} parameters, {config.program.clients_per_round} clients per round, "
        f"{args.rounds} rounds, load {os.getloadavg()[0]:.1f}"
      )
      print("| arm | median s (wall) | × round | median CPU s (this process) | memory MiB |")
      print("|---|---|---|---|---|")
      print(f"| round without canaries | {base:.3f} | 1 | {base_cpu:.3f} | |")
      for count in counts:
        wall, used = statistics.median(times[count]), statistics.median(cpu[count])
        state = arms[count].projections.nbytes + arms[count].membership.nbytes
        print(
          f"| {count} canaries: insert all + project | {wall:.4f} | {wall / base:.4f} | "
          f"{used:.4f} | {memory[count] / 2**20:.1f} (of which {state / 2**20:.2f} rounds × "
          "canaries) |"
        )
      if run.noise is not None:
        run.noise.close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
