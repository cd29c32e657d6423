"""Helpers shared by the test modules, in one place: running the `fedmf` CLI in process, checking a
one-line refusal, loading a script that is not a package module, and brute-force participation
statistics.

`fedmf(argv)` looks `fedmf.cli.main.main` up when it is called, so the output check that
tests/conftest.py installs around it for each test applies (a module doing `from fedmf.cli.main
import main` would keep the unchecked function)."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Iterable, Optional, Sequence

from fedmf import config_parse
from fedmf.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def load_script(relative: str) -> types.ModuleType:
  """The script at ROOT/`relative` (benchmarks/, simulations/, tools/, deploy/: not packages) as a
  fresh module named after its file, registered in sys.modules (dataclasses look it up there).
  The script's directory goes on sys.path, as `python SCRIPT` puts it, for its sibling imports."""
  path = ROOT / relative
  if str(path.parent) not in sys.path:
    sys.path.append(str(path.parent))
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[path.stem] = module
  spec.loader.exec_module(module)
  return module


def fedmf(argv) -> int:
  """`fedmf ARGV` in process; its exit code (argparse's usage errors included)."""
  try:
    return cli_main.main([str(a) for a in argv])
  except SystemExit as e:  # argparse usage errors and --help
    return e.code


def run_cli(capsys, *argv) -> tuple[int, str, str]:
  """(exit code, stdout, stderr) of `fedmf ARGV` in process."""
  code = fedmf(argv)
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def one_line_error(
  code: int, out: Optional[str], err: str, *needles: str, command: Optional[str] = None
) -> str:
  """Checks a refusal: exit 2, nothing on stdout (unless `out` is None: not checked), one line on
  stderr naming every needle (and starting `fedmf COMMAND: error:` when given), no traceback.
  Returns the line."""
  lines = err.strip().splitlines()
  assert code == 2 and len(lines) == 1, (code, out, err)
  assert out is None or out == "", (code, out, err)
  assert "Traceback" not in err
  if command is not None:
    assert lines[0].startswith(f"fedmf {command}: error:"), err
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


def kill_after_released_rounds(command: Sequence[str], root: Path, rounds: int, env) -> None:
  """Runs `fedmf train` (`command`) and kills it with SIGKILL once its journal (ROOT/journal.csv)
  records `rounds` released rounds; asserts it died by that signal (not finished first)."""
  proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  journal = Path(root) / "journal.csv"
  while proc.poll() is None:
    if journal.exists() and len(journal.read_text().splitlines()) - 1 >= rounds:
      proc.send_signal(signal.SIGKILL)
      break
    time.sleep(0.02)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL


def settings(base: Iterable[str], extra: Iterable[str]) -> list[str]:
  """`--set` items: `base` with the keys of `extra` replaced by `extra`'s (the command line refuses
  a key given twice), keys compared as written."""
  return config_parse.give_way(list(base), list(extra))


def rounds_by_client(cohorts: Iterable) -> dict[int, list[int]]:
  """{client: the rounds it joined, in order} of cohorts (objects with .round and .clients)."""
  seen: dict[int, list[int]] = {}
  for c in cohorts:
    for i in c.clients.tolist():
      seen.setdefault(i, []).append(c.round)
  return seen


def brute_min_sep(cohorts: Iterable) -> Optional[int]:
  """The smallest gap between two rounds of one client (None if nobody joined twice)."""
  gaps = [b - a for rs in rounds_by_client(cohorts).values() for a, b in zip(rs, rs[1:])]
  return min(gaps) if gaps else None
