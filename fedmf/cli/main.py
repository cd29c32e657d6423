"""The `fedmf` console script.

Each subcommand lives in its own module exposing `add_parser(subparsers)`, which registers an
`argparse` parser whose `func(args) -> int` runs the command. Subcommands import their heavy
dependencies (TensorFlow, TFF) lazily, inside `func`, so that `fedmf --help` stays fast.

Errors that are the user's fault (bad files, bad values) are raised as `fedmf.errors.FedmfUserError`
subclasses (or `ValueError`s from the validators) and printed as one line, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from fedmf import __version__
from fedmf.errors import FedmfUserError

# Registered subcommand modules, in help order. A module is listed here only once its command works.
SUBCOMMAND_MODULES: tuple[str, ...] = (
  "fedmf.cli.strategy",
  "fedmf.cli.account",
  "fedmf.cli.audit",
  "fedmf.cli.simulate",
)


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="fedmf",
    description=(
      "Differentially private federated learning with correlated noise: optimize strategies "
      "(TreeAgg, BandMF, BLT), account and audit privacy, and simulate training."
    ),
  )
  parser.add_argument("--version", action="version", version=f"fedmf {__version__}")
  parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
  subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
  for module_name in SUBCOMMAND_MODULES:
    importlib.import_module(module_name).add_parser(subparsers)
  return parser


def main(argv: list[str] | None = None) -> int:
  # TensorFlow's C++ start-up chatter (CPU features, CUDA probing) says nothing about the run.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  parser = build_parser()
  args = parser.parse_args(argv)
  logging.basicConfig(
    level=logging.DEBUG if args.verbose else logging.INFO,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    stream=sys.stderr,
  )
  # absl (TFF) logs per-model INFO lines such as "Adding default num_examples metric".
  logging.getLogger("absl").setLevel(logging.WARNING)
  if not getattr(args, "func", None):
    parser.print_help()
    return 0 if args.command is None else 2
  try:
    return int(args.func(args) or 0)
  except (FedmfUserError, ValueError, FileNotFoundError) as e:
    # One line, naming the problem; the exit code matches argparse's usage errors.
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"fedmf {args.command}: error: {message}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f"fedmf {args.command}: interrupted", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
