"""`fedmf simulate`: DP FedAvg on the built-in synthetic dataset, ending in a privacy audit."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fedmf.cli import common


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "simulate",
    help="simulate DP FedAvg on synthetic data and audit the run",
    description="Simulate DP FedAvg (TFF) on the built-in synthetic federated dataset: a client timer "
    "enforces b-min-separation, fedmf's correlated-noise aggregator privatizes the mean, every "
    "participation is logged, and the run ends with an audit of that log.",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument(
    "--strategy", required=True, metavar="FILE.json", help="strategy file (fedmf strategy optimize)"
  )
  parser.add_argument(
    "--rounds", type=common.positive_int, required=True, help="number of rounds n"
  )
  parser.add_argument(
    "--min-sep",
    type=common.positive_int,
    required=True,
    help="b enforced by the client timer (a client may rejoin b rounds after it joined)",
  )
  parser.add_argument(
    "--max-participations",
    type=common.positive_int,
    default=None,
    help="k cap per client (default: none, i.e. ceil(n/b))",
  )
  parser.add_argument("--clients-per-round", type=common.positive_int, default=10)
  parser.add_argument("--clients", type=common.positive_int, default=200, help="population size")
  parser.add_argument(
    "--availability", type=float, default=1.0, help="probability a device is online in a round"
  )
  noise = parser.add_mutually_exclusive_group(required=True)
  noise.add_argument(
    "--noise-multiplier", type=common.positive_float, help="σ applied to C as loaded"
  )
  noise.add_argument(
    "--target-epsilon",
    type=common.positive_float,
    help="calibrate σ for this ε under the declared (b, k) before training",
  )
  parser.add_argument("--delta", type=common.probability, default=1e-6)
  parser.add_argument("--clip-norm", type=common.positive_float, default=1.0)
  parser.add_argument("--client-lr", type=common.positive_float, default=0.1)
  parser.add_argument("--server-lr", type=common.positive_float, default=1.0)
  parser.add_argument("--server-momentum", type=float, default=0.9)
  parser.add_argument("--eval-every", type=common.positive_int, default=10)
  parser.add_argument("--seed", type=int, default=0, help="data and cohort seed")
  parser.add_argument(
    "--noise-seed",
    type=int,
    default=None,
    help="DP noise seed (default: OS randomness; a fixed seed makes the noise predictable)",
  )
  parser.add_argument("--out", required=True, help="output directory")
  parser.add_argument(
    "--no-report", action="store_true", help="skip the markdown/HTML audit report"
  )
  parser.add_argument("--no-progress", action="store_true")
  parser.add_argument("--json", action="store_true", help="print the summary as JSON")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from fedmf.simulation.fedavg import SimulationConfig, run_simulation

  if not 0 < args.availability <= 1:
    raise ValueError(f"--availability must lie in (0, 1], got {args.availability}")
  config = SimulationConfig(
    strategy=args.strategy,
    rounds=args.rounds,
    min_sep=args.min_sep,
    max_participations=args.max_participations,
    clients_per_round=args.clients_per_round,
    num_clients=args.clients,
    availability=args.availability,
    noise_multiplier=args.noise_multiplier,
    target_epsilon=args.target_epsilon,
    delta=args.delta,
    clip_norm=args.clip_norm,
    client_learning_rate=args.client_lr,
    server_learning_rate=args.server_lr,
    server_momentum=args.server_momentum,
    eval_every=args.eval_every,
    seed=args.seed,
    noise_seed=args.noise_seed,
  )
  summary = run_simulation(
    config, args.out, progress=not args.no_progress, report=not args.no_report
  )
  if args.json:
    json.dump(summary, sys.stdout)
    print()
    return 0
  a = summary["audit"]
  print(
    f"simulated {summary['rounds']} rounds of DP FedAvg with {summary['strategy']} "
    f"({summary['clients_per_round']} of {summary['num_clients']} clients per round) in {summary['seconds']:.1f} s"
  )
  print(f"  noise multiplier      {summary['noise_multiplier']:.6g}")
  print(
    f"  test accuracy         {summary['initial_test_accuracy']:.3f} -> {summary['final_test_accuracy']:.3f}"
  )
  print(f"  realized b, k         {a['observed_min_sep']}, {a['observed_max_participations']}")
  print(f"  sensitivity           {a['sensitivity']:.6g} ({a['sensitivity_method']})")
  print(
    f"  privacy               rho={a['rho']:.6g} zCDP, epsilon={a['epsilon']:.6g} at delta={a['delta']:g}"
  )
  print(f"  violations            {summary['violations']}")
  for name, path in summary["outputs"].items():
    if path:
      print(f"  {name:<20}  {path}")
  return 0
