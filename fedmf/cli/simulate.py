"""`fedmf simulate`: DP federated training in process, ending in an audit of its own log.

`fedmf simulate --out OUT` runs the default config (simulations/configs/default.yaml: synthetic
next-word data, lstm-small, BLT, a client timer counted in rounds). Any config key can be set with
`--set KEY=VALUE` (dotted keys for sections, e.g. `--set participation.min_sep=20`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fedmf.cli import common

DESCRIPTION = """\
Simulate differentially private federated training (the papers' FedSGDM as TFF computations) with a
correlated-noise mechanism under a realistic participation model, then audit the participation log
the run wrote. Outputs in OUT: config.json, plan.json, participation.csv, metrics.csv, tensorboard/,
audit.json, report.html and summary.json.

Config keys (YAML; see docs/simulation.md): task (synthetic | stackoverflow), num_clients, model
(lstm-small | lstm-paper), vocab_size, rounds, clients_per_round, mechanism (dpsgd | tree | bandmf |
blt), bands, strategy (a strategy file; replaces mechanism), target_epsilon, noise_multiplier (sigma
applied to C as loaded, the accountant's convention: the sum gets clip_norm * sigma * [C^-1 z]_t;
0 trains without DP), delta, seed, noise_seed, reference_clients_per_round (the papers' cheap
simulation: sigma is scaled so the noise on the mean matches that cohort), participation.model
(timer | epoch_shuffle | uniform | cyclic_poisson), participation.timer_unit (rounds | hours),
participation.min_sep, participation.timer_hours, participation.early_checkin_rate,
participation.server_guard, and the training recipe (clip_norm, client_learning_rate,
server_learning_rate, server_momentum, warmup_fraction, cooldown_fraction, eval_every, ...)."""


def default_config_path() -> Path:
  """simulations/configs/default.yaml of this checkout."""
  return Path(__file__).resolve().parents[2] / "simulations" / "configs" / "default.yaml"


def add_config_args(parser: argparse.ArgumentParser) -> None:
  """--config, --set and --data-dir (shared with `fedmf train`)."""
  parser.add_argument(
    "--config", metavar="FILE", help="YAML config (default: simulations/configs/default.yaml)"
  )
  parser.add_argument(
    "--set",
    dest="overrides",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config key, e.g. --set rounds=50 --set participation.min_sep=20 (repeatable)",
  )
  parser.add_argument(
    "--data-dir", metavar="DIR", help="directory holding stackoverflow.sqlite (task stackoverflow)"
  )


def load(args: argparse.Namespace):
  from fedmf.program.config import load_config  # pylint: disable=g-import-not-at-top

  path = args.config
  if path is None and default_config_path().is_file():
    path = default_config_path()
  return load_config(path, args.overrides, data_dir=args.data_dir)


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "simulate",
    help="simulate DP federated training and audit the run",
    description=DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  add_config_args(parser)
  parser.add_argument("--out", required=True, metavar="OUT", help="output directory")
  parser.add_argument(
    "--force", action="store_true", help="overwrite an output directory that holds another run"
  )
  parser.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
  common.add_resource_args(parser)
  parser.add_argument("--json", action="store_true", help="print summary.json to stdout")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from fedmf.program import loop  # pylint: disable=g-import-not-at-top
  from fedmf.program.simulate import run_simulation  # pylint: disable=g-import-not-at-top

  config = load(args)
  common.check_creatable_dir(args.out)
  log = (lambda line: print(line, file=sys.stderr)) if args.json else print
  summary = run_simulation(
    config, args.out, progress=not args.no_progress, force=args.force, log=log
  )
  if args.json:
    json.dump(summary, sys.stdout, default=str)
    print()
    return 0
  a = summary["audit"]
  print(
    f"simulated {summary['rounds_completed']} rounds of DP FedAvg ({summary['strategy']}, "
    f"{summary['clients_per_round']} of {summary['num_clients']} clients per round) in "
    f"{summary['seconds']:.1f} s"
  )
  print(
    f"  test accuracy        {summary['initial_test_accuracy']:.4f} -> "
    f"{summary['final_test_accuracy']:.4f}  ({summary['accuracy_note']})"
  )
  print(f"  noise multiplier     {summary['noise_multiplier']:.6g}")
  print(
    f"  realized b, k        {a['observed_min_sep'] if a['observed_min_sep'] is not None else 'none (single participation)'}, "
    f"{a['observed_max_participations']}"
  )
  print(
    f"  privacy (audit)      epsilon {loop.format_epsilon(a['epsilon'])} at delta {a['delta']:g}"
  )
  print(f"  check-ins refused    {summary['refused_checkins']}")
  print(f"  violations           {summary['violations']}")
  print(
    f"  outputs              {args.out} (report.html, summary.json, metrics.csv, participation.csv)"
  )
  return 0
