"""Every `fedmf` run of the test suite has its output checked for what a user must never see
(issue 13): Python's `None`, and carriage returns (progress bars) when the stream is not a terminal.

For each test, an autouse fixture wraps `fedmf.cli.main.main` (so in-process runs through
`cli_main.main(...)` or `tests.helpers`, with capsys or redirect_stdout, are checked when they
return) and `subprocess.run` (runs of the console script or of `python -m fedmf.cli.main`), and
restores both after the test (pytest's monkeypatch). A problem fails the test that ran the command.
Test modules call `cli_main.main` through the module, never a `main` imported by name, which
would miss the check.
"""

from __future__ import annotations

import functools
import io
import re
import subprocess
import sys

import pytest

from fedmf.cli import main as cli_main
from fedmf.mf import resources

_NONE = re.compile(r"\bNone\b")
# Every checked run: (argv, problems). tests/test_cli_output.py makes sure the check runs.
CHECKED: list[tuple[list[str], list[str]]] = []


def output_problems(argv, out: str, err: str, *, terminal: bool = False) -> list[str]:
  """What is wrong with a command's output (empty: nothing)."""
  given = " ".join(map(str, argv or ()))
  problems = []
  for name, text in (("stdout", out or ""), ("stderr", err or "")):
    for line in text.splitlines():
      if _NONE.search(line) and "None" not in given:
        problems.append(f"Python None in {name}: {line.strip()[:160]!r}")
        break
    if not terminal and "\r" in text:
      problems.append(f"a carriage return in {name}, which is not a terminal")
  return problems


class _Tee(io.TextIOBase):
  """Writes through to `target` (whose isatty() it reports) and keeps a copy."""

  def __init__(self, target):
    super().__init__()
    self.target = target
    self.copy = io.StringIO()

  def write(self, text):
    self.copy.write(text)
    return self.target.write(text)

  def flush(self):
    self.target.flush()

  def isatty(self):
    return self.target.isatty()

  def fileno(self):
    return self.target.fileno()

  @property
  def encoding(self):
    return getattr(self.target, "encoding", "utf-8")


def checked_main(_real_main, argv=None):
  out, err = _Tee(sys.stdout), _Tee(sys.stderr)
  sys.stdout, sys.stderr = out, err
  failed = True
  try:
    result = _real_main(argv)
    failed = False
    return result
  except SystemExit:
    failed = False
    raise
  finally:
    sys.stdout, sys.stderr = out.target, err.target
    problems = output_problems(
      argv, out.copy.getvalue(), err.copy.getvalue(), terminal=err.target.isatty()
    )
    CHECKED.append((list(argv or []), problems))
    if problems and not failed:
      raise AssertionError(f"fedmf {' '.join(map(str, argv or []))}: " + "; ".join(problems))


def _is_fedmf(cmd) -> bool:
  if isinstance(cmd, (str, bytes)):
    return False
  args = [str(a) for a in cmd]
  return "fedmf.cli.main" in args or any(a.endswith("/fedmf") for a in args[:1])


def checked_run(_real_run, *args, **kwargs):
  proc = _real_run(*args, **kwargs)
  cmd = args[0] if args else kwargs.get("args")
  if _is_fedmf(cmd) and isinstance(proc.stdout, str) and isinstance(proc.stderr, str):
    argv = [str(a) for a in cmd]
    problems = output_problems(argv, proc.stdout, proc.stderr)
    CHECKED.append((argv, problems))
    if problems:
      raise AssertionError(f"{' '.join(argv)}: " + "; ".join(problems))
  return proc


@pytest.fixture(autouse=True)
def checked_cli_output(monkeypatch):
  """Checks every fedmf run of the test (in process and by subprocess); restored afterwards."""
  monkeypatch.setattr(cli_main, "main", functools.partial(checked_main, cli_main.main))
  monkeypatch.setattr(subprocess, "run", functools.partial(checked_run, subprocess.run))


@pytest.fixture(autouse=True)
def _no_wall_clock_limit(monkeypatch):
  """In-process commands are not stopped by the --max-seconds clock (fedmf.mf.resources.clock,
  frozen here): on a loaded machine a test's command may take minutes of wall time, and only
  tests/test_max_seconds.py, which sets a clock of its own, is about that limit. The estimates
  (refusals before work) are unchanged."""
  monkeypatch.setattr(resources, "clock", lambda: 0.0)
