"""Foundation contract: the pure-math layer stays TF-free and the console script works."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedmf.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
  )


def _heavy_modules_after(imports: str) -> list[str]:
  code = (
    f"import sys\n{imports}\n"
    "print(sorted(m for m in ('tensorflow', 'tensorflow_federated', 'jax', 'dp_accounting', 'pyarrow')"
    " if m in sys.modules))"
  )
  result = _python(code)
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout.strip().replace("'", '"'))


def test_pure_math_layer_imports_only_numpy_and_scipy():
  heavy = _heavy_modules_after(
    "import fedmf, fedmf.mf.strategies, fedmf.mf.evaluation, fedmf.mf.sensitivity, fedmf.mf.streaming\n"
    "import fedmf.mf.blt, fedmf.mf.banded_optimize, fedmf.mf.tree, fedmf.mf.toeplitz, fedmf.mf.workloads"
  )
  assert heavy == []


def test_privacy_layer_and_cli_do_not_import_tensorflow():
  heavy = _heavy_modules_after(
    "import fedmf.privacy.accounting, fedmf.privacy.participation_log, fedmf.privacy.audit, fedmf.privacy.report, fedmf.participation, fedmf.program.config\n"
    "import fedmf.cli.main; fedmf.cli.main.build_parser()"
  )
  assert not {"tensorflow", "tensorflow_federated", "jax"} & set(heavy)


def _subcommands() -> set[str]:
  parser = cli_main.build_parser()
  (action,) = [a for a in parser._actions if a.dest == "command"]
  return set(action.choices)


def test_help_lists_only_existing_subcommands(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli_main.main(["--help"])
  assert exit_info.value.code == 0
  text = capsys.readouterr().out
  registered = {m.rsplit(".", 1)[1].replace("_", "-") for m in cli_main.SUBCOMMAND_MODULES}
  assert _subcommands() == registered
  for name in registered:
    assert f"    {name} " in text or f"    {name}\n" in text  # long names wrap


def test_every_subcommand_has_help(capsys):
  for module in cli_main.SUBCOMMAND_MODULES:
    name = module.rsplit(".", 1)[1].replace("_", "-")
    with pytest.raises(SystemExit) as exit_info:
      cli_main.main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage: fedmf " + name in capsys.readouterr().out


def test_console_script_runs_in_a_subprocess():
  exe = Path(sys.executable).with_name("fedmf")
  cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fedmf.cli.main"]
  result = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "strategy" in result.stdout
