"""`fedmf train`: the resumable training program (tff.program style) in a ROOT directory.

Rerunning the same command with the same ROOT resumes from the last checkpoint; the result is the
same model and noise as an uninterrupted run. See deploy/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fedmf.cli import common
from fedmf import quiet
from fedmf.errors import FedmfUserError
from fedmf.cli import simulate as simulate_cli

DESCRIPTION = """\
Run DP federated training as a resumable program: checkpoints (owner-only: they hold the noise seed)
every checkpoint_every rounds, a durable participation log, metrics releases (CSV, TensorBoard),
model releases (release/model_round_R.npz, release/final_model.npz), an optional privacy budget
guard (budget.epsilon: stop before a round whose release would exceed it) and TFF workers (workers: W
starts W local ones, each in a network namespace of its own; workers: ["HOST:PORT", ...] uses
`fedmf worker` services on other hosts, over mutual TLS with worker_tls). Rerunning the same command with the
same --root resumes after a crash or kill, releasing exactly what the uninterrupted run would have.

The config keys are those of `fedmf simulate` plus checkpoint_every and budget.epsilon; see
deploy/README.md for the platform keys and who may reach what."""


def add_parser(subparsers: Any) -> None:
  parser = common.add_command(
    subparsers, "train", "run (or resume) the DP training program in a ROOT directory", DESCRIPTION
  )
  simulate_cli.add_config_args(parser)
  parser.add_argument(
    "--root",
    required=True,
    metavar="ROOT",
    help="program directory: state, logs, releases; rerun to resume",
  )
  parser.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
  common.add_resource_args(parser)
  parser.add_argument("--json", action="store_true", help="print summary.json to stdout")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from fedmf.program import preflight  # pylint: disable=g-import-not-at-top
  from fedmf.program import run_manifest  # pylint: disable=g-import-not-at-top

  # Everything that can be refused is refused before TensorFlow is imported (seconds).
  config = simulate_cli.load(args)
  preflight.check(config)
  common.check_creatable_dir(args.root)
  run_manifest.check_train_root(Path(args.root))
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
    from fedmf.program import training_run  # pylint: disable=g-import-not-at-top
    from fedmf.program import outputs  # pylint: disable=g-import-not-at-top
    from fedmf.program.train import run_training  # pylint: disable=g-import-not-at-top

    summary = run_training(config, args.root, progress=bar, log=log)
  except FedmfUserError as e:
    raise common.without_accountant_hint(e) from None
  finally:
    bar.close()
  if args.json:
    print(outputs.json_text(summary, indent=None))
    return 0
  a = summary["audit"]
  how = "stopped by the privacy budget" if summary["stopped_by_budget"] else "complete"
  print(
    f"trained {summary['rounds_completed']} of {outputs.plural(summary['rounds'], 'round')} "
    f"({how}) in {args.root}"
  )
  final = summary["final_test_accuracy"]
  print(
    f"  test accuracy        {summary['initial_test_accuracy']:.4f} -> "
    f"{'-' if final is None else format(final, '.4f')}  ({summary['accuracy_note']})"
  )
  print(
    f"  privacy (audit)      epsilon {training_run.format_epsilon(a['epsilon'])} at delta {a['delta']:g}"
  )
  print(f"  final model          {Path(args.root) / 'release' / 'final_model.npz'}")
  return 0
