#!/usr/bin/env python3
"""Regenerates BandMF App. G Table 3: the optimal number of bands b̂ under amplification for
n = 1024, δ = 1e-6, ε ∈ {1/32, …, 16} and k ∈ {1, …, 1024} epochs (docs/mechanisms.md).

Setting of the paper's RMSE experiments (BandMF §6, Fig. 4): k epochs of n/k steps, so the dataset
holds N = (n/k)·B examples; b̂-cyclic Poisson sampling then has q = b̂·k/n and ⌈n/b̂⌉ queries per
example. The candidates are b̂ = 1, 2, 4, …, n/k (at n/k, q = 1: no amplification). Each b̂-banded
C is optimized once for the prefix workload (it does not depend on ε or k; strategy cache), σ is
calibrated by `fedmf.privacy.band_choice` for every (ε, k, b̂), and the b̂ of least RMSE is kept.

To bound the run time, the candidates of one (ε, k) are evaluated in increasing b̂ and the scan
stops once the RMSE has risen for two candidates in a row past the best (--full scans them all);
every chosen b̂ has both its neighbours evaluated. Writes JSON lines to --out as it goes.

Run: python3 benchmarks/band_table.py --out band_table.jsonl [--ks 1,8,64] [--epsilons 1,16]
     python3 benchmarks/band_table.py --render band_table.jsonl   # the markdown table
"""

from __future__ import annotations

import argparse
import json
import math
import time

from fedmf.mf import strategy_cache
from fedmf.privacy import amplification
from fedmf.privacy import band_choice

N = 1024
DELTA = 1e-6
EPSILONS = [2.0**p for p in range(-5, 5)]
KS = [2**p for p in range(11)]

