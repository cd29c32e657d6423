"""Argument types and checks shared by the `fedmf` subcommands."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path

from fedmf.errors import FedmfUserError


def _show(text: str, limit: int = 40) -> str:
  """repr(text), cut to one short line (a value may be a 5000-digit number)."""
  shown = repr(text)
  return shown if len(shown) <= limit else shown[: limit - 4] + "...'"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Adds "(default: X)" to a flag's help once, and only when X says something.

  Not for None or False defaults (a flag that is off, a value that is absent), nor when the help
  already names its default in words.
  """

  def _get_help_string(self, action):
    text = action.help or ""
    default = action.default
    if (
      "default" in text
      or default is None
      or isinstance(default, bool)
      or default is argparse.SUPPRESS
      or not action.option_strings
      or default == []
    ):
      return text
    return text + " (default: %(default)s)"


def add_command(subparsers, name: str, summary: str, description: str) -> argparse.ArgumentParser:
  """The parser of subcommand `name` (`summary`: its line in `fedmf --help`), its description
  printed as written (examples keep their lines)."""
  return subparsers.add_parser(
    name,
    help=summary,
    description=description,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )


# The noise multiplier's convention, shared by every --help that takes one (docs/noise-multiplier.md).
SIGMA_HELP = (
  "sigma, applied to C as loaded: the sum of clipped updates gets clip * sigma * [C^-1 z]_t. "
  "TFF's DifferentiallyPrivateFactory.gaussian_fixed and tree_aggregation use the same sigma; a "
  "jax_privacy BandMFConfig noise_multiplier is relative to C scaled to unit max column norm, so "
  "multiply it by C's max column norm (docs/noise-multiplier.md)"
)


