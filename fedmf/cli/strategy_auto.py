"""`fedmf strategy optimize --mechanism bandmf --bands auto`: choose b̂ under amplification.

For each candidate b̂ (powers of two up to min(n, b, ⌊N/B⌋), and that cap) the BandMF strategy is
optimized (or read from the strategy cache), σ calibrated for the target ε with b̂-cyclic Poisson
sampling, and the RMSE reported; the best is written to --out (`fedmf.privacy.band_choice`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

logger = logging.getLogger("fedmf.strategy")


def run(args: argparse.Namespace, progress_bar: Any) -> int:
  from fedmf.mf import resources, strategies, strategy_cache
  from fedmf.mf.schema import ParticipationSchema
  from fedmf.privacy import band_choice

  n = args.n
  candidates = band_choice.candidate_bands(n, args.min_sep, args.dataset_size, args.batch_size)
  bandmf = strategies.mechanism_class("bandmf")
  for b in candidates:
    resources.check(
      bandmf.optimize_cost(ParticipationSchema(n, b), strategies.OptimizeOptions()),
      f"optimizing bandmf at n={n} with {b} bands",
    )
  bar = progress_bar(not args.no_progress, None, "optimize bandmf (bands auto)")
  start = time.perf_counter()
  try:
    optimized = band_choice.optimize_candidates(
      n, candidates, cache=strategy_cache.cache_dir(), max_iter=args.max_iter, progress=bar
    )
    losses = {b: band_choice.loss_sq_of(s, n) for b, s in optimized.items()}
    evaluated = band_choice.evaluate_candidates(
      n,
      losses,
      args.target_epsilon,
      args.delta,
      args.dataset_size,
      args.batch_size,
      progress=bar,
    )
  finally:
    bar.close()
  seconds = time.perf_counter() - start
  chosen = band_choice.best(evaluated)
  amplification = {
    "dataset_size": args.dataset_size,
    "batch_size": args.batch_size,
    "partitions": chosen.bands,
    "sampling_probability": chosen.sampling_probability,
    "target_epsilon": args.target_epsilon,
    "delta": args.delta,
    "noise_multiplier": chosen.noise_multiplier,
  }
  strategies.save_strategy(
    optimized[chosen.bands],
    args.out,
    optimized_for={
      "n": n,
      "min_sep": chosen.bands,
      "max_participations": chosen.steps,
      "objective": "rms",
      "workload": "prefix",
      "amplification": amplification,
    },
    band_choice=[c.to_dict() for c in evaluated],
    optimizer_seconds=round(seconds, 3),
  )
  logger.info("wrote %s (bandmf, %d bands) in %.1f s", args.out, chosen.bands, seconds)
  out = {
    "out": args.out,
    "n": n,
    "min_sep": args.min_sep,
    "max_participations": args.max_participations,
    "target_epsilon": args.target_epsilon,
    "delta": args.delta,
    "dataset_size": args.dataset_size,
    "batch_size": args.batch_size,
    "bands": [c.to_dict() for c in evaluated],
    "best_bands": chosen.bands,
    "noise_multiplier": chosen.noise_multiplier,
    "rmse": chosen.rmse,
    "sampling_probability": chosen.sampling_probability,
    "seconds": seconds,
  }
  if args.json:
    json.dump(out, sys.stdout)
    print()
    return 0
  print(
    f"bandmf bands under amplification: n={n}, epsilon={args.target_epsilon:g}, "
    f"delta={args.delta:g}, dataset size {args.dataset_size}, batch size {args.batch_size:g}"
  )
  print(f"  {'bands':>6}  {'q':>10}  {'sigma':>10}  {'rmse':>10}")
  for c in evaluated:
    mark = "  <- best" if c.bands == chosen.bands else ""
    print(
      f"  {c.bands:>6}  {c.sampling_probability:>10.4g}  {c.noise_multiplier:>10.5g}  "
      f"{c.rmse:>10.5g}{mark}"
    )
  print(f"wrote {args.out} ({chosen.bands} bands) in {seconds:.1f} s")
  return 0
