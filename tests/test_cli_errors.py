"""How the CLI tells the user's mistakes from fedmf's (issue 39 item 6).

Bad input is one line and exit 2; an OS error naming the user's path is bad input too; a failing
environment is exit 1; anything else is a bug in fedmf: one line that says "internal error" and
where to report it, exit 70, and its traceback under `-v` (not without)."""

import pytest

from fedmf.cli import main as cli_main
from fedmf.cli import account as account_cli
from fedmf.errors import FedmfUserError


def _account_raising(monkeypatch, error):
  def run(args):
    raise error

  monkeypatch.setattr(account_cli, "run", run)


def _call(capsys, *flags):
  # `account` only needs its required flags to reach its function.
  argv = [*flags, "account", "s.json", "--n", "4", "--noise-multiplier", "1", "--delta", "1e-6"]
  code = cli_main.main(argv)
  captured = capsys.readouterr()
  return code, captured.out, captured.err


def test_a_bare_value_error_is_an_internal_error_with_its_traceback_under_verbose(
  capsys, monkeypatch
):
  _account_raising(monkeypatch, ValueError("operands could not be broadcast together"))
  code, out, err = _call(capsys)
  assert code == cli_main.EXIT_INTERNAL_ERROR == 70
  assert out == "" and len(err.strip().splitlines()) == 1
  assert "internal error: ValueError: operands could not be broadcast together" in err
  assert "report" in err and "-v" in err and "Traceback" not in err
  code, out, err = _call(capsys, "-v")
  assert code == 70
  assert "Traceback (most recent call last)" in err and 'raise error' in err
  assert err.strip().splitlines()[-1].startswith("fedmf account: internal error: ValueError")


@pytest.mark.parametrize(
  "error, code, needle",
  [
    (FedmfUserError("noise multiplier must be > 0"), 2, "error: noise multiplier must be > 0"),
    (FileNotFoundError(2, "No such file or directory", "s.json"), 2, "s.json"),
    (IsADirectoryError(21, "Is a directory", "out"), 2, "Is a directory"),
    (PermissionError(13, "Permission denied", "/root/x"), 2, "Permission denied"),
    (OSError(28, "No space left on device"), 1, "No space left on device"),
    (KeyError("round"), 70, "internal error: KeyError: 'round'"),
    (AssertionError(), 70, "internal error: AssertionError ("),
  ],
)
def test_each_kind_of_error_has_its_exit_code_and_one_line(
  capsys, monkeypatch, error, code, needle
):
  _account_raising(monkeypatch, error)
  got, out, err = _call(capsys)
  assert (got, out) == (code, "")
  assert len(err.strip().splitlines()) == 1 and needle in err
  assert ("internal error" in err) == (code == 70)
