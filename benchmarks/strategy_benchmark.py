#!/usr/bin/env python3
"""Side-by-side benchmark of fedmf's strategy optimizers and jax_privacy 2.0 (issue 5, Performance).

Run from the repository root, in fedmf's environment:

    .venv/bin/python benchmarks/strategy_benchmark.py \
        [--cases blt,band-toeplitz,bandmf,tree] \
        [--n 2052 --min-sep 342 --max-participations 6 --bands 342 --buffers 4] \
        [--reference-max-iter 100] [--skip-reference] [--json out.json] [--markdown out.md]

For every case, in ONE run:
  1. fedmf's optimizer runs in a fresh child process of fedmf's environment (this same script in
     worker mode), so that its peak RSS is per case and not cumulative;
  2. the reference, jax_privacy 2.0 (`jax_privacy.matrix_factorization`), runs the same case as a
     second process (`reference_jax_privacy.py`) in its own virtual environment, which this script
     creates on demand at .bench-env/jax-privacy/ (jax-privacy 2.0.0 needs a much newer jax than
     the jax 0.4.14 that fedmf's lock pins);
  3. both strategies are written in fedmf's strategy JSON schema and re-evaluated here with
     `fedmf.mf.evaluation.evaluate(strategy, n, b, k)`, so the losses are compared in the same
     units (unsquared MaxLoss = sens * MaxError and RmsLoss = sens * RmsError on the prefix-sum
     workload under b-min-sep participation with at most k participations).

Timing is the wall time of the optimizer call only (for jax_privacy it includes jit compilation,
which is part of its real cost); imports and the loss evaluation are excluded. Peak memory is the
child process's ru_maxrss after the optimization, so it includes the interpreter and its libraries
(`base MB` reports the mark right after the imports).

Cases:
  blt            BLT for --blt-objective (default MaxLoss) with --buffers D (or 'auto').
  blt-auto       BLT with the number of buffers chosen automatically by both libraries.
  band-toeplitz  --bands-banded Toeplitz for --objective (default RmsLoss).
  bandmf         general column-normalized --bands-banded BandMF for RmsLoss; the reference runs
                 --reference-max-iter L-BFGS steps (its default, 100).
  tree           fedmf only (jax_privacy has no tree aggregation): evaluates TreeAgg vanilla,
                 online-Honaker and full-Honaker (also selectable as tree-vanilla, tree-online,
                 tree-full).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
REFERENCE_SCRIPT = HERE / "reference_jax_privacy.py"
DEFAULT_ENV = ROOT / ".bench-env" / "jax-privacy"

# Pins of the reference environment. jax-privacy 2.0.0 requires jax>=0.7.1; 0.10.2 is the newest
# jax/jaxlib pair that installs for CPython 3.11 here and works with it.
REFERENCE_PYTHON = "3.11"
REFERENCE_PINS = {"jax-privacy": "2.0.0", "jax": "0.10.2", "jaxlib": "0.10.2"}

TREE_VARIANTS = {
  "tree-vanilla": "vanilla",
  "tree-online": "online-honaker",
  "tree-full": "full-honaker",
}
ALL_CASES = ("blt", "blt-auto", "band-toeplitz", "bandmf") + tuple(TREE_VARIANTS)
REFERENCE_CASES = {
  "blt": "blt",
  "blt-auto": "blt",
  "band-toeplitz": "band-toeplitz",
  "bandmf": "bandmf",
}


def _rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _buffers(value: str) -> str:
  if value != "auto" and not (value.isdigit() and int(value) >= 1):
    raise argparse.ArgumentTypeError("--buffers must be a positive integer or 'auto'")
  return value


def _parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--cases",
    default="blt,band-toeplitz,bandmf,tree",
    help=f"comma-separated, from: {', '.join(ALL_CASES)}, tree (= all tree variants)",
  )
  p.add_argument("--n", type=int, default=2052)
  p.add_argument("--min-sep", type=int, default=342)
  p.add_argument("--max-participations", type=int, default=6)
  p.add_argument(
    "--bands", type=int, default=None, help="b-hat for band-toeplitz and bandmf (default: min-sep)"
  )
  p.add_argument(
    "--buffers", type=_buffers, default="4", help="BLT buffers for case blt: an integer or 'auto'"
  )
  p.add_argument("--blt-objective", choices=["max", "rms"], default="max")
  p.add_argument(
    "--objective",
    choices=["max", "rms"],
    default="rms",
    help="objective of the band-toeplitz case (bandmf is always rms)",
  )
  p.add_argument(
    "--max-iter",
    type=int,
    default=None,
    help="fedmf BandMF L-BFGS iteration cap (default: fedmf's own default)",
  )
  p.add_argument(
    "--reference-max-iter",
    type=int,
    default=100,
    help="jax_privacy BandMF L-BFGS steps (default 100, as measured in issue 5)",
  )
  p.add_argument("--skip-reference", action="store_true", help="run fedmf only")
  p.add_argument("--skip-fedmf", action="store_true", help="run the reference only")
  p.add_argument(
    "--reference-python",
    default=None,
    help="python of an existing reference environment (default: create/reuse --reference-env)",
  )
  p.add_argument("--reference-env", default=str(DEFAULT_ENV))
  p.add_argument(
    "--timeout", type=float, default=None, help="seconds allowed to each child process"
  )
  p.add_argument(
    "--workdir",
    default=None,
    help="where strategy files and logs go (default: .bench-env/runs/<timestamp>)",
  )
  p.add_argument("--json", default=None, help="write all results to this JSON file")
  p.add_argument("--markdown", default=None, help="write the markdown table to this file")
  p.add_argument("--fedmf-worker", default=None, help=argparse.SUPPRESS)  # internal: child mode
  p.add_argument("--strategy-out", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.bands is None:
    args.bands = args.min_sep
  return args


def _expand_cases(spec: str) -> list[str]:
  cases: list[str] = []
  for c in (x.strip() for x in spec.split(",")):
    if not c:
      continue
    expanded = list(TREE_VARIANTS) if c == "tree" else [c]
    for e in expanded:
      if e not in ALL_CASES:
        raise SystemExit(f"unknown case {e!r}; expected one of {', '.join(ALL_CASES)}, tree")
      if e not in cases:
        cases.append(e)
  return cases


# ------------------------------------------------------------------------------------------------
# fedmf worker (a fresh child process per case)


def _fedmf_worker(args: argparse.Namespace) -> int:
  case = args.fedmf_worker
  out = {"case": case, "implementation": "fedmf"}
  try:
    import numpy as np
    from fedmf.mf import banded_optimize, blt_optimize, evaluation, toeplitz

    n, b, k, bands = args.n, args.min_sep, args.max_participations, args.bands
    out["baseline_rss_mb"] = _rss_mb()
    if case in ("blt", "blt-auto"):
      nbuf = None if (case == "blt-auto" or args.buffers == "auto") else int(args.buffers)
      out["call"] = (
        f"fedmf.mf.blt_optimize.optimize_blt(n, min_sep, max_participations, num_buffers={nbuf}, "
        f"objective={args.blt_objective!r})"
      )
      out["objective"] = args.blt_objective
      t0 = time.perf_counter()
      theta, omega, info = blt_optimize.optimize_blt(
        n, b, k, num_buffers=nbuf, objective=args.blt_objective
      )
      out["seconds"] = time.perf_counter() - t0
      strategy = {
        "mechanism": "blt",
        "buf_decay": np.asarray(theta).tolist(),
        "output_scale": np.asarray(omega).tolist(),
      }
      out["num_buffers"] = int(np.asarray(theta).size)
      out["self_reported"] = {"max_loss": info.get("max_loss"), "rms_loss": info.get("rms_loss")}
    elif case == "band-toeplitz":
      out["call"] = (
        f"fedmf.mf.toeplitz.optimize_band_toeplitz(n, bands, min_sep, max_participations, "
        f"objective={args.objective!r})"
      )
      out["objective"] = args.objective
      t0 = time.perf_counter()
      coefs, info = toeplitz.optimize_band_toeplitz(n, bands, b, k, objective=args.objective)
      out["seconds"] = time.perf_counter() - t0
      strategy = {
        "mechanism": "band-toeplitz",
        "coefficients": np.asarray(coefs).tolist(),
        "column_normalized": False,
      }
      out["iterations"] = info.get("iterations")
    elif case == "bandmf":
      kwargs = {} if args.max_iter is None else {"max_iter": args.max_iter}
      out["call"] = (
        "fedmf.mf.banded_optimize.optimize_bandmf(n, bands, min_sep=..., "
        f"max_participations=..., objective='rms'{', max_iter=%d' % args.max_iter if kwargs else ''})"
      )
      out["objective"] = "rms"
      t0 = time.perf_counter()
      theta, info = banded_optimize.optimize_bandmf(
        n, bands, min_sep=b, max_participations=k, objective="rms", **kwargs
      )
      out["seconds"] = time.perf_counter() - t0
      theta = np.asarray(theta)
      bh = theta.shape[0]
      strategy = {
        "mechanism": "bandmf",
        "n": n,
        "bands": bh,
        "columns": [theta[: min(bh, n - j), j].tolist() for j in range(n)],
      }
      out["iterations"] = info.get("iterations")
      out["converged"] = info.get("converged")
    elif case in TREE_VARIANTS:
      # Nothing to optimize: time the evaluation itself (the tree's "strategy cost").
      strategy = {"mechanism": "tree", "variant": TREE_VARIANTS[case]}
      out["call"] = f"fedmf.mf.evaluation.evaluate({strategy}, n, min_sep, max_participations)"
      t0 = time.perf_counter()
      evaluation.evaluate(strategy, n, b, k)
      out["seconds"] = time.perf_counter() - t0
    else:
      raise ValueError(f"unknown case {case!r}")
    out["peak_rss_mb"] = _rss_mb()
    with open(args.strategy_out, "w") as f:
      json.dump(
        dict(strategy, optimized_by="fedmf", n_optimized=n, min_sep=b, max_participations=k), f
      )
    out["strategy_path"] = args.strategy_out
    out["ok"] = True
  except Exception as e:  # reported by the driver
    out.update(
      {
        "ok": False,
        "error": f"{type(e).__name__}: {e}",
        "traceback": traceback.format_exc(limit=8),
        "peak_rss_mb": _rss_mb(),
      }
    )
  print(json.dumps(out, default=float), flush=True)
  return 0 if out["ok"] else 1


# ------------------------------------------------------------------------------------------------
# Child processes


def _last_json_line(text: str):
  for line in reversed(text.splitlines()):
    line = line.strip()
    if line.startswith("{"):
      try:
        return json.loads(line)
      except json.JSONDecodeError:
        continue
  return None


def _run_child(
  cmd: list[str], log_path: Path, timeout: float | None, env: dict | None = None
) -> dict:
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired as e:
    log_path.write_text(
      f"$ {' '.join(cmd)}\n(timed out after {timeout} s)\n{e.stdout or ''}\n{e.stderr or ''}"
    )
    return {
      "ok": False,
      "error": f"timed out after {timeout} s",
      "process_seconds": time.perf_counter() - t0,
    }
  log_path.write_text(
    f"$ {' '.join(cmd)}\n--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
  )
  result = _last_json_line(proc.stdout)
  if result is None:
    tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
    result = {
      "ok": False,
      "error": f"exit code {proc.returncode}, no result line; stderr tail:\n{tail}",
    }
  result["process_seconds"] = time.perf_counter() - t0
  result["log"] = str(log_path)
  return result


def _uv() -> str:
  local = ROOT / ".tools" / "bin" / "uv"
  if local.exists():
    return str(local)
  found = shutil.which("uv")
  if not found:
    raise RuntimeError(
      "uv not found: run `python3 dev.py test` once (it installs the pinned uv into .tools/) "
      "or put uv on PATH"
    )
  return found


def _check_reference_python(python: str) -> str | None:
  """None if `python` has the pinned jax_privacy stack, else the reason."""
  code = (
    "import jax, jaxlib, importlib.metadata as m, jax_privacy.matrix_factorization; "
    "print(m.version('jax-privacy'), jax.__version__, jaxlib.__version__)"
  )
  try:
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
  except (OSError, subprocess.TimeoutExpired) as e:
    return str(e)
  if proc.returncode != 0:
    return (proc.stderr.strip().splitlines() or ["import failed"])[-1]
  got = proc.stdout.split()
  want = [REFERENCE_PINS["jax-privacy"], REFERENCE_PINS["jax"], REFERENCE_PINS["jaxlib"]]
  return None if got == want else f"versions {got} != pins {want}"


def ensure_reference_env(env_dir: Path) -> str:
  """Creates (or reuses) the reference virtual environment and returns its python."""
  python = env_dir / "bin" / "python"
  if python.exists() and _check_reference_python(str(python)) is None:
    return str(python)
  uv = _uv()
  env_dir.parent.mkdir(parents=True, exist_ok=True)
  if env_dir.resolve().parent == (ROOT / ".bench-env").resolve():
    # Keep the whole .bench-env/ out of git without touching the repository's .gitignore.
    (env_dir.parent / ".gitignore").write_text("*\n")
  print(
    f"creating the reference environment at {env_dir} (jax-privacy {REFERENCE_PINS['jax-privacy']})",
    flush=True,
  )
  # --no-config: the repository's pyproject.toml has [tool.uv] override-dependencies pinning
  # jaxlib==0.4.13 for fedmf's own lock; uv would apply it to this unrelated environment too.
  cmds = [
    [uv, "venv", "--no-config", "--clear", "--python", REFERENCE_PYTHON, str(env_dir)],
    [uv, "pip", "install", "--no-config", "--python", str(python)]
    + [f"{name}=={version}" for name, version in REFERENCE_PINS.items()],
  ]
  for cmd in cmds:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
  problem = _check_reference_python(str(python))
  if problem:
    raise RuntimeError(f"reference environment at {env_dir} is unusable: {problem}")
  return str(python)


# ------------------------------------------------------------------------------------------------
# Evaluation with fedmf and reporting


def _evaluate(strategy_path: str, args: argparse.Namespace) -> dict:
  from fedmf.mf.evaluation import evaluate

  with open(strategy_path) as f:
    strategy = json.load(f)
  ev = evaluate(strategy, args.n, args.min_sep, args.max_participations)
  return {
    "max_loss": ev.max_loss,
    "rms_loss": ev.rms_loss,
    "sensitivity": ev.sensitivity,
    "sensitivity_method": ev.sensitivity_method,
    "max_error": ev.max_error,
    "rms_error": ev.rms_error,
  }


def _fmt(x, spec: str) -> str:
  return "—" if x is None else format(x, spec)


def _row(rec: dict) -> list[str]:
  f, r = rec.get("fedmf") or {}, rec.get("reference") or {}
  fe, re_ = f.get("fedmf_eval") or {}, r.get("fedmf_eval") or {}
  fs = f.get("seconds") if f.get("ok") else None
  rs = r.get("seconds") if r.get("ok") else None
  ratio = rs / fs if (fs and rs) else None
  setting = rec.get("setting", "")
  if rec["case"] == "blt-auto" or "auto" in setting:
    chose = [
      f"{who} {d['num_buffers']}" for who, d in (("fedmf", f), ("ref", r)) if d.get("num_buffers")
    ]
    if chose:
      setting += f" (chose {', '.join(chose)})"
  if rec["case"] == "bandmf" and f.get("iterations") is not None:
    setting += f" (fedmf ran {f['iterations']})"
  return [
    rec["case"],
    setting,
    _fmt(fs, ".2f") if f.get("ok") or not f else "FAILED",
    _fmt(rs, ".2f") if r.get("ok") or not r else "FAILED",
    _fmt(ratio, ".1f") + ("×" if ratio else ""),
    _fmt(f.get("peak_rss_mb") if f.get("ok") else None, ".0f"),
    _fmt(r.get("peak_rss_mb") if r.get("ok") else None, ".0f"),
    _fmt(fe.get("max_loss"), ".4f"),
    _fmt(re_.get("max_loss"), ".4f"),
    _fmt(fe.get("rms_loss"), ".4f"),
    _fmt(re_.get("rms_loss"), ".4f"),
  ]


HEADER = [
  "case",
  "setting",
  "fedmf s",
  "ref s",
  "ref/fedmf",
  "fedmf MB",
  "ref MB",
  "fedmf MaxLoss",
  "ref MaxLoss",
  "fedmf RmsLoss",
  "ref RmsLoss",
]


def _text_table(rows: list[list[str]]) -> str:
  widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADER)]
  lines = [
    "  ".join(h.ljust(w) for h, w in zip(HEADER, widths)),
    "  ".join("-" * w for w in widths),
  ]
  lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
  return "\n".join(lines)


def _markdown_table(rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * len(HEADER)) + "|"]
  lines += ["| " + " | ".join(r) + " |" for r in rows]
  return "\n".join(lines)


def _setting(case: str, args: argparse.Namespace) -> str:
  if case == "blt":
    return f"{args.blt_objective}, buffers={args.buffers}"
  if case == "blt-auto":
    return f"{args.blt_objective}, buffers=auto"
  if case == "band-toeplitz":
    return f"{args.objective}, bands={args.bands}"
  if case == "bandmf":
    fed = "default" if args.max_iter is None else str(args.max_iter)
    return f"rms, bands={args.bands}, max iters fedmf={fed}, ref={args.reference_max_iter}"
  return f"{TREE_VARIANTS[case]} (evaluation only)" if case in TREE_VARIANTS else ""


def _machine() -> dict:
  info = {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()}
  try:
    info["cpu_model"] = next(
      l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")
    )
    info["loadavg_at_start"] = open("/proc/loadavg").read().split()[:3]
    info["mem_total_gb"] = round(
      int(next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))) / 2**20, 1
    )
  except (OSError, StopIteration):
    pass
  return info


def main(argv=None) -> int:
  args = _parse_args(argv)
  if args.fedmf_worker:
    return _fedmf_worker(args)

  cases = _expand_cases(args.cases)
  machine = _machine()
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  workdir = Path(args.workdir) if args.workdir else ROOT / ".bench-env" / "runs" / stamp
  workdir.mkdir(parents=True, exist_ok=True)
  if not args.workdir:
    (ROOT / ".bench-env" / ".gitignore").write_text("*\n")

  ref_python = None
  ref_problem = None
  if not args.skip_reference and any(c in REFERENCE_CASES for c in cases):
    try:
      if args.reference_python:
        ref_python = args.reference_python
        ref_problem = _check_reference_python(ref_python)
      else:
        ref_python = ensure_reference_env(Path(args.reference_env))
    except Exception as e:
      ref_problem = f"{type(e).__name__}: {e}"
    if ref_problem:
      print(f"reference unavailable: {ref_problem}", file=sys.stderr, flush=True)

  print(
    f"n={args.n} min_sep={args.min_sep} max_participations={args.max_participations} "
    f"bands={args.bands} buffers={args.buffers}; workdir {workdir}",
    flush=True,
  )
  common = [
    "--n",
    str(args.n),
    "--min-sep",
    str(args.min_sep),
    "--max-participations",
    str(args.max_participations),
    "--bands",
    str(args.bands),
  ]
  records = []
  for case in cases:
    rec = {"case": case, "setting": _setting(case, args)}
    # fedmf, in a fresh child of this environment.
    if not args.skip_fedmf:
      out = workdir / f"fedmf-{case}.json"
      cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--fedmf-worker",
        case,
        "--strategy-out",
        str(out),
        "--buffers",
        args.buffers,
        "--blt-objective",
        args.blt_objective,
        "--objective",
        args.objective,
      ] + common
      if args.max_iter is not None:
        cmd += ["--max-iter", str(args.max_iter)]
      print(f"[{case}] fedmf ...", flush=True)
      res = _run_child(cmd, workdir / f"fedmf-{case}.log", args.timeout)
      if res.get("ok"):
        try:
          res["fedmf_eval"] = _evaluate(res["strategy_path"], args)
        except Exception as e:
          res["eval_error"] = f"{type(e).__name__}: {e}"
        print(
          f"[{case}] fedmf: {res['seconds']:.2f} s, peak {res['peak_rss_mb']:.0f} MB, "
          f"losses {res.get('fedmf_eval') or res.get('eval_error')}",
          flush=True,
        )
      else:
        print(f"[{case}] fedmf FAILED: {res.get('error')}\n{res.get('traceback', '')}", flush=True)
      rec["fedmf"] = res
    # The reference, as a second process in its own environment.
    if case in REFERENCE_CASES and not args.skip_reference:
      if ref_problem or ref_python is None:
        rec["reference"] = {"ok": False, "error": f"reference unavailable: {ref_problem}"}
      else:
        out = workdir / f"reference-{case}.json"
        buffers = "auto" if case == "blt-auto" else args.buffers
        cmd = [
          ref_python,
          str(REFERENCE_SCRIPT),
          "--case",
          REFERENCE_CASES[case],
          "--out",
          str(out),
        ] + common
        if case in ("blt", "blt-auto"):
          cmd += ["--buffers", buffers, "--objective", args.blt_objective]
        elif case == "band-toeplitz":
          cmd += ["--objective", args.objective]
        else:
          cmd += ["--objective", "rms", "--max-iter", str(args.reference_max_iter)]
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        print(f"[{case}] jax_privacy ...", flush=True)
        res = _run_child(cmd, workdir / f"reference-{case}.log", args.timeout, env=env)
        if res.get("ok"):
          try:
            res["fedmf_eval"] = _evaluate(res["strategy_path"], args)
          except Exception as e:
            res["eval_error"] = f"{type(e).__name__}: {e}"
          ev = res.get("fedmf_eval") or {}
          # Sanity check of the squared -> unsquared conversion: jax_privacy's own losses must agree
          # with fedmf's evaluation of the same strategy.
          for key in ("max_loss", "rms_loss"):
            if key in ev and res.get(key) and abs(ev[key] - res[key]) > 1e-6 * max(1.0, ev[key]):
              res.setdefault("warnings", []).append(
                f"jax_privacy {key} {res[key]:.6g} != fedmf evaluation {ev[key]:.6g}"
              )
          print(
            f"[{case}] jax_privacy: {res['seconds']:.2f} s, peak {res['peak_rss_mb']:.0f} MB, "
            f"losses {ev or res.get('eval_error')}"
            + (f"; WARNING {res['warnings']}" if res.get("warnings") else ""),
            flush=True,
          )
        else:
          print(
            f"[{case}] jax_privacy FAILED: {res.get('error')}\n{res.get('traceback', '')}",
            flush=True,
          )
        rec["reference"] = res
    records.append(rec)

  rows = [_row(r) for r in records]
  print()
  print(_text_table(rows))
  md = _markdown_table(rows)
  print()
  print(md)
  summary = {
    "params": {
      "n": args.n,
      "min_sep": args.min_sep,
      "max_participations": args.max_participations,
      "bands": args.bands,
      "buffers": args.buffers,
      "blt_objective": args.blt_objective,
      "objective": args.objective,
      "max_iter": args.max_iter,
      "reference_max_iter": args.reference_max_iter,
    },
    "reference_pins": REFERENCE_PINS,
    "machine": machine,
    "workdir": str(workdir),
    "results": records,
    "markdown": md,
  }
  if args.json:
    with open(args.json, "w") as f:
      json.dump(summary, f, indent=1, default=float)
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(md + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
