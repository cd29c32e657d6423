"""`fedmf public-features`: registered here like every subcommand; the parser and the work live in
fedmf/public_features/ (cli.py: argparse only; the rest is imported when the command runs)."""

from fedmf.public_features.cli import add_parser

__all__ = ["add_parser"]
