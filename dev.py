#!/usr/bin/env python3
"""Bootstrap and run fedmf on a fresh machine (only Python 3.11 + pip needed).

  python3 dev.py demo    install the locked environment and run the main job
  python3 dev.py test    install the locked environment and run the whole test suite
  python3 dev.py test -m slow   extra arguments go to pytest
  python3 dev.py format  apply the formatter (ruff format); --check only checks (CI)
  python3 dev.py bazel   install Bazel (Debian's bazel-bootstrap) if missing and check what only
                         Bazel can check, offline with the locked environment (CI): every target
                         builds, every library imports with only its BUILD deps, and the tests
                         tagged "ci" run (`bazel test --test_tag_filters=ci //...`); targets given
                         replace that (`python3 dev.py bazel //...` runs the whole suite,
                         `python3 dev.py bazel //:mf_test_tree` one test file)

It installs a pinned `uv` into .tools/, syncs the locked
environment from uv.lock into .venv/, and runs inside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
UV_VERSION = "0.13.9"
TOOLS = ROOT / ".tools"


def _run(cmd: list[str]) -> None:
  print("+ " + " ".join(cmd), flush=True)
  subprocess.run(cmd, cwd=ROOT, check=True)


def _uv() -> str:
  # Always the pinned uv, so every machine resolves and installs the same way.
  uv = TOOLS / "bin" / "uv"
  if not uv.exists():
    _run([sys.executable, "-m", "venv", str(TOOLS)])
    _run([str(TOOLS / "bin" / "python"), "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"])
  return str(uv)


def _sync(uv: str) -> None:
  # --compile-bytecode: TensorFlow's and TFF's .pyc files are written once, here. Where
  # PYTHONDONTWRITEBYTECODE is set (as on the CI machines), Python would otherwise compile ~7000
  # source files again in every process: 15 s of each `fedmf` start, in every test that runs the
  # CLI as a subprocess (a tiny `fedmf simulate`: 56 s before, 26 s after). Later syncs check the
  # files in under a second.
  _run([uv, "sync", "--locked", "--python", "3.11", "--compile-bytecode"])


def _run_in_env(uv: str, cmd: list[str]) -> int:
  print("+ " + " ".join(cmd), flush=True)
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("VIRTUAL_ENV", None)
  return subprocess.run([uv, "run", "--locked", "--no-sync", *cmd], cwd=ROOT, env=env).returncode


def _bazel() -> str:
  """Bazel from the system's packages: Debian's bazel-bootstrap (Bazel 4.2) when it is missing."""
  found = shutil.which("bazel")
  if found:
    return found
  if not shutil.which("apt-get"):
    sys.exit("dev.py: bazel is not installed and apt-get is not available; install Bazel 4.2+")
  sudo = [] if os.geteuid() == 0 else ["sudo"]
  _run([*sudo, "apt-get", "update"])
  _run([*sudo, "apt-get", "install", "-y", "bazel-bootstrap"])
  return shutil.which("bazel") or "/usr/bin/bazel"


def _bazel_test(targets: list[str]) -> int:
  """`bazel test` over the BUILD targets, offline, then `bazel shutdown` (no server left running).

  The interpreter is the locked environment: third_party/bazel/python/python3.sh execs
  $FEDMF_PYTHON, passed here as an absolute path so nothing machine-specific is committed.
  """
  bazel = _bazel()
  python = str(ROOT / ".venv" / "bin" / "python")
  env_flags = [f"--action_env=FEDMF_PYTHON={python}", f"--test_env=FEDMF_PYTHON={python}"]
  # No targets: build everything, run the import checks and the tests tagged "ci" (see
  # tools/update_build.py, CI_TESTS: the whole suite already ran under pytest).
  selection = targets or ["--test_tag_filters=ci", "--", "//..."]
  if targets:
    selection = ["--", *targets]
  cmd = [bazel, "test", *env_flags, *selection]
  print("+ " + " ".join(cmd), flush=True)
  env = dict(os.environ)
  env.pop("VIRTUAL_ENV", None)
  try:
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode
  finally:
    subprocess.run([bazel, "shutdown"], cwd=ROOT, env=env)


def main(argv: list[str]) -> int:
  if not argv or argv[0] not in ("demo", "test", "format", "bazel"):
    print(__doc__)
    return 2
  uv = _uv()
  _sync(uv)
  if argv[0] == "format":
    return _run_in_env(uv, ["ruff", "format", *argv[1:], "."])
  if argv[0] == "bazel":
    return _bazel_test(argv[1:])
  if argv[0] == "test":
    code = _run_in_env(uv, ["python", "-m", "pytest", *argv[1:]])
    return code
  return _run_in_env(uv, ["bash", "simulations/demo.sh", *argv[1:]])


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