# BandMF App. G Table 3 (rows ε, columns k = 1, 2, 4, …, 1024), from the paper's text.
PAPER = {
  0.03125: [2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  0.0625: [4, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  0.125: [8, 4, 2, 1, 1, 1, 1, 1, 1, 1, 1],
  0.25: [8, 4, 4, 2, 1, 1, 1, 1, 1, 1, 1],
  0.5: [16, 8, 4, 4, 2, 1, 1, 1, 1, 1, 1],
  1.0: [32, 16, 8, 4, 2, 2, 1, 1, 1, 1, 1],
  2.0: [64, 32, 16, 8, 4, 2, 2, 1, 1, 1, 1],
  4.0: [128, 64, 32, 16, 8, 4, 2, 2, 1, 1, 1],
  8.0: [1024, 512, 256, 32, 16, 8, 4, 2, 2, 1, 1],
  16.0: [1024, 512, 256, 128, 64, 32, 8, 4, 4, 2, 1],
}


def _rmse(eps: float, k: int, bands: int) -> float:
  """RMSE of the cached b̂-banded strategy at ε for k epochs (for a choice the scan skipped)."""
  strategy = band_choice.optimize_candidates(N, [bands], cache=strategy_cache.cache_dir())[bands]
  sampling = amplification.CyclicPoissonSampling(N // k, 1, bands)
  sigma = amplification.noise_for(
    eps, N, sampling, DELTA, rtol=1e-4, pld_interval=band_choice.pld_interval_for(eps)
  )
  return sigma * math.sqrt(band_choice.loss_sq_of(strategy, N) / N)


def render(path: str) -> None:
  """Markdown: our b̂ per (ε, k), the paper's where it differs, and the RMSE gap of its choice."""
  rows = [json.loads(line) for line in open(path)]
  ks = sorted({r["k"] for r in rows})
  by = {(r["epsilon"], r["k"]): r for r in rows}
  print("| ε \\ k | " + " | ".join(str(k) for k in ks) + " |")
  print("|---|" + "---|" * len(ks))
  notes = []
  for eps in sorted({r["epsilon"] for r in rows}):
    cells = []
    for k in ks:
      r = by.get((eps, k))
      if r is None:
        cells.append("")
        continue
      ours, paper = r["best_bands"], r["paper_bands"]
      if paper is None or paper == ours:
        cells.append(str(ours))
        continue
      rmse = {c["bands"]: c["rmse"] for c in r["bands"]}
      paper_rmse = rmse.get(paper) or _rmse(eps, k, paper)
      gap = paper_rmse / rmse[ours] - 1.0
      cells.append(f"**{ours}** ({paper})")
      notes.append(
        f"- ε = {eps:g}, k = {k}: b̂ = {ours} (RMSE {rmse[ours]:.4g}); the paper's b̂ = {paper} "
        f"has RMSE {paper_rmse:.4g} here, {100 * gap:.2f}% more"
      )
    print(f"| {eps:g} | " + " | ".join(cells) + " |")
  print()
  print("\n".join(notes) if notes else "Every entry agrees with the paper.")
  print(f"\nrows: {len(rows)}, calibration seconds: {sum(r['seconds'] for r in rows):.0f}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--render", metavar="JSONL", help="print the markdown table of a run")
  parser.add_argument("--out")
  parser.add_argument("--ks", default=",".join(str(k) for k in KS))
  parser.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
  parser.add_argument("--full", action="store_true", help="evaluate every candidate")
  args = parser.parse_args()
  if args.render:
    render(args.render)
    return
  if not args.out:
    parser.error("--out is required")
  ks = [int(k) for k in args.ks.split(",")]
  epsilons = [float(e) for e in args.epsilons.split(",")]

  start = time.perf_counter()
  bands = sorted({b for k in ks for b in band_choice.candidate_bands(N, N // k, N // k, 1)})
  losses = {}
  for b in bands:
    t = time.perf_counter()
    strategy = band_choice.optimize_candidates(N, [b], cache=strategy_cache.cache_dir())[b]
    losses[b] = band_choice.loss_sq_of(strategy, N)
    print(f"b̂={b}: ‖A C⁻¹‖²_F = {losses[b]:.6g} ({time.perf_counter() - t:.1f} s)", flush=True)
  optimize_seconds = time.perf_counter() - start

  with open(args.out, "w") as f:
    for k in ks:
      cands = band_choice.candidate_bands(N, N // k, N // k, 1)
      uppers: dict[int, float] = {}
      for eps in sorted(epsilons):
        t = time.perf_counter()
        evaluated, best, rises = [], None, 0
        for b in cands:
          sampling = amplification.CyclicPoissonSampling(N // k, 1, b)
          sigma = amplification.noise_for(
            eps,
            N,
            sampling,
            DELTA,
            rtol=1e-4,
            pld_interval=band_choice.pld_interval_for(eps),
            upper=uppers.get(b),  # σ at the next smaller ε: an upper bound here.
          )
          uppers[b] = sigma * 1.001
          rmse = sigma * math.sqrt(losses[b] / N)
          evaluated.append({"bands": b, "rmse": rmse, "noise_multiplier": sigma})
          if best is None or rmse < best["rmse"]:
            best, rises = evaluated[-1], 0
          else:
            rises += 1
            if rises >= 2 and not args.full:
              break
        paper = PAPER.get(eps, [None] * len(KS))[KS.index(k)] if k in KS else None
        row = {
          "epsilon": eps,
          "k": k,
          "best_bands": best["bands"],
          "paper_bands": paper,
          "bands": evaluated,
          "seconds": time.perf_counter() - t,
        }
        f.write(json.dumps(row) + "\n")
        f.flush()
        print(
          f"eps={eps:g} k={k}: best b̂={best['bands']} (paper {paper}) "
          f"[{len(evaluated)} candidates, {row['seconds']:.1f} s]",
          flush=True,
        )
  total = time.perf_counter() - start
  print(f"optimization {optimize_seconds:.1f} s, total {total:.1f} s", flush=True)


if __name__ == "__main__":
  main()
