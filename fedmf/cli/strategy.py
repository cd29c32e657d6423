"""`fedmf strategy optimize|evaluate`: build strategy files and report their sensitivity and error."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from typing import Any, Optional

from fedmf import jsonio
from fedmf.cli import common
from fedmf.errors import FedmfUserError

logger = logging.getLogger("fedmf.strategy")

# The mechanisms `strategy optimize` builds (fedmf.mf.strategies.OPTIMIZABLE; a dense C comes from
# a file). Listed here so that `fedmf --help` does not import numpy.
MECHANISM_CHOICES = ("dpsgd", "tree", "bandmf", "band-toeplitz", "blt")


def _bands(text: str):
  return "auto" if text == "auto" else common.positive_int(text)


_AUTO_FLAGS = ("target_epsilon", "delta", "dataset_size", "batch_size")
# The flags that are the `OptimizeOptions` fields of the same names.
_OPTIMIZER_FLAGS = (
  "bands", "buffers", "objective", "tree_variant", "column_normalize", "max_iter", "seed",
)  # fmt: skip


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "strategy",
    help="optimize and evaluate correlated-noise strategies",
    description="Optimize correlated-noise strategies and evaluate their sensitivity and error.",
  )
  sub = parser.add_subparsers(dest="strategy_command", metavar="SUBCOMMAND")
  sub.required = True

  opt = sub.add_parser(
    "optimize",
    help="optimize a strategy and write it as JSON",
    description="Optimize a strategy for n rounds under b-min-separation with at most k participations, "
    "for the prefix-sum workload, and write it as a strategy JSON file.",
    formatter_class=common.HelpFormatter,
  )
  opt.add_argument(
    "--mechanism",
    required=True,
    choices=MECHANISM_CHOICES,
    help="dpsgd: independent noise; tree: TreeAgg; bandmf: banded MF (BandMF); band-toeplitz: "
    "banded Toeplitz (Scaling BandMF); blt: buffered linear Toeplitz (BLT)",
  )
  common.add_participation_args(opt)
  opt.add_argument(
    "--bands",
    type=_bands,
    default=None,
    help="b̂ for bandmf and band-toeplitz (default: min-sep, capped at n); 'auto' (bandmf): "
    "choose b̂ under amplification by cyclic Poisson sampling for --target-epsilon, --delta, "
    "--dataset-size and --batch-size (BandMF §5)",
  )
  auto = opt.add_argument_group("--bands auto (amplified BandMF, BandMF §5 and App. G)")
  auto.add_argument(
    "--target-epsilon", type=common.positive_float, default=None, metavar="EPS", help="target ε"
  )
  auto.add_argument(
    "--delta", type=common.probability, default=None, metavar="DELTA", help="δ in (0, 1)"
  )
  common.add_sampling_args(auto)
  opt.add_argument(
    "--buffers",
    type=common.positive_int,
    default=None,
    help="number of BLT buffers (default: chosen automatically)",
  )
  opt.add_argument(
    "--objective",
    choices=("max", "rms"),
    default=None,
    help="loss to minimize (default: rms for bandmf and band-toeplitz, max for blt)",
  )
  opt.add_argument(
    "--tree-variant",
    choices=("vanilla", "online-honaker", "full-honaker"),
    default="online-honaker",
    help="tree decoding: vanilla dyadic sums; online-honaker, tensorflow_privacy's efficient tree; "
    "full-honaker (Honaker 2015) cannot drive training (its decoder needs future rounds) and is "
    "for evaluation only",
  )
  opt.add_argument(
    "--column-normalize",
    action="store_true",
    help="band-toeplitz: store the strategy as column-normalized (Scaling BandMF §3.1)",
  )
  opt.add_argument(
    "--max-iter",
    type=common.positive_int,
    default=None,
    metavar="N",
    help="optimizer iteration budget (default: the optimizer's own)",
  )
  opt.add_argument(
    "--seed", type=common.seed, default=0, help="seed for multi-start optimizers, in [0, 2^64)"
  )
  opt.add_argument("--out", required=True, metavar="FILE.json", help="output strategy JSON file")
  opt.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  common.add_resource_args(opt)
  opt.add_argument("--json", action="store_true", help="print the evaluation of the result as JSON")
  opt.add_argument(
    "--no-progress",
    action="store_true",
    help="no progress bar (on a terminal) or progress lines (every 30 s otherwise, with the ETA)",
  )
  opt.set_defaults(func=run_optimize)

  ev = sub.add_parser(
    "evaluate",
    help="sensitivity, error and loss of a strategy file",
    description="Evaluate a strategy file: sensitivity (and how it was obtained), MaxError, RmsError, "
    "MaxLoss and RmsLoss for the prefix-sum workload (or --workload).",
    formatter_class=common.HelpFormatter,
  )
  ev.add_argument("strategy", metavar="FILE.json", help="strategy file")
  common.add_participation_args(ev)
  common.add_method_args(ev)
  ev.add_argument(
    "--workload",
    choices=("prefix", "momentum"),
    default="prefix",
    help="prefix: prefix sums; momentum: SGD with momentum 0.95",
  )
  ev.add_argument(
    "--noise-multiplier",
    type=common.positive_float,
    default=None,
    metavar="SIGMA",
    help="also report the RMSE at this noise multiplier (applied to C as loaded; see "
    "docs/noise-multiplier.md)",
  )
  ev.add_argument("--json", action="store_true", help="print one JSON object")
  common.add_resource_args(ev)
  ev.set_defaults(func=run_evaluate)


def _evaluation_dict(evaluation, noise_multiplier: Optional[float] = None) -> dict[str, Any]:
  out = evaluation.to_dict()
  if noise_multiplier is not None:
    out["noise_multiplier"] = noise_multiplier
    out["rmse"] = evaluation.rmse(noise_multiplier)
    if not math.isfinite(out["rmse"]):
      raise FedmfUserError(
        f"--noise-multiplier {noise_multiplier:g}: the RMSE σ·RmsError overflows float64"
      )
  return out


def _print_table(title: str, rows: list[tuple[str, Any]]) -> None:
  print(title)
  width = max(len(k) for k, _ in rows)
  for key, value in rows:
    if isinstance(value, float):
      value = f"{value:.6g}"
    print(f"  {key:<{width}}  {value}")


def _print_evaluation(path: str, out: dict[str, Any]) -> None:
  _print_table(
    f"strategy {path} ({out['mechanism']}), n={out['n']}, workload={out['workload']}",
    [
      ("min-sep b", out["min_sep"]),
      ("max participations k", out["max_participations"]),
      ("effective k", out["effective_max_participations"]),
      (
        "sensitivity",
        f"{out['sensitivity']:.6g}  ({out['sensitivity_method']}, {out['sensitivity_algorithm']})",
      ),
      ("max error", out["max_error"]),
      ("rms error", out["rms_error"]),
      ("max loss", out["max_loss"]),
      ("rms loss", out["rms_loss"]),
    ]
    + (
      [("rmse @ noise multiplier", f"{out['rmse']:.6g} @ {out['noise_multiplier']}")]
      if "rmse" in out
      else []
    ),
  )


def run_evaluate(args: argparse.Namespace) -> int:
  from fedmf.mf import evaluation, strategies
  from fedmf.mf.schema import ParticipationSchema

  strategy = strategies.load_strategy(args.strategy)
  schema = ParticipationSchema(args.n, args.min_sep, args.max_participations)
  result = evaluation.evaluate(strategy, schema, workload=args.workload, method=args.sensitivity)
  out = _evaluation_dict(result, args.noise_multiplier)
  if args.json:
    sys.stdout.write(jsonio.json_text(out, indent=None))
    print()
  else:
    _print_evaluation(args.strategy, out)
  return 0


class _Progress:
  """The optimizers' `progress(dict)` callbacks shown on stderr (`fedmf.progress`): a bar on a
  terminal, else a line every 30 s with the steps done, the elapsed time, the recent time per step
  and the ETA (an upper bound: an optimizer may converge before its iteration budget)."""

  def __init__(self, enabled: bool, total: Optional[int], desc: str, every_seconds: float = 30.0):
    from fedmf import progress  # pylint: disable=g-import-not-at-top

    self.bar = progress.Progress(
      total,
      unit="step",
      label=desc,
      every=None,
      seconds=every_seconds,
      enabled=enabled,
      total_is_bound=True,
      stream=sys.stderr,
    )

  def __call__(self, info: dict[str, Any]) -> None:
    postfix = {
      k: (f"{v:.6g}" if isinstance(v, float) else v)
      for k, v in info.items()
      if k in ("loss", "start", "buffers", "objective", "bands")
    }
    self.bar.update(None, postfix)

  def close(self) -> None:
    self.bar.close()


def run_optimize(args: argparse.Namespace) -> int:
  import dataclasses

  from fedmf.mf import evaluation, resources, strategies
  from fedmf.mf.schema import ParticipationSchema

  common.check_output_file(args.out, "--out", force=args.force)
  given = [f"--{f.replace('_', '-')}" for f in _AUTO_FLAGS if getattr(args, f) is not None]
  if args.bands == "auto":
    if not strategies.mechanism_class(args.mechanism).bands_chosen_under_amplification:
      takers = [
        m
        for m in strategies.MECHANISMS
        if strategies.mechanism_class(m).bands_chosen_under_amplification
      ]
      raise FedmfUserError(f"--bands auto needs --mechanism {' or '.join(takers)}")
    missing = [f"--{f.replace('_', '-')}" for f in _AUTO_FLAGS if getattr(args, f) is None]
    if missing:
      raise FedmfUserError(f"--bands auto needs {', '.join(missing)}")
    from fedmf.cli import strategy_auto  # pylint: disable=g-import-not-at-top

    return strategy_auto.run(args, _Progress)
  if given:
    raise FedmfUserError(f"{', '.join(given)} only apply with --bands auto")
  schema = ParticipationSchema(args.n, args.min_sep, args.max_participations)
  options = strategies.OptimizeOptions(**{f: getattr(args, f) for f in _OPTIMIZER_FLAGS})
  mechanism = strategies.mechanism_class(args.mechanism)
  # The optimizer and the evaluation of its result, estimated before either starts.
  resources.check(
    mechanism.optimize_cost(schema, options), f"optimizing {args.mechanism} at n={args.n}"
  )
  bar = _Progress(  # A bar on a terminal (it redraws its line with \r), else plain lines.
    not args.no_progress and mechanism.optimizer_reports_progress,
    mechanism.optimizer_iterations(options),
    f"optimize {args.mechanism}",
  )
  start = time.perf_counter()
  try:
    strategy, info = mechanism.optimize(schema, dataclasses.replace(options, progress=bar))
  finally:
    bar.close()
  seconds = time.perf_counter() - start
  result = evaluation.evaluate(strategy, schema)
  metadata = {
    "optimized_for": {
      "n": args.n,
      "min_sep": args.min_sep,
      "max_participations": args.max_participations,
      "objective": info.get("objective"),
      "workload": "prefix",
    },
    "loss": {
      "max_loss": result.max_loss,
      "rms_loss": result.rms_loss,
      "sensitivity": result.sensitivity,
      "sensitivity_method": result.sensitivity_method,
    },
    "optimizer_seconds": round(seconds, 3),
  }
  strategies.save_strategy(strategy, args.out, **metadata)
  logger.info("wrote %s (%s) in %.1f s", args.out, strategy.describe(), seconds)
  out = _evaluation_dict(result)
  out["out"] = args.out
  out["optimizer_seconds"] = seconds
  if args.json:
    sys.stdout.write(jsonio.json_text(out, indent=None))
    print()
  else:
    _print_evaluation(args.out, out)
    print(f"  {'optimizer time':<22}  {seconds:.2f} s")
  return 0
