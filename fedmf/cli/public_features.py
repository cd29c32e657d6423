"""`fedmf public-features`: registered here like every subcommand; the parser lives in
fedmf/public_features/cli.py (argparse only), the program in fedmf/program/public_features.py.

The config is read and checked (every key) before anything heavy is imported; OUT and the cost
estimate are checked before anything is read or written; TensorFlow is imported only by a
federated run."""

from __future__ import annotations

import argparse
import sys

from fedmf import jsonio
from fedmf import quiet
from fedmf.cli import common
from fedmf.errors import FedmfUserError
from fedmf.public_features import cli

# Training is estimated too (unlike `fedmf simulate`, whose rounds are not): a tuned run on real
# data takes minutes, so the default limit is an hour rather than the other commands' 120 s.
DEFAULT_MAX_SECONDS = 3600.0


def add_parser(subparsers) -> None:
  parser = cli.add_parser(subparsers)
  parser.add_argument(
    "--max-memory",
    type=common.gib,
    default=None,
    metavar="GIB",
    help="refuse a run whose estimated peak memory exceeds this many GiB (default: 4)",
  )
  parser.add_argument(
    "--max-seconds",
    type=common.positive_float,
    default=DEFAULT_MAX_SECONDS,
    metavar="S",
    help="refuse a run whose estimated time (reading, every training run, the baselines) exceeds "
    "this many seconds (default: 3600)",
  )
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from fedmf.public_features import config  # pylint: disable=g-import-not-at-top

  cfg = config.load(args.config, args.overrides, args.data_dir, args.tune)
  if not args.out.strip():
    raise FedmfUserError("--out must name a directory, got ''")
  common.check_creatable_dir(args.out)
  from fedmf.program import public_features  # pylint: disable=g-import-not-at-top

  public_features.check(cfg, args.out, args.force)  # before TensorFlow and before any data
  if cfg.federated:
    quiet.import_tensorflow_quietly()  # without its GPU-probing lines on stderr
  summary = public_features.run(
    cfg,
    args.out,
    force=args.force,
    progress=lambda line: print(line, file=sys.stderr, flush=True),
  )
  shown = {k: v for k, v in summary.items() if k != "privacy"}
  print(jsonio.json_text(shown, indent=2))
  return 0
