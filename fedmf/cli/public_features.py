"""`fedmf public-features`: registered here like every subcommand; the parser and the work live in
fedmf/public_features/ (cli.py: argparse only; the rest is imported when the command runs)."""

from fedmf import quiet
from fedmf.public_features import cli


def add_parser(subparsers) -> None:
  parser = cli.add_parser(subparsers)
  # A federated run imports TensorFlow: without its GPU-probing lines on stderr.
  parser.set_defaults(func=lambda args: cli.run(args, quiet.import_tensorflow_quietly))
