"""`fedmf simulate`: DP federated training in process, ending in an audit of its own log.

`fedmf simulate --out OUT` runs the default config (simulations/configs/default.yaml: synthetic
next-word data, lstm-small, BLT, a client timer counted in rounds). Any config key can be set with
`--set KEY=VALUE`, by its flat name or inside its section (`--set delta=1e-8` or
`--set privacy.delta=1e-8`; `--set participation.min_sep=20`); docs/simulation.md lists the keys.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fedmf import config_parse
from fedmf import display
from fedmf import quiet
from fedmf.cli import common
from fedmf.errors import FedmfUserError

DESCRIPTION = """\
Simulate differentially private federated training (the papers' FedSGDM as TFF computations) with a
correlated-noise mechanism under a realistic participation model, then audit the participation log
the run wrote. Outputs in OUT: config.json, plan.json, participation.csv, metrics.csv, tensorboard/,
strategy.json, audit.json, report.html and report.md (the audit), epsilon_curve.csv and the plots
(*.png), summary.json, and run.json (the run id and every file's sha256); `fedmf audit OUT` audits
the run again from these files. The run is written beside OUT and replaces it only once finished:
an interrupted run leaves OUT as it was.

Config keys (YAML; see docs/simulation.md): task (synthetic | stackoverflow), num_clients, model
(lstm-small | lstm-paper), vocab_size, rounds, clients_per_round, mechanism (dpsgd | tree | bandmf |
blt), bands, strategy (a strategy file; replaces mechanism), target_epsilon, noise_multiplier (sigma
applied to C as loaded: the sum gets clip_norm * sigma * [C^-1 z]_t, as TFF's gaussian_fixed and
tree_aggregation noise_multiplier; see docs/noise-multiplier.md for jax_privacy's; 0 trains without
DP, a baseline whose outputs say "no privacy guarantee"), delta, seed, noise_seed,
reference_clients_per_round (the papers' cheap simulation: sigma is scaled so the noise on the mean
matches that cohort), participation.model (timer | epoch_shuffle | uniform | cyclic_poisson),
participation.timer_unit (rounds | hours), participation.min_sep, participation.timer_hours,
participation.early_checkin_rate, participation.server_guard, and the training recipe (clip_norm,
client_learning_rate, server_learning_rate, server_momentum, warmup_fraction, cooldown_fraction,
eval_every, ...), and canary clients that measure the privacy the run really has (canaries.count,
canaries.held_out, canaries.seed, canaries.pattern: participation | worst-case; canaries.npz and the
audit's "measured privacy", docs/empirical-privacy.md). Each key may also be written inside its
section (task, privacy, recipe, program, participation, platform, canaries), e.g. privacy:
{mechanism: blt}."""


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
    type=config_parse.override_argument,
    metavar="KEY=VALUE",
    help="override a config key by its flat name or section.key, e.g. --set rounds=50 "
    "--set privacy.delta=1e-8 --set participation.min_sep=20 (repeatable; docs/simulation.md)",
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
  parser = common.add_command(
    subparsers, "simulate", "simulate DP federated training and audit the run", DESCRIPTION
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
  from fedmf.program import preflight  # pylint: disable=g-import-not-at-top

  config = load(args)  # Validated (the strategy file included) before TensorFlow is imported.
  preflight.check(config)  # The model's memory, the sampling: a second, not a minute.
  common.check_creatable_dir(args.out)
  from fedmf.program import outputs  # pylint: disable=g-import-not-at-top

  outputs.check_output_dir(Path(args.out), args.force, outputs.RUN_MARKERS)
  # Progress from here: importing TensorFlow alone can take minutes on a loaded machine.
  from fedmf import progress  # pylint: disable=g-import-not-at-top

  bar = progress.Progress(
    config.program.rounds,
    enabled=not args.no_progress,
    every=config.program.eval_every,
    stage="importing TensorFlow",
  )
  log = (lambda line: print(line, file=sys.stderr)) if args.json else print
  try:
    quiet.import_tensorflow_quietly()
    from fedmf.program.simulate import run_simulation  # pylint: disable=g-import-not-at-top

    summary = run_simulation(config, args.out, progress=bar, force=args.force, log=log)
  except FedmfUserError as e:
    raise common.without_accountant_hint(e) from None
  finally:
    bar.close()
  if args.json:
    print(outputs.json_text(summary, indent=None))
    return 0
  for line in summary_lines(summary, args.out):
    print(line)
  return 0


def _epsilon(value: Any) -> str:
  if not isinstance(value, (int, float)):
    return "unknown"
  return display.epsilon(value)


def summary_lines(summary: dict[str, Any], out: str) -> list[str]:
  """The end-of-run summary in words: every number once, every artifact once, no None."""
  a = summary["audit"]
  from fedmf.program.outputs import plural  # pylint: disable=g-import-not-at-top

  # Without DP no noise is added: naming the strategy would say it was used.
  dp = (
    f"DP FedAvg ({summary['strategy']}, "
    if summary["noise_multiplier"]
    else ("FedAvg without DP (")
  )
  lines = [
    f"simulated {plural(summary['rounds_completed'], 'round')} of {dp}"
    f"{summary['clients_per_round']} of {plural(summary['num_clients'], 'client')} per round) in "
    f"{summary['seconds']:.1f} s"
  ]
  final = summary.get("final_test_accuracy")
  accuracy = f"{summary['initial_test_accuracy']:.4f} -> " + (
    f"{final:.4f}" if final is not None else "not evaluated"
  )
  lines.append(f"  test accuracy        {accuracy} ({summary['accuracy_note']})")
  sigma = summary["noise_multiplier"]
  if not sigma:
    lines.append("  noise multiplier     0 (no DP: a baseline for comparison)")
  elif summary.get("training_noise_multiplier") not in (None, sigma):
    lines.append(
      f"  noise multiplier     {sigma:.6g} (training used {summary['training_noise_multiplier']:.4g}: "
      "cheap simulation, see report.html)"
    )
  else:
    lines.append(f"  noise multiplier     {sigma:.6g}")
  b = a["observed_min_sep"]
  lines.append(
    f"  realized b, k        {b if b is not None else 'none (single participation)'}, "
    f"{a['observed_max_participations']}"
  )
  if a.get("privacy_guarantee") is False and not sigma:
    lines.append("  privacy (audit)      no privacy guarantee (noise multiplier 0)")
  elif a.get("privacy_guarantee") is False:
    lines.append(
      f"  privacy (audit)      no privacy guarantee (epsilon {_epsilon(a['epsilon'])} "
      "rests on a lower-bound sensitivity)"
    )
  else:
    # A declared cyclic Poisson sampling: say whether the log earned the amplification.
    how = ""
    if a.get("epsilon_amplified"):
      how = " (amplified: the log complies with the cyclic Poisson partitions)"
    elif a.get("epsilon_amplified") is False:
      how = (
        f" (NOT amplified: {a.get('partition_violations', 0)} devices outside their partition"
        " or no theorem covers the strategy; see audit.json)"
      )
    lines.append(
      f"  privacy (audit)      epsilon {_epsilon(a['epsilon'])} at delta {a['delta']:g}{how}"
    )
  lines.append(f"  check-ins refused    {summary['refused_checkins']}")
  if summary.get("zeroed_updates"):
    lines.append(
      f"  updates zeroed       {summary['zeroed_updates']} (non-finite or above zeroing_linf; "
      "metrics.csv says which rounds)"
    )
  lines.append(f"  violations           {summary['violations']}")
  report = Path(out) / "report.html"
  if report.is_file():
    lines.append(f"  report               {report}")
  names = (
    "summary.json",
    "metrics.csv",
    "participation.csv",
    "strategy.json",
    "audit.json",
    "report.md",
    "epsilon_curve.csv",
    "run.json",
  )
  present = [name for name in names if (Path(out) / name).is_file()]
  if any(Path(out).glob("*.png")):
    present.insert(-1, "plots")
  listed = f" ({', '.join(present)})" if present else ""
  lines.append(f"  outputs              {out}{listed}")
  return lines
