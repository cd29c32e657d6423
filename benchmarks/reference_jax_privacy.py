"""Reference strategy optimization with jax_privacy 2.0 (`jax_privacy.matrix_factorization`).

This script runs inside the separate reference environment (jax-privacy 2.0.0 needs a newer jax
than fedmf's locked environment); `strategy_benchmark.py` creates that environment and launches
this script as a subprocess, once per case, so that peak RSS is per case. It does not import fedmf.

    python reference_jax_privacy.py --case blt|band-toeplitz|bandmf --n N --min-sep B \
        --max-participations K [--bands BH] [--buffers D|auto] [--max-iter STEPS] \
        [--objective max|rms] [--out strategy.json]

It prints one JSON line with:
  seconds        wall time of the optimization call (including jit compilation), excluding imports
                 and the final loss evaluation;
  peak_rss_mb    ru_maxrss of this process right after the optimization (a high-water mark, so it
                 includes the interpreter and jax itself; `baseline_rss_mb` is the mark after imports);
  max_loss, rms_loss
                 UNSQUARED losses on the prefix-sum workload under b-min-sep with k participations,
                 i.e. sens * MaxError and sens * RmsError.  jax_privacy's own losses are squared
                 (per-query squared error times sensitivity squared); they are converted here with a
                 square root.  `sens_method` says how the sensitivity was obtained;
  strategy_path  the strategy written in fedmf's strategy JSON schema, so that the driver can
                 re-evaluate it with fedmf (apples-to-apples comparison).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
import traceback


def _rss_mb() -> float:
  # Linux reports ru_maxrss in KiB.
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _parse_args(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--case", required=True, choices=["blt", "band-toeplitz", "bandmf"])
  p.add_argument("--n", type=int, required=True)
  p.add_argument("--min-sep", type=int, required=True)
  p.add_argument("--max-participations", type=int, required=True)
  p.add_argument("--bands", type=int, default=None, help="b-hat (default: min-sep)")
  p.add_argument(
    "--buffers",
    default="auto",
    help="BLT buffers: an integer, or 'auto' for buffered_toeplitz.optimize's own choice",
  )
  p.add_argument(
    "--max-iter",
    type=int,
    default=None,
    help="L-BFGS steps (default: jax_privacy's own default for the case: BLT 600 per buffer "
    "count, banded Toeplitz 250, BandMF 100)",
  )
  p.add_argument(
    "--objective",
    choices=["max", "rms"],
    default=None,
    help="default: max for blt, rms for band-toeplitz and bandmf",
  )
  p.add_argument("--out", default=None, help="write the strategy here (fedmf JSON schema)")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = _parse_args(argv)
  n, b = args.n, args.min_sep
  bands = args.bands if args.bands is not None else b
  objective = args.objective or ("max" if args.case == "blt" else "rms")
  result = {
    "case": args.case,
    "n": n,
    "min_sep": b,
    "max_participations": args.max_participations,
    "objective": objective,
    "implementation": "jax_privacy",
  }
  try:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    import jax_privacy
    from jax_privacy.matrix_factorization import banded, buffered_toeplitz, sensitivity, toeplitz

    result["versions"] = {
      "jax": jax.__version__,
      "jax_privacy": getattr(jax_privacy, "__version__", "?"),
      "numpy": np.__version__,
      "python": sys.version.split()[0],
    }
    result["devices"] = [str(d) for d in jax.devices()]
    result["baseline_rss_mb"] = _rss_mb()
    k = sensitivity.minsep_true_max_participations(n, b, args.max_participations)
    reduction = jnp.max if objective == "max" else jnp.mean
    steps = {} if args.max_iter is None else {"max_optimizer_steps": args.max_iter}

    if args.case == "blt":
      error = "max" if objective == "max" else "mean"
      if args.buffers == "auto":
        result["call"] = (
          f"buffered_toeplitz.optimize(n, min_sep, max_participations, error={error!r})"
        )
        t0 = time.perf_counter()
        blt = buffered_toeplitz.optimize(
          n=n, min_sep=b, max_participations=args.max_participations, error=error, **steps
        )
        jax.block_until_ready(blt.buf_decay)
        seconds = time.perf_counter() - t0
      else:
        nbuf = int(args.buffers)
        if k == 1 and error == "max":
          loss_fn = buffered_toeplitz.LossFn.build_closed_form_single_participation(n=n)
        else:
          loss_fn = buffered_toeplitz.LossFn.build_min_sep(
            n=n, error=error, min_sep=b, max_participations=args.max_participations
          )
        result["call"] = (
          f"buffered_toeplitz.optimize_loss(LossFn.build_min_sep(n, {error!r}, min_sep, "
          f"max_participations), num_buffers={nbuf}, parameterization=buf_decay_pair)"
        )
        t0 = time.perf_counter()
        with jax.enable_x64():
          blt, _ = buffered_toeplitz.optimize_loss(
            loss_fn,
            num_buffers=nbuf,
            parameterization=buffered_toeplitz.Parameterization.buf_decay_pair(),
            **steps,
          )
        jax.block_until_ready(blt.buf_decay)
        seconds = time.perf_counter() - t0
      peak = _rss_mb()
      theta = np.asarray(blt.buf_decay, dtype=np.float64)
      omega = np.asarray(blt.output_scale, dtype=np.float64)
      strategy = {"mechanism": "blt", "buf_decay": theta.tolist(), "output_scale": omega.tolist()}
      # Losses, as jax_privacy computes them: per-query squared error of B = A C^-1 from the
      # Toeplitz coefficients of the inverse BLT, and Thm-2 min-sep sensitivity squared.
      with jax.enable_x64():
        inv = blt.inverse()
        err_sq = np.asarray(toeplitz.per_query_error(noising_coef=inv.toeplitz_coefs(n)))
        try:
          sens_sq = float(
            toeplitz.minsep_sensitivity_squared(
              blt.toeplitz_coefs(n), min_sep=b, max_participations=args.max_participations, n=n
            )
          )
          result["sens_method"] = "jax_privacy toeplitz.minsep_sensitivity_squared (exact)"
        except ValueError as e:  # coefficients not non-increasing: use the dense upper bound
          c = np.asarray(toeplitz.materialize_lower_triangular(blt.toeplitz_coefs(n)))
          sens_sq = (
            float(sensitivity.get_min_sep_sensitivity_upper_bound(c, b, args.max_participations))
            ** 2
          )
          result["sens_method"] = f"dense upper bound ({e})"
      result["num_buffers"] = int(theta.size)
    elif args.case == "band-toeplitz":
      result["call"] = (
        f"toeplitz.optimize_banded_toeplitz(n, bands, reduction_fn=jnp.{reduction.__name__})"
      )
      t0 = time.perf_counter()
      coefs = toeplitz.optimize_banded_toeplitz(n, bands, reduction_fn=reduction, **steps)
      jax.block_until_ready(coefs)
      seconds = time.perf_counter() - t0
      peak = _rss_mb()
      coefs = np.asarray(coefs, dtype=np.float64)
      strategy = {
        "mechanism": "band-toeplitz",
        "coefficients": coefs.tolist(),
        "column_normalized": False,
      }
      err_sq = np.asarray(toeplitz.per_query_error(strategy_coef=jnp.asarray(coefs), n=n))
      sens_sq, result["sens_method"] = _banded_sens_sq(
        _toeplitz_col_norms_sq(coefs, n),
        bands,
        b,
        args.max_participations,
        sensitivity,
        dense=lambda: np.asarray(toeplitz.materialize_lower_triangular(jnp.asarray(coefs), n)),
      )
    else:  # bandmf
      result["call"] = f"banded.optimize(n, bands=bands, reduction_fn=jnp.{reduction.__name__})"
      t0 = time.perf_counter()
      strat = banded.optimize(n, bands=bands, reduction_fn=reduction, **steps)
      jax.block_until_ready(strat.params)
      seconds = time.perf_counter() - t0
      peak = _rss_mb()
      params = np.asarray(strat.params, dtype=np.float64)  # params[j, d] = C[j + d, j]
      bh = params.shape[1]
      columns = [params[j, : min(bh, n - j)].tolist() for j in range(n)]
      strategy = {"mechanism": "bandmf", "n": n, "bands": bh, "columns": columns}
      with jax.enable_x64():
        err_sq = np.asarray(
          banded.per_query_error(banded.ColumnNormalizedBanded(params=jnp.asarray(params)))
        )
      # Column-normalized: every column has norm 1.
      sens_sq, result["sens_method"] = _banded_sens_sq(
        np.ones(n),
        bh,
        b,
        args.max_participations,
        sensitivity,
        dense=lambda: np.asarray(
          banded.ColumnNormalizedBanded(params=jnp.asarray(params)).materialize()
        ),
      )

    result.update(
      {
        "ok": True,
        "seconds": seconds,
        "peak_rss_mb": peak,
        "sens": math.sqrt(sens_sq),
        "max_error": math.sqrt(float(np.max(err_sq))),
        "rms_error": math.sqrt(float(np.mean(err_sq))),
        # jax_privacy's squared losses, and their unsquared versions (fedmf's units):
        "max_loss_squared": float(np.max(err_sq)) * sens_sq,
        "rms_loss_squared": float(np.mean(err_sq)) * sens_sq,
        "max_loss": math.sqrt(float(np.max(err_sq)) * sens_sq),
        "rms_loss": math.sqrt(float(np.mean(err_sq)) * sens_sq),
      }
    )
    if args.out:
      with open(args.out, "w") as f:
        json.dump(
          dict(
            strategy,
            optimized_by="jax_privacy " + result["versions"]["jax_privacy"],
            n_optimized=n,
            min_sep=b,
            max_participations=args.max_participations,
            objective=objective,
          ),
          f,
        )
      result["strategy_path"] = os.path.abspath(args.out)
  except Exception as e:  # report, do not crash silently: the driver prints the error
    result.update(
      {
        "ok": False,
        "error": f"{type(e).__name__}: {e}",
        "traceback": traceback.format_exc(limit=8),
        "peak_rss_mb": _rss_mb(),
      }
    )
  print(json.dumps(result), flush=True)
  return 0 if result.get("ok") else 1


def _toeplitz_col_norms_sq(coefs, n):
  """Squared norms of the columns of the n x n banded lower-triangular Toeplitz C."""
  import numpy as np

  c = np.zeros(n)
  m = min(n, len(coefs))
  c[:m] = np.asarray(coefs)[:m]
  head = np.cumsum(c**2)  # head[m] = sum_{i <= m} c_i^2; column j holds c_0 .. c_{n-1-j}
  return head[n - 1 - np.arange(n)]


def _banded_sens_sq(col_norms_sq, bands, min_sep, max_participations, sensitivity, dense):
  """Exact sensitivity^2 of a banded C when bands <= min_sep (columns b apart are orthogonal)."""
  import numpy as np

  if bands <= min_sep:
    v = sensitivity.max_participation_for_linear_fn(
      np.asarray(col_norms_sq), min_sep, max_participations
    )
    return float(v), "exact (bands <= min_sep: sum of the k largest min-sep column norms^2)"
  ub = float(sensitivity.get_min_sep_sensitivity_upper_bound(dense(), min_sep, max_participations))
  return ub**2, "upper bound (bands > min_sep; jax_privacy get_min_sep_sensitivity_upper_bound)"


if __name__ == "__main__":
  sys.exit(main())
