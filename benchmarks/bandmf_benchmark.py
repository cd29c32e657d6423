#!/usr/bin/env python3
"""General BandMF at the papers' size: the block recursion against the dense route, in one run.

  .venv/bin/python benchmarks/bandmf_benchmark.py [--n 2052 --bands 342 --max-participations 6]
      [--repeats 3] [--skip-dense-optimize] [--skip-cold-start] [--skip-cli] [--json FILE]

Prints, for the same (n, b̂) and in the same process:
  1. one loss-and-gradient evaluation at the optimizer's start, by the dense route (a triangular
     inverse of the n×n C and blocked products, O(n³): what `fedmf strategy optimize` did before)
     and by the block recursion (fedmf.mf.banded_blocks, O(n·b̂²)): best wall and CPU seconds of
     --repeats, and how much of the time each part takes (forward pass, reverse pass);
  2. the whole optimization (`banded_optimize.optimize_bandmf`, default stopping rule rtol 1e-6):
     as users get it (block recursion, nested coarse start), then from the square-root Toeplitz
     start (--skip-cold-start drops it) and by the dense route (--skip-dense-optimize drops it):
     wall and CPU seconds, the load average at its start, iterations and evaluations (of the
     coarse level too), ‖A C⁻¹‖²_F and RmsLoss, and each row's ratio to the first;
  3. the command users run, end to end in a fresh process (imports, optimization, evaluation and
     the JSON output): `fedmf strategy optimize --mechanism bandmf --n N --min-sep B
     --max-participations K --json`, wall seconds and its RmsLoss.
Evaluation ratios are dense / blocks (higher: the block recursion is faster). The machine's load average is
printed before and after: on the shared 2-core machine other processes inflate wall times, the
CPU seconds much less. jax_privacy's optimizer on the same problem: benchmarks/strategy_benchmark.py
--cases bandmf (docs/benchmarks.md §1).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed(fn):
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - wall, time.process_time() - cpu


def _best(fn, repeats):
  runs = [_timed(fn) for _ in range(repeats)]
  return runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--n", type=int, default=2052)
  parser.add_argument("--bands", type=int, default=342)
  parser.add_argument("--max-participations", type=int, default=6)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip-dense-optimize", action="store_true")
  parser.add_argument("--skip-cold-start", action="store_true")
  parser.add_argument("--skip-cli", action="store_true")
  parser.add_argument("--json", metavar="FILE")
  args = parser.parse_args(argv)

  import numpy as np

  from fedmf.mf import banded_blocks, banded_matrix, banded_optimize

  n, bands, k = args.n, args.bands, args.max_participations
  sens_sq = banded_matrix.sensitivity_sq(n, bands, bands, k)
  out = {"n": n, "bands": bands, "max_participations": k, "load_before": os.getloadavg()}
  print(f"n = {n}, b̂ = {bands}, k = {k}; load average {out['load_before'][0]:.1f}", flush=True)

  theta = banded_optimize.warm_start_theta(n, bands)

  def evaluate(route):
    return banded_matrix.loss_and_grad_with_row_weights(
      theta, None, lambda r: (float(np.sum(r)), None), route
    )

  (dense, d_wall, d_cpu) = _best(lambda: evaluate("dense"), args.repeats)
  (blocks, b_wall, b_cpu) = _best(lambda: evaluate("blocks"), args.repeats)
  import threadpoolctl  # pylint: disable=g-import-not-at-top

  # The optimizer runs the block recursion on one BLAS thread (banded_optimize.optimize_bandmf):
  # the same evaluation on one thread, against the default (both cores) above.
  with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
    (_, one_wall, one_cpu) = _best(lambda: evaluate("blocks"), args.repeats)
  c = banded_matrix.normalize_columns(theta, n)
  (prefix, f_wall, f_cpu) = _best(lambda: banded_blocks.PrefixError(c), args.repeats)
  (_, r_wall, r_cpu) = _best(prefix.gradient, args.repeats)
  agree = float(np.max(np.abs(blocks[1] - dense[1])) / np.max(np.abs(dense[1])))
  out["evaluation"] = {
    "dense": {"wall": d_wall, "cpu": d_cpu},
    "blocks": {"wall": b_wall, "cpu": b_cpu, "forward_cpu": f_cpu, "reverse_cpu": r_cpu},
    "blocks_one_thread": {"wall": one_wall, "cpu": one_cpu},
    "relative_gradient_difference": agree,
    "loss_sq": [dense[0], blocks[0]],
  }
  print("\none evaluation (loss and gradient), best of", args.repeats)
  print(f"  dense route     wall {d_wall:6.3f} s  CPU {d_cpu:6.3f} s")
  print(
    f"  block recursion wall {b_wall:6.3f} s  CPU {b_cpu:6.3f} s  (forward {f_cpu:.3f}, "
    f"reverse {r_cpu:.3f} CPU s)  ×{d_wall / b_wall:.2f} wall, ×{d_cpu / b_cpu:.2f} CPU"
  )
  print(
    f"  block recursion, one BLAS thread (as the optimizer runs it) wall {one_wall:6.3f} s  "
    f"CPU {one_cpu:6.3f} s  ×{b_wall / one_wall:.2f} wall, ×{b_cpu / one_cpu:.2f} CPU against "
    "the default threads"
  )
  print(f"  loss {dense[0]:.6f} / {blocks[0]:.6f}; gradients differ by {agree:.1e} (relative)")

  def optimize(route, start):
    theta_opt, info = banded_optimize.optimize_bandmf(n, bands, bands, k, route=route, start=start)
    return info

  # Rows: the default (block recursion from the nested coarse start, 'auto'), the block recursion
  # from the square-root Toeplitz start (the same-run baseline of the coarse start), and the dense
  # route from that start (the baseline of the block recursion).
  runs = [("blocks", "auto")]
  if not args.skip_cold_start:
    runs.append(("blocks", "sqrt-toeplitz"))
  if not args.skip_dense_optimize:
    runs.append(("dense", "sqrt-toeplitz"))
  rows = {}
  for route, start in runs:
    load = os.getloadavg()[0]
    info, wall, cpu = _timed(lambda route=route, start=start: optimize(route, start))
    rows[f"{route}, {start} start"] = {
      "start_used": info["start"],
      "wall": wall,
      "cpu": cpu,
      "load": load,
      "iterations": info["iterations"],
      "evaluations": info["evaluations"],
      "coarse_iterations": info["coarse_iterations"],
      "coarse_evaluations": info["coarse_evaluations"],
      "loss_sq": info["loss_sq"],
      "rms_loss": math.sqrt(sens_sq * info["loss_sq"] / n),
    }
  out["optimize"] = rows
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  from fedmf.mf.schema import ParticipationSchema  # pylint: disable=g-import-not-at-top

  estimate = strategies.mechanism_class("bandmf").optimize_cost(
    ParticipationSchema(n, bands, k), strategies.OptimizeOptions()
  )
  out["estimate"] = {"seconds": estimate.seconds, "memory_bytes": estimate.memory_bytes}
  print("\nthe whole optimization (default stopping rule); ratios: the row against this one")
  first = next(iter(rows.values()))
  for name, r in rows.items():
    coarse = (
      f" (+ {r['coarse_iterations']} / {r['coarse_evaluations']} at n = {(n + 1) // 2}, "
      f"b̂ = {(bands + 1) // 2})"
      if r["coarse_iterations"]
      else ""
    )
    print(
      f"  {name + ' (' + r['start_used'] + ')':<42} wall {r['wall']:7.2f} s  CPU {r['cpu']:7.2f} s  (load {r['load']:.1f})  "
      f"{r['iterations']} iterations / {r['evaluations']} evaluations{coarse}, "
      f"‖AC⁻¹‖²_F {r['loss_sq']:.4f}, RmsLoss {r['rms_loss']:.6f}"
      + (
        f"  ×{r['wall'] / first['wall']:.2f} wall, ×{r['cpu'] / first['cpu']:.2f} CPU"
        if r is not first
        else ""
      )
    )

  print(
    f"  resource estimate of `fedmf strategy optimize` (what --max-seconds and --max-memory are "
    f"checked against): {estimate.seconds:.1f} s, {estimate.memory_bytes / 2**20:.0f} MiB"
  )

  if not args.skip_cli:
    with tempfile.TemporaryDirectory() as tmp:
      cmd = [
        sys.executable,
        "-m",
        "fedmf.cli.main",
        "strategy",
        "optimize",
        "--mechanism",
        "bandmf",
        "--n",
        str(n),
        "--min-sep",
        str(bands),
        "--max-participations",
        str(k),
        "--out",
        os.path.join(tmp, "bandmf.json"),
        "--json",
        "--no-progress",
        # The wall-clock guard (default 120 s) would stop a run slowed by a loaded machine: the
        # benchmark measures the time instead (the estimate it is checked against is printed).
        "--max-seconds",
        "3600",
      ]
      start = time.perf_counter()
      children = resource.getrusage(resource.RUSAGE_CHILDREN)
      proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
      wall = time.perf_counter() - start
      after = resource.getrusage(resource.RUSAGE_CHILDREN)
      cpu = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    result = json.loads(proc.stdout)
    shown = "fedmf " + " ".join(cmd[3:-6]) + " --out FILE --json"
    out["cli"] = {"command": shown, "wall": wall, "cpu": cpu, "rms_loss": result["rms_loss"]}
    print(f"\n`{shown}`")
    print(f"  end to end wall {wall:.2f} s, CPU {cpu:.2f} s, RmsLoss {result['rms_loss']:.6f}")

  out["load_after"] = os.getloadavg()
  print(f"\nload average after: {out['load_after'][0]:.1f}")
  if args.json:
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
