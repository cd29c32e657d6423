#!/usr/bin/env python3
"""Follows the config through one `fedmf simulate` or `fedmf train` run (issue 21's measure).

A call is on the config's path when a function of fedmf receives the run's `TrainingConfig` or
one of its sections (task, participation, privacy, recipe, program, platform, canaries) among its
arguments (not as `self`: a section's own methods and properties are the config reading itself),
and a generator holding one resumes (a context manager's exit). The path is the
sequence of modules the config is in: the module of each such call, and, when it returns, the
module of the call that handed it the config (repeats collapsed); a *return* is an entry into a
module already on the path. Prints the modules entered, the returns and the path.

  .venv/bin/python tools/config_flow.py                # both commands
  .venv/bin/python tools/config_flow.py simulate       # a 2-round synthetic simulate
  .venv/bin/python tools/config_flow.py train
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = [
  "rounds=2",
  "num_clients=40",
  "clients_per_round=4",
  "vocab_size=50",
  "test_sentences=20",
  "eval_every=1",
  "noise_multiplier=1.0",
  "mechanism=blt",
  "participation.min_sep=3",
  "noise_seed=1",
]


def follow(command: str) -> list[str]:
  from fedmf.program.config import load_config  # pylint: disable=import-outside-toplevel

  config = load_config(None, TINY + (["checkpoint_every=1"] if command == "train" else []))
  # Plain values (ints, strings) are shared by everything; only the config's dataclasses count.
  ids = {id(config)} | {
    id(getattr(config, f.name))
    for f in dataclasses.fields(config)
    if dataclasses.is_dataclass(getattr(config, f.name))
  }
  package = str(ROOT / "fedmf") + os.sep
  path: list[str] = []
  holders: list[int] = []  # frames (ids) of the calls that received the config, innermost last
  modules: dict[int, str] = {}

  def visit(module: str) -> None:
    if not path or path[-1] != module:
      path.append(module)

  def tracer(frame, event, arg):
    if event not in ("call", "return"):
      return
    filename = frame.f_code.co_filename
    if not filename.startswith(package):
      return
    if event == "return":
      if holders and holders[-1] == id(frame):
        holders.pop()
        if holders:  # back in the caller that handed the config on
          visit(modules[holders[-1]])
      return
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    local = frame.f_locals
    # `self`: a section's own method or property (`recipe.adaptive`) is the config reading
    # itself, not the config handed to another module.
    if any(id(local.get(n)) in ids for n in names if n in local and n != "self"):
      module = os.path.relpath(filename, ROOT)
      if threading.current_thread() is threading.main_thread():
        holders.append(id(frame))
        modules[id(frame)] = module
      visit(module)

  with tempfile.TemporaryDirectory() as tmp:
    sys.setprofile(tracer)
    threading.setprofile(tracer)
    try:
      if command == "simulate":
        from fedmf.program import simulate  # pylint: disable=import-outside-toplevel

        simulate.run_simulation(config, Path(tmp) / "out", progress=False, log=lambda *_: None)
      else:
        from fedmf.program import train  # pylint: disable=import-outside-toplevel

        train.run_training(config, Path(tmp) / "root", progress=False, log=lambda *_: None)
    finally:
      sys.setprofile(None)
      threading.setprofile(None)
  return path


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  # No `choices`: argparse checks a nargs="*" default list against them as one value.
  parser.add_argument(
    "commands", nargs="*", metavar="COMMAND", help="simulate, train (default: both)"
  )
  args = parser.parse_args()
  args.commands = args.commands or ["simulate", "train"]
  for command in args.commands:
    if command not in ("simulate", "train"):
      parser.error(f"unknown command {command!r} (simulate, train)")
  for command in args.commands:
    path = follow(command)
    seen, returns = set(), 0
    for module in path:
      returns += module in seen
      seen.add(module)
    print(
      f"fedmf {command}: {len(seen)} modules entered, {returns} returns to a module already on the path"
    )
    for module in path:
      print(f"  {module}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
