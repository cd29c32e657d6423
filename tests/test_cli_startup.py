"""A CLI that starts in a blink (issue 23, item 3): what `fedmf --help`, `fedmf audit --help` and an
audit of a two-row log import, each in a fresh interpreter (no timing assertions: the modules are
what makes start-up slow, TensorFlow alone takes seconds)."""

import json
import subprocess
import sys

import pytest

# Top-level packages that cost from a few hundred milliseconds (dp_accounting, matplotlib) to
# seconds (TensorFlow, TFF, jax) to import.
HEAVY = ("tensorflow", "tensorflow_federated", "jax", "dp_accounting", "matplotlib", "pandas")
BLT = {"mechanism": "blt", "buf_decay": [0.99, 0.5], "output_scale": [0.1, 0.2]}


def _imported_by(argv: list[str]) -> tuple[int, set[str]]:
  """Runs `fedmf ARGV` in a new interpreter; (exit code, the imported modules' names)."""
  code = (
    "import contextlib, io, json, sys\n"
    "from fedmf.cli.main import main\n"
    "out = io.StringIO()\n"
    "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):\n"
    "  try:\n"
    f"    rc = main({argv!r})\n"
    "  except SystemExit as e:\n"
    "    rc = e.code\n"
    "print(json.dumps([rc, sorted(sys.modules)]))\n"
  )
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
  return rc, set(modules)


def _top_level(modules: set[str]) -> set[str]:
  return {m.split(".")[0] for m in modules}


@pytest.fixture
def two_row_log(tmp_path):
  (tmp_path / "log.csv").write_text("round,client_id\n0,a\n3,b\n")
  (tmp_path / "blt.json").write_text(json.dumps(BLT))
  return ["audit", str(tmp_path / "log.csv"), "--strategy", str(tmp_path / "blt.json")] + [
    "--noise-multiplier",
    "5",
    "--delta",
    "1e-6",
  ]


@pytest.mark.parametrize("argv", [["--help"], ["audit", "--help"]])
def test_help_imports_nothing_heavy(argv):
  rc, modules = _imported_by(argv)
  assert rc == 0
  # Not even numpy: parsing flags needs none of the numerical stack.
  assert not _top_level(modules) & set(HEAVY + ("numpy", "scipy", "pyarrow"))


def test_an_audit_imports_neither_tensorflow_nor_dp_accounting(two_row_log):
  rc, modules = _imported_by(two_row_log)
  assert rc == 0
  assert not _top_level(modules) & set(HEAVY)
  assert not {m for m in modules if m.startswith(("scipy.signal", "scipy.stats", "scipy.optimize"))}
  assert "fedmf.privacy.audit" in modules  # It did audit.


def test_the_pld_cross_check_is_what_imports_dp_accounting(two_row_log):
  rc, modules = _imported_by(two_row_log + ["--accountant", "pld"])
  assert rc == 0
  assert "dp_accounting" in _top_level(modules)
  assert not _top_level(modules) & {"tensorflow", "tensorflow_federated", "jax"}
