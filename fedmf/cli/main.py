"""The `fedmf` console script.

Each subcommand lives in its own module exposing `add_parser(subparsers)`, which registers an
`argparse` parser whose `func(args) -> int` runs the command. Subcommands import their heavy
dependencies (TensorFlow, TFF) lazily, inside `func`, so that `fedmf --help` stays fast.

Errors that are the user's fault (bad files, bad values) are raised as `fedmf.errors.FedmfUserError`
subclasses and printed as one line, exit code 2, no traceback; so are usage errors and the OS errors
that name a path the user gave (`USER_OS_ERRORS`: a missing file, a directory for a file, no
permission). A failure of the environment (`FedmfRuntimeError`, any other `OSError`: a full disk, a
lost worker) is one line with exit code 1. Anything else is a bug in fedmf: one line saying so and
where to report it, exit code 70 (`EX_SOFTWARE`), with its traceback under `-v`. Work is estimated before it starts (`fedmf.mf.resources`; --max-memory and
--max-seconds where a command offers them). Ctrl-C exits 130 and SIGTERM 143, both after the
command's cleanup (no temporary file is left behind).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
import warnings

from fedmf import __version__
from fedmf import console
from fedmf import quiet
from fedmf.errors import FedmfRuntimeError, FedmfUserError
from fedmf.mf import resources

# OS errors about a path the user named: their message names it, so they read as bad input.
USER_OS_ERRORS = (
  FileNotFoundError,
  FileExistsError,
  IsADirectoryError,
  NotADirectoryError,
  PermissionError,
)
# BSD sysexits' EX_SOFTWARE: an internal software error (neither 1, a failed run, nor 2, bad input).
EXIT_INTERNAL_ERROR = 70
REPORT_BUGS = (
  "a bug in fedmf, not in your input: please report it with the command and the traceback that "
  "`fedmf -v` prints (README.md, Reporting a bug)"
)

# Registered subcommand modules, in help order. A module is listed here only once its command works.
SUBCOMMAND_MODULES: tuple[str, ...] = (
  "fedmf.cli.strategy",
  "fedmf.cli.account",
  "fedmf.cli.audit",
  "fedmf.cli.simulate",
  "fedmf.cli.train",
  "fedmf.cli.worker",
  "fedmf.cli.public_features",
)


# Commands whose whole work is held to --max-seconds by the clock as well as by the estimates
# (fedmf.mf.resources.time_limit). simulate and train hold their strategy optimization and noise
# calibration to it, not their training rounds (which the flag does not limit: see its help).
CLOCKED_COMMANDS = ("strategy", "account", "audit")


def _command_name(args: argparse.Namespace) -> str:
  sub = getattr(args, "strategy_command", None)
  return f"fedmf {args.command}" + (f" {sub}" if sub else "")


class OneLineArgumentParser(argparse.ArgumentParser):
  """Usage errors as one line on stderr (exit 2), like every other fedmf error."""

  def error(self, message: str):  # type: ignore[override]
    message = " ".join(str(message).split())
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class Terminated(KeyboardInterrupt):
  """SIGTERM, raised like Ctrl-C so that the same cleanup (finally blocks, temporary files) runs."""


# The first SIGTERM raises Terminated; later ones are ignored while the cleanup it started runs (a
# second `timeout` or `kill` must not interrupt the removal of a staging directory with a traceback).
_TERMINATING = False


def _raise_terminated(signum, frame):
  global _TERMINATING
  if _TERMINATING:
    return
  if _in_ignored_context(frame):
    # An exception raised in a garbage-collection callback (JAX's `_xla_gc_callback`), a __del__
    # or a weakref callback is printed as "Exception ignored in ..." and dropped, and the run would
    # go on: deliver the signal again in a moment instead, outside that callback.
    threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
    return
  _TERMINATING = True
  raise Terminated()


def _in_ignored_context(frame) -> bool:
  """Whether `frame` runs inside code whose exceptions Python reports as unraisable and drops."""
  callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
  while frame is not None:
    code = frame.f_code
    if code in callbacks or code.co_name in ("__del__", "_xla_gc_callback"):
      return True
    frame = frame.f_back
  return False


def _handle_sigterm():
  """Installs the SIGTERM handler (main thread only); returns the previous one, or None."""
  try:
    return signal.signal(signal.SIGTERM, _raise_terminated)
  except ValueError:  # Not the main thread (e.g. an embedding program): leave signals alone.
    return None


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _named(error: BaseException) -> str:
  text = str(error).strip()
  return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def build_parser() -> argparse.ArgumentParser:
  parser = OneLineArgumentParser(
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
  global _TERMINATING
  _TERMINATING = False
  try:
    return _main(argv)
  except Terminated:
    # A SIGTERM in the last lines of the command, after its own handler (the cleanup of a finished
    # run): the same one line, never a traceback.
    print("fedmf: terminated (SIGTERM)", file=sys.stderr)
    return 143


def _main(argv: list[str] | None) -> int:
  # TensorFlow's C++ start-up chatter (CPU features, CUDA probing) says nothing about the run.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  parser = build_parser()
  args = parser.parse_args(argv)
  # One voice on the console: fedmf's INFO lines (with timestamps) only with -v; TensorFlow's, absl's
  # and matplotlib's INFO lines never (fedmf.console).
  logging.basicConfig(
    level=logging.DEBUG if args.verbose else logging.WARNING,
    format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    if args.verbose
    else "%(name)s: %(levelname)s: %(message)s",
    stream=sys.stderr,
  )
  console.quiet_loggers()
  # matplotlib warns about a legend without labels (an empty plot of a report); not the user's.
  warnings.filterwarnings("ignore", message="No artists with labels", category=UserWarning)
  if not getattr(args, "func", None):
    parser.print_help()
    return 0 if args.command is None else 2
  previous = _handle_sigterm()
  try:
    with contextlib.ExitStack() as stack:
      stack.enter_context(
        resources.limits(getattr(args, "max_memory", None), getattr(args, "max_seconds", None))
      )
      if args.command in CLOCKED_COMMANDS:
        stack.enter_context(resources.time_limit(_command_name(args)))
      return int(args.func(args) or 0)
  except (FedmfUserError, *USER_OS_ERRORS) as e:
    # One line, naming the problem; the exit code matches argparse's usage errors.
    print(f"fedmf {args.command}: error: {_first_line(e)}", file=sys.stderr)
    return 2
  except (FedmfRuntimeError, OSError) as e:
    print(f"fedmf {args.command}: error: {_first_line(e)}", file=sys.stderr)
    return 1
  except MemoryError:
    # The estimates refuse known large work first; this is the last line of defence.
    print(
      f"fedmf {args.command}: error: out of memory (lower the sizes, or see --max-memory)",
      file=sys.stderr,
    )
    return 2
  except Terminated:
    print(f"fedmf {args.command}: terminated (SIGTERM)", file=sys.stderr)
    return 143
  except KeyboardInterrupt:
    print(f"fedmf {args.command}: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except
    if args.verbose:
      traceback.print_exc(file=sys.stderr)
    print(
      f"fedmf {args.command}: internal error: {_named(e)} ({REPORT_BUGS})",
      file=sys.stderr,
    )
    return EXIT_INTERNAL_ERROR
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
    quiet.silence_tff_service_manager()


if __name__ == "__main__":
  sys.exit(main())