def _number(text: str, kind: type, accept, wanted: str, refused: str = ""):
  """`text` as `kind` if `accept(value)`; else an ArgumentTypeError: "expected WANTED, got TEXT"
  (REFUSED instead of WANTED for a number that parses but is not accepted)."""
  try:
    value = kind(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected {wanted}, got {_show(text)}") from None
  if not accept(value):
    raise argparse.ArgumentTypeError(f"expected {refused or wanted}, got {_show(text)}")
  return value


def positive_int(text: str) -> int:
  return _number(text, int, lambda v: v >= 1, "a positive integer")


def positive_float(text: str) -> float:
  return _number(
    text,
    float,
    lambda v: math.isfinite(v) and v > 0,
    "a positive number",
    "a positive finite number",
  )


def non_negative_float(text: str) -> float:
  """A finite number >= 0 (a noise multiplier where 0 means no DP)."""
  return _number(
    text, float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0", "a finite number >= 0"
  )


def probability(text: str) -> float:
  """A δ: strictly between 0 and 1."""
  return _number(text, float, lambda v: 0 < v < 1, "a number in (0, 1)")


def add_participation_args(parser: argparse.ArgumentParser, required: bool = True) -> None:
  """--n, --min-sep B and --max-participations K; unless `required`, B and K may be left out
  (single participation; K = ceil(n/B))."""
  parser.add_argument(
    "--n", type=positive_int, required=True, metavar="N", help="number of rounds n"
  )
  if required:
    helps = (
      "b: minimum gap between two participations of one client (gap convention, |i-j| >= b)",
      "k: maximum participations of one client",
    )
  else:
    helps = (
      "b: minimum gap between two participations of a client (|i-j| >= b); "
      "omit for single participation",
      "k: maximum participations of a client (default: ceil(n/b))",
    )
  for flag, metavar, text in zip(("--min-sep", "--max-participations"), "BK", helps):
    parser.add_argument(flag, type=positive_int, required=required, metavar=metavar, help=text)


def add_sampling_args(group: "argparse._ActionsContainer") -> None:
  """--dataset-size and --batch-size of cyclic Poisson sampling (amplified BandMF, BandMF §5)."""
  group.add_argument(
    "--dataset-size",
    type=positive_int,
    default=None,
    metavar="N_DATA",
    help="number of examples (or devices) N sampled from",
  )
  group.add_argument(
    "--batch-size",
    type=positive_float,
    default=None,
    metavar="BATCH",
    help="expected batch size B per round",
  )


def check_writable(path: str) -> None:
  """Fails early, before long work, if the output file's directory does not exist or is not writable."""
  try:
    parent = Path(path).resolve().parent
  except (OSError, ValueError, RuntimeError) as e:  # e.g. an embedded NUL, a symlink loop
    raise FedmfUserError(f"cannot use output path {path!r}: {e}") from None
  if parent.exists() and not parent.is_dir():
    raise FedmfUserError(f"cannot write {path}: {parent} is a file, not a directory")
  if not parent.is_dir():
    raise FedmfUserError(f"output directory does not exist: {parent}")
  if not os.access(parent, os.W_OK):
    raise FedmfUserError(f"output directory is not writable: {parent}")


def check_output_file(path: str, flag: str, force: bool = False) -> None:
  """Fails early, before long work, unless `path` (the value of `flag`) can become a new file.

  Refuses a directory, an existing file without --force (a finished result is not overwritten by
  accident) and a missing or read-only directory.
  """
  try:
    target = Path(path)
    is_dir, exists = target.is_dir(), target.exists() or target.is_symlink()
  except (OSError, ValueError) as e:
    raise FedmfUserError(f"{flag} {path!r}: {e}") from None
  if is_dir:
    raise FedmfUserError(f"{flag} {path} is a directory; give a file name")
  if exists and not force:
    raise FedmfUserError(f"{flag} {path} exists; pass --force to overwrite it")
  check_writable(path)


def seed(text: str) -> int:
  """A seed: an integer in [0, 2^64) (the stateless RNG keys hold 64 bits)."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
      f"expected an integer in [0, 2^64), got {_show(text)}"
    ) from None
  if not 0 <= value < 2**64:
    raise argparse.ArgumentTypeError(f"expected an integer in [0, 2^64), got {_show(text)}")
  return value


def gib(text: str) -> float:
  """A memory limit in GiB (--max-memory), returned in bytes."""
  return positive_float(text) * 2**30


def add_resource_args(parser: argparse.ArgumentParser) -> None:
  """--max-memory and --max-seconds: the limits of fedmf.mf.resources for this command."""
  parser.add_argument(
    "--max-memory",
    type=gib,
    default=None,
    metavar="GIB",
    help="refuse work whose estimated peak memory exceeds this many GiB: the strategy math, the "
    "accountant, the audit, and for training the model, optimizer and noise state "
    "(default: 4)",
  )
  parser.add_argument(
    "--max-seconds",
    type=positive_float,
    default=None,
    metavar="S",
    help="refuse work whose estimated time exceeds this many seconds, and stop it with one line "
    "once it has run longer (a slower or loaded machine): the strategy math (optimizing, "
    "sensitivity, evaluation), the PLD accountant and the audit's log scan; training rounds and "
    "data loading are not limited (default: 120)",
  )


def add_method_args(parser: argparse.ArgumentParser, accountant_help: str | None = None) -> None:
  """--sensitivity (auto | upper-bound | lower-bound) and, with `accountant_help`, --accountant.

  --accountant defaults to None: the default of the use (`accounting.CLAIM_ACCOUNTANT` for a
  claim, `accounting.AMPLIFIED_ACCOUNTANT` for an amplified event), chosen by the command.
  """
  parser.add_argument(
    "--sensitivity",
    choices=("auto", "upper-bound", "lower-bound"),
    default="auto",
    help="auto: exact where a theorem applies, else a valid upper bound; upper-bound: the general "
    "bound (BandMF Eq. 5); lower-bound: BLT Remark 3.2, labelled as such (no guarantee)",
  )
  if accountant_help is not None:
    parser.add_argument(
      "--accountant", choices=("pld", "analytic"), default=None, help=accountant_help
    )


def check_output_dir(path: str, flag: str, names: tuple[str, ...], force: bool = False) -> None:
  """Fails early, before long work, unless directory `path` (the value of `flag`) can receive files
  `names`: refuses a file, a directory already holding one of them without --force (a finished
  result is not overwritten by accident), and a directory that can be neither used nor created.
  """
  try:
    target = Path(path)
    exists, is_dir = target.exists(), target.is_dir()
  except (OSError, ValueError) as e:
    raise FedmfUserError(f"{flag} {path!r}: {e}") from None
  if exists and not is_dir:
    raise FedmfUserError(f"{flag} {path} is a file; give a directory")
  if is_dir and not force:
    found = [name for name in names if (target / name).exists()]
    if found:
      raise FedmfUserError(
        f"{flag} {path} already holds a report ({found[0]}); pass --force to overwrite it, or "
        "choose another directory"
      )
  check_creatable_dir(path)


_ACCOUNTANT_HINT = re.compile(
  r"[;,]?\s*(or )?use --accountant analytic( \([^)]*\))?( or a larger delta)?"
)


def without_accountant_hint(error: FedmfUserError) -> FedmfUserError:
  """The error for a command without --accountant (simulate, train): the accountant's advice to use
  `--accountant analytic` names a flag the command does not have, so it is replaced."""
  message = str(error)
  if "--accountant" not in message:
    return error
  message = _ACCOUNTANT_HINT.sub("", message).rstrip("; ")
  return FedmfUserError(
    f"{message} (a run's amplified event is accounted with PLD only: lower noise_multiplier or "
    "raise delta)"
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
  if not target.exists():
    # Some file systems (/proc, /sys, a read-only mount) refuse new directories whatever the
    # permission bits say: try one now rather than after minutes of work.
    try:
      os.rmdir(tempfile.mkdtemp(prefix=".fedmf-probe-", dir=ancestor))
    except OSError as e:
      raise FedmfUserError(
        f"cannot create {target}: {ancestor} does not accept new directories ({e.strerror})"
      ) from None
