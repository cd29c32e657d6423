"""What the CLI prints (issue 13): every --help complete and clean, the output check of
tests/conftest.py itself, TensorFlow's import chatter filtered (and nothing else), TFF's exit
message silenced, and a strategy that cannot train refused before TensorFlow is imported."""

import argparse
import functools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedmf.cli import main as cli_main
from fedmf import quiet
from tests import conftest

ROOT = Path(__file__).resolve().parents[1]


def _parsers(parser, path=()):
  """(command words, parser) of every command and subcommand."""
  yield path, parser
  for action in parser._actions:  # pylint: disable=protected-access
    if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
      for name, sub in action.choices.items():
        yield from _parsers(sub, path + (name,))


def test_every_flag_has_help_and_every_help_is_clean(capsys):
  parsers = list(_parsers(cli_main.build_parser()))
  assert {" ".join(p) for p, _ in parsers} >= {
    "strategy optimize",
    "strategy evaluate",
    "account",
    "audit",
    "simulate",
  }
  for words, parser in parsers:
    for action in parser._actions:  # pylint: disable=protected-access
      if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
        continue
      assert action.help, f"fedmf {' '.join(words)} {action.option_strings or action.dest}"
    with pytest.raises(SystemExit) as exit_info:
      cli_main.main([*words, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "None" not in text, words
    # "(default: ...)" at most once per flag: the entries are separated by the next flag.
    for entry in re.split(r"\n  -", text):
      assert entry.count("(default") <= 1, entry
    assert not re.search(r"\b0{3}\b|\b00[0-9]\b", text)  # papers by name, not by code


def test_the_noise_multiplier_convention_is_in_every_help_that_takes_one(capsys):
  for words in (["account"], ["audit"]):
    with pytest.raises(SystemExit):
      cli_main.main([*words, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "applied to C as loaded" in text and "gaussian_fixed" in text
    assert "jax_privacy" in text and "docs/noise-multiplier.md" in text


def test_the_output_check_finds_none_and_carriage_returns():
  assert conftest.output_problems(["audit"], "b = 3\n", "") == []
  assert conftest.output_problems(["audit"], "declared K=None, b=None\n", "")
  assert conftest.output_problems(["audit"], "", "round 3/8\rround 4/8")
  assert conftest.output_problems(["audit"], "", "round 3/8\r", terminal=True) == []
  assert conftest.output_problems(["--set", "x=None"], "got 'None'", "") == []  # the user's


def test_the_output_check_wraps_every_in_process_run(monkeypatch, capsys):
  before = len(conftest.CHECKED)
  with pytest.raises(SystemExit):
    cli_main.main(["--version"])
  assert len(conftest.CHECKED) == before + 1
  # The check wraps the real main for this test only: a main printing None fails it.
  wrapped = cli_main.main
  assert isinstance(wrapped, functools.partial) and wrapped.func is conftest.checked_main
  monkeypatch.setattr(
    cli_main,
    "main",
    functools.partial(conftest.checked_main, lambda argv: print("declared K=None") or 0),
  )
  with pytest.raises(AssertionError, match="Python None in stdout"):
    cli_main.main(["audit", "x"])
  capsys.readouterr()


def test_the_output_check_is_restored_after_each_test():
  """The fixture of this test wraps main anew; the one it wraps is the real one, never a wrapper."""
  real = cli_main.main.args[0]
  assert not isinstance(real, functools.partial) and real.__module__ == "fedmf.cli.main"
  real_run = subprocess.run.args[0]
  assert not isinstance(real_run, functools.partial) and real_run.__module__ == "subprocess"


_FAKE_TENSORFLOW = textwrap.dedent(
  """
  import os
  os.write(2, b"2026-01-01 E external/xla/cuda_dnn.cc:9342] Unable to register cuDNN factory: x\\n")
  os.write(2, b"a real warning the user must see\\n")
  os.write(2, b"I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary\\n")
  """
)


def test_tensorflow_import_chatter_is_filtered_and_nothing_else(tmp_path):
  fake = tmp_path / "fake"
  (fake / "tensorflow").mkdir(parents=True)
  (fake / "tensorflow" / "__init__.py").write_text(_FAKE_TENSORFLOW)
  code = "from fedmf import quiet; quiet.import_tensorflow_quietly(); print('done')"
  proc = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, PYTHONPATH=f"{fake}{os.pathsep}{ROOT}"),
  )
  assert proc.returncode == 0 and proc.stdout == "done\n"
  assert proc.stderr == "a real warning the user must see\n"


def test_the_real_tensorflow_import_prints_nothing():
  code = "from fedmf import quiet; quiet.import_tensorflow_quietly(); print('done')"
  proc = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"),
  )
  assert proc.returncode == 0 and proc.stdout == "done\n"
  assert "Unable to register" not in proc.stderr and "cuda" not in proc.stderr.lower()


def test_tffs_service_manager_no_longer_fails_at_shutdown(monkeypatch):
  import gc  # pylint: disable=import-outside-toplevel

  import tensorflow_federated  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from tensorflow_federated.python.core.impl.executor_stacks import (  # pylint: disable=import-outside-toplevel
    executor_factory,
  )

  managers = [o for o in gc.get_objects() if type(o).__name__ == "ServiceManager"]
  assert managers
  monkeypatch.setattr(quiet, "_SERVICE_MANAGER_QUIET", False)
  quiet.silence_tff_service_manager()
  # At interpreter shutdown the module's globals are gone: TFF's own __del__ raised here.
  monkeypatch.setattr(executor_factory, "subprocess", None)
  for manager in managers:
    type(manager).__del__(manager)


def test_a_strategy_that_cannot_train_is_refused_before_tensorflow(tmp_path):
  strategy = tmp_path / "tree.json"
  strategy.write_text('{"mechanism": "tree", "variant": "full-honaker"}')
  code = textwrap.dedent(
    f"""
    import sys
    from fedmf.cli import main
    rc = main.main(["simulate", "--out", {str(tmp_path / "out")!r}, "--set",
                    "strategy={strategy}", "--set", "noise_multiplier=1"])
    print(rc, "tensorflow" in sys.modules)
    """
  )
  proc = subprocess.run(
    [sys.executable, "-c", code],
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, PYTHONPATH=str(ROOT)),
  )
  assert proc.stdout.split() == ["2", "False"], proc.stderr
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "full-honaker" in lines[0] and "does not stream" in lines[0]
  assert not (tmp_path / "out").exists()
