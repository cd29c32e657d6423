"""Argument types and checks shared by the `fedmf` subcommands."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from fedmf.errors import FedmfUserError


def positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
  return value


def positive_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
  if not math.isfinite(value) or value <= 0:
    raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
  return value


def probability(text: str) -> float:
  """A δ: strictly between 0 and 1."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
  if not 0 < value < 1:
    raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
  return value


def add_participation_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
  parser.add_argument("--n", type=positive_int, required=required, help="number of rounds n")
  parser.add_argument(
    "--min-sep",
    type=positive_int,
    required=required,
    help="b: minimum gap between two participations of one client (gap convention, |i-j| >= b)",
  )
  parser.add_argument(
    "--max-participations",
    type=positive_int,
    required=required,
    help="k: maximum participations of one client",
  )


def check_writable(path: str) -> None:
  """Fails early, before long work, if the output file's directory does not exist or is not writable."""
  parent = Path(path).resolve().parent
  if not parent.is_dir():
    raise FedmfUserError(f"output directory does not exist: {parent}")
  if not os.access(parent, os.W_OK):
    raise FedmfUserError(f"output directory is not writable: {parent}")


def add_method_args(parser: argparse.ArgumentParser, accountant_help: str | None = None) -> None:
  """--sensitivity (auto | upper-bound | lower-bound) and, with `accountant_help`, --accountant."""
  parser.add_argument(
    "--sensitivity",
    choices=("auto", "upper-bound", "lower-bound"),
    default="auto",
    help="auto: exact where a theorem applies, else a valid upper bound; lower-bound is BLT Remark "
    "3.2 and is labelled as such",
  )
  if accountant_help is not None:
    parser.add_argument(
      "--accountant", choices=("pld", "analytic"), default="pld", help=accountant_help
    )


def check_creatable_dir(path: str) -> None:
  """Fails early if directory `path` can be neither used nor created (nearest existing ancestor)."""
  target = Path(path).resolve()
  if target.exists() and not target.is_dir():
    raise FedmfUserError(f"output path exists and is not a directory: {target}")
  ancestor = target
  while not ancestor.exists():
    ancestor = ancestor.parent
  if not ancestor.is_dir():
    raise FedmfUserError(f"cannot create {target}: {ancestor} is not a directory")
  if not os.access(ancestor, os.W_OK):
    raise FedmfUserError(f"output directory is not writable: {ancestor}")
