"""Benchmark: TreeAgg's per-round ε curve (the report of a run) in one pass against round by round.

The audit's report draws ε after every round r at that prefix's realized (b_r, k_r)
(`fedmf.privacy.curve.epsilon_curve`, "every-round"). For TreeAgg each r was one dense Gram
C_rᵀC_r (O(r³)) and VecSens over its rows (O(r²k)); `Tree.prefix_sensitivities`
(`fedmf.mf.tree_sensitivity`) computes every prefix in one pass. Both run here, in this process, on
the same realized participation: the papers' fixed-epoch (k, b) participation (the population is
shuffled once into b cohorts, and round r trains cohort r mod b), with b = ``--min-sep`` and
k = ``--epochs``; ``--reshuffle`` permutes the population again every epoch (realized b falls to 1). Prints
the seconds of each, their ratio, and the largest relative difference of the sensitivities (the
same values up to rounding). The load average is printed: the machine may be shared.

Usage: .venv/bin/python benchmarks/tree_curve_benchmark.py [--min-sep 342] [--epochs 6]
       [--cohort 20] [--seed 0] [--reshuffle] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from fedmf.mf import tree
from fedmf.privacy import curve as curve_lib
from fedmf.program.meter import PrivacyMeter


def realized_schemas(min_sep: int, epochs: int, cohort: int, seed: int, reshuffle: bool = False):
  """(b_r, k_r) of the first r rounds, r = 1..n, under fixed-epoch participation, as a run's
  privacy meter (`fedmf.program.meter.PrivacyMeter`) counts them."""
  rng = np.random.default_rng(seed)
  population = min_sep * cohort
  n = min_sep * epochs
  meter = PrivacyMeter(tree.Tree(), 1.0, 1e-6, population)
  b = np.full(n, -1, dtype=np.int64)
  k = np.zeros(n, dtype=np.int64)
  order = rng.permutation(population).reshape(min_sep, cohort)
  for epoch in range(epochs):
    if reshuffle and epoch:
      order = rng.permutation(population).reshape(min_sep, cohort)
    for i, clients in enumerate(order):
      r = epoch * min_sep + i
      meter.record(r, clients)
      k[r] = meter.max_participations
      b[r] = -1 if meter.min_gap is None else meter.min_gap
  return b, k


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--min-sep", type=int, default=342)
  parser.add_argument("--epochs", type=int, default=6)
  parser.add_argument("--cohort", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--reshuffle", action="store_true", help="a new order every epoch")
  parser.add_argument("--no-baseline", action="store_true", help="only the one pass")
  args = parser.parse_args(argv)
  b, k = realized_schemas(args.min_sep, args.epochs, args.cohort, args.seed, args.reshuffle)
  n = b.shape[0]
  changes = 1 + int(np.count_nonzero((b[1:] != b[:-1]) | (k[1:] != k[:-1])))
  print(
    f"n = {n} rounds, {changes} distinct realized (b_r, k_r), final (b, k) = ({b[-1]}, {k[-1]})"
  )

  def timed(strategy):
    start = time.perf_counter()
    result = curve_lib.epsilon_curve(
      strategy, b, k, 7.0, 1e-6, max_evaluations=None, time_budget=1e12
    )
    return result, time.perf_counter() - start

  fast, fast_seconds = timed(tree.Tree())
  print(f"one pass (Tree.prefix_sensitivities): {fast_seconds:.2f} s")
  if not args.no_baseline:
    baseline = tree.Tree()  # Its own cache; the per-round route every strategy without one has.
    object.__setattr__(baseline, "prefix_sensitivities", lambda *_: None)
    slow, slow_seconds = timed(baseline)
    diff = np.max(
      np.abs(fast.sensitivity - slow.sensitivity) / np.maximum(slow.sensitivity, 1e-300)
    )
    same = fast.sensitivity_method == slow.sensitivity_method
    print(f"round by round (baseline): {slow_seconds:.2f} s")
    print(f"ratio baseline / one pass: {slow_seconds / fast_seconds:.0f}x")
    print(f"largest relative difference of the sensitivities: {diff:.1e}; same labels: {same}")
  print(f"load average: {os.getloadavg()[0]:.1f}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
