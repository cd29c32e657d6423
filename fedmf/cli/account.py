"""`fedmf account`: sensitivity, ρ-zCDP and ε of a strategy, or the noise multiplier for a target ε.

Notation as docs/architecture.md: --min-sep is the gap b (|i-j| ≥ b), never b-1.
"""

from __future__ import annotations

import argparse
from typing import Any

from fedmf import jsonio
from fedmf.cli import common
from fedmf.errors import FedmfUserError


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "account",
    help="privacy accounting of a strategy (rho-zCDP, epsilon; calibrate sigma)",
    description="Compute the sensitivity of a strategy for n rounds under b-min-separation with "
    "at most k participations, then rho-zCDP and epsilon at delta (the exact Gaussian curve; PLD for amplification), for a "
    "given noise multiplier, or the noise multiplier that reaches a target epsilon.",
    formatter_class=common.HelpFormatter,
  )
  parser.add_argument("strategy", metavar="STRATEGY.json", help="strategy file")
  common.add_participation_args(parser, required=False)
  noise = parser.add_mutually_exclusive_group(required=True)
  noise.add_argument(
    "--noise-multiplier", type=common.positive_float, metavar="SIGMA", help=common.SIGMA_HELP
  )
  noise.add_argument(
    "--target-epsilon",
    type=common.positive_float,
    metavar="EPS",
    help="calibrate sigma to reach this epsilon",
  )
  parser.add_argument(
    "--delta", type=common.probability, required=True, metavar="DELTA", help="delta in (0, 1)"
  )
  adaptive = parser.add_argument_group(
    "adaptive clipping",
    "the noisy counts of clip_norm: adaptive (Andrew et al. 2021; docs/mechanisms.md): a device in "
    "k rounds is in k count releases, composed with the strategy (mu^2 = (s/sigma)^2 + k/z_b^2)",
  )
  counts = adaptive.add_mutually_exclusive_group()
  counts.add_argument(
    "--count-noise-multiplier",
    type=common.positive_float,
    metavar="Z_B",
    help="z_b: the count's noise std divided by 1/2 (Andrew et al.'s sigma_b = m/20 is m/10)",
  )
  counts.add_argument(
    "--count-budget-fraction",
    type=float,
    metavar="F",
    help="with --target-epsilon: spend the fraction F in (0, 1) of rho on the counts (z_b follows)",
  )
  common.add_method_args(
    parser,
    accountant_help="analytic: the exact Gaussian curve of the claim (Balle & Wang 2018, Thm. 8); "
    "pld: dp_accounting's PLD, pessimistic by its discretization, as a cross-check (default: "
    "analytic; with amplification pld, the only accountant of a Poisson-subsampled event)",
  )
  amp = parser.add_argument_group(
    "amplification",
    "b-cyclic Poisson sampling (BandMF §5, App. F): the examples are split into P partitions, "
    "round i samples partition i mod P with probability q = P*BATCH/N_DATA; with both flags the "
    "strategy is accounted with amplification (--min-sep/--max-participations are then not used)",
  )
  common.add_sampling_args(amp)
  amp.add_argument(
    "--partitions",
    type=common.positive_int,
    default=None,
    metavar="P",
    help="number of partitions P (default: the strategy's bands; 1 for dpsgd)",
  )
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  common.add_resource_args(parser)
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  if args.dataset_size is not None or args.batch_size is not None:
    return _run_amplified(args)
  if args.partitions is not None:
    raise FedmfUserError("--partitions needs --dataset-size and --batch-size (amplification)")
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top
  from fedmf.mf.schema import ParticipationSchema  # pylint: disable=g-import-not-at-top
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top

  strategy = load_strategy(args.strategy)
  schema = ParticipationSchema(args.n, args.min_sep, args.max_participations)
  counts = {}
  if args.count_noise_multiplier is not None:
    counts["count_noise_multiplier"] = args.count_noise_multiplier
  if args.count_budget_fraction is not None:
    if args.target_epsilon is None:
      raise FedmfUserError("--count-budget-fraction needs --target-epsilon (it splits the target)")
    if not 0 < args.count_budget_fraction < 1:
      raise FedmfUserError(
        f"--count-budget-fraction must lie in (0, 1), got {args.count_budget_fraction:g}"
      )
    counts["count_budget_fraction"] = args.count_budget_fraction
  # σ calibrated to the target ε, or ε of the given σ: the same arguments either way.
  if args.target_epsilon is not None:
    accountant, value = accounting.calibrate_noise_multiplier, args.target_epsilon
  else:
    accountant, value = accounting.account, args.noise_multiplier
  result = accountant(
    strategy,
    schema,
    value,
    args.delta,
    method=args.sensitivity,
    accountant=args.accountant or accounting.CLAIM_ACCOUNTANT,
    **counts,
  )
  fields = {"min_sep": args.min_sep, "max_participations": args.max_participations}
  if _print_head(args, strategy, {**fields, **result.to_dict()}, schema.describe()):
    return 0
  print(
    f"sensitivity: {result.sensitivity:.6g} ({result.sensitivity_method}, "
    f"{result.sensitivity_algorithm})"
  )
  label = "noise_multiplier (calibrated)" if args.target_epsilon is not None else "noise_multiplier"
  print(f"{label}: {result.noise_multiplier:.6g}")
  if result.adaptive:
    print(
      f"adaptive clipping: {result.count_releases} count releases per device at count noise "
      f"multiplier {result.count_noise_multiplier:.6g} (composed in)"
    )
  print(f"rho (zCDP): {result.rho:.6g}")
  print(f"epsilon: {result.epsilon:.6g} at delta = {result.delta:g} ({result.accountant})")
  if result.epsilon == 0:
    # Not a rounding: with this much noise (0, delta)-DP holds, so every smaller target is met.
    print(
      f"note: epsilon 0 is not a rounding: (0, {result.delta:g})-DP holds, the privacy loss "
      "exceeds 0 only with probability delta"
    )
  if result.sensitivity_method == "lower-bound":
    print("warning: the sensitivity is a lower bound; epsilon is not a guarantee")
  return 0


def _print_head(args, strategy, fields: dict, participation: str) -> bool:
  """Prints the JSON object (then True: done) or the text lines every accounting starts with."""
  out = {"strategy": args.strategy, "mechanism": strategy.mechanism, "n": args.n, **fields}
  out["calibrated"] = args.target_epsilon is not None
  if args.target_epsilon is not None:
    out["target_epsilon"] = args.target_epsilon
  if args.json:
    print(jsonio.json_text(out, indent=None))
    return True
  print(f"strategy: {args.strategy} ({strategy.describe()})")
  print(f"participation: {participation}")
  return False


def _run_amplified(args: argparse.Namespace) -> int:
  if args.count_noise_multiplier is not None or args.count_budget_fraction is not None:
    raise FedmfUserError(
      "adaptive clipping's count releases are not accounted with amplification: drop "
      "--dataset-size/--batch-size or the count flags"
    )
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import amplification  # pylint: disable=g-import-not-at-top

  if args.dataset_size is None or args.batch_size is None:
    raise FedmfUserError("amplification needs both --dataset-size and --batch-size")
  strategy = load_strategy(args.strategy)
  strategy.check_horizon(args.n)
  partitions = args.partitions
  if partitions is None:
    partitions = amplification.band_and_column_norm(strategy, args.n)[0]
  sampling = amplification.CyclicPoissonSampling(args.dataset_size, args.batch_size, partitions)
  result = amplification.account_amplified(
    strategy,
    args.n,
    sampling,
    args.delta,
    noise_multiplier=args.noise_multiplier,
    target_epsilon=args.target_epsilon,
    accountant=args.accountant or accounting.AMPLIFIED_ACCOUNTANT,
  )
  if _print_head(args, strategy, result.to_dict(), sampling.describe(args.n)):
    return 0
  print(f"max column norm of C: {result.max_column_norm:.6g} ({result.bands} bands)")
  label = "noise_multiplier (calibrated)" if args.target_epsilon is not None else "noise_multiplier"
  print(f"{label}: {result.noise_multiplier:.6g}")
  print(
    f"epsilon: {result.epsilon:.6g} at delta = {result.delta:g} (amplified, {result.accountant})"
  )
  return 0
