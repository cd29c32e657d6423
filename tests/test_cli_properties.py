"""Property-based: random malformed strategies and random argument values given to `fedmf strategy
evaluate` and `fedmf account` (issue 14). Whatever comes in, the command either succeeds printing
finite numbers, or exits 2 with exactly one line on stderr and no traceback, in bounded time, and
leaves no file behind. Inputs malformed by construction must give the error.

Each example runs in-process (`fedmf.cli.main.main`) in a fresh directory, under --max-seconds 1
and --max-memory 1 so that no valid but huge request can run long; a few end-to-end cases run in a
subprocess. The whole file takes well under a minute (FEDMF_PROPERTY_EXAMPLES=1000 explores more).
"""

import contextlib
import datetime
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from fedmf.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]
LIMITS = ["--max-seconds", "1", "--max-memory", "1"]
# CI runs the same 30 examples per property every time; FEDMF_PROPERTY_EXAMPLES=1000 explores
# with fresh random examples instead.
_EXPLORE = int(os.environ.get("FEDMF_PROPERTY_EXAMPLES", "0"))
SETTINGS = settings(
  max_examples=_EXPLORE or 30,
  deadline=datetime.timedelta(seconds=20),
  suppress_health_check=[HealthCheck.too_slow],
  derandomize=not _EXPLORE,
)


class Raw(str):
  """A JSON token written as is (1e400, NaN, Infinity, a 500-digit integer)."""


def _dump(value) -> str:
  """json.dumps that also writes Raw tokens and non-finite floats as Python's json reads them."""
  if isinstance(value, Raw):
    return str(value)
  if isinstance(value, dict):
    return "{" + ", ".join(f"{json.dumps(str(k))}: {_dump(v)}" for k, v in value.items()) + "}"
  if isinstance(value, (list, tuple)):
    return "[" + ", ".join(_dump(v) for v in value) + "]"
  return json.dumps(value)  # NaN and Infinity included (allow_nan)


# --- JSON values -------------------------------------------------------------------------------

EXTREME_NUMBERS = hs.sampled_from(
  [Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1" + "0" * 500)]
)
NUMBERS = hs.one_of(
  hs.floats(allow_nan=True, allow_infinity=True),
  hs.sampled_from([0, -1, 1e308, -1e308, 5e-324, 1e-300, 2**63, 2**64, 10**30, -(10**30)]),
  hs.integers(min_value=-(10**6), max_value=10**6),
  EXTREME_NUMBERS,
)
LEAVES = hs.one_of(hs.none(), hs.booleans(), NUMBERS, hs.text(max_size=6))
JSON = hs.recursive(
  LEAVES,
  lambda children: (
    hs.lists(children, max_size=4) | hs.dictionaries(hs.text(max_size=4), children, max_size=3)
  ),
  max_leaves=12,
)
FIELDS = {
  "dpsgd": (),
  "tree": ("variant",),
  "bandmf": ("n", "bands", "columns"),
  "band-toeplitz": ("coefficients", "column_normalized"),
  "blt": ("buf_decay", "output_scale"),
  "dense": ("matrix",),
}
VALID = {
  "dpsgd": {"mechanism": "dpsgd"},
  "tree": {"mechanism": "tree", "variant": "vanilla"},
  "bandmf": {"mechanism": "bandmf", "n": 3, "bands": 2, "columns": [[1, 0.5], [1, 0.5], [1]]},
  "band-toeplitz": {
    "mechanism": "band-toeplitz",
    "coefficients": [1, 0.5],
    "column_normalized": False,
  },
  "blt": {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]},
  "dense": {"mechanism": "dense", "matrix": [[1, 0, 0], [0.5, 1, 0], [0.2, 0.5, 1]]},
}


@hs.composite
def any_strategy(draw):
  """A JSON object shaped like a strategy, each field maybe replaced by anything."""
  mechanism = draw(hs.sampled_from(sorted(FIELDS)))
  obj = dict(VALID[mechanism])
  for field in ("mechanism",) + FIELDS[mechanism]:
    choice = draw(hs.integers(0, 3))
    if choice == 0:
      obj[field] = draw(JSON)
    elif choice == 1:
      obj.pop(field, None)
  if draw(hs.booleans()):
    obj[draw(hs.text(max_size=5))] = draw(JSON)
  return obj


NOT_A_NUMBER_LIST = hs.one_of(
  hs.text(max_size=5),
  hs.lists(hs.one_of(hs.text(max_size=3), hs.none(), hs.booleans().map(lambda b: [b])), min_size=1),
  hs.dictionaries(hs.text(max_size=3), LEAVES, max_size=2),
)


@hs.composite
def malformed_strategy_text(draw):
  """Strategy files that no reading accepts: an unknown mechanism, a required numeric field that
  is not finite, too large, not numeric, or absent, invalid or too deep JSON."""
  kind = draw(hs.integers(0, 5))
  if kind == 0:  # not JSON, or too deep
    return draw(
      hs.sampled_from(["", "{", "[" * 100_000 + "]" * 100_000, "{'a': 1}", "nul", "\x00"])
    )
  if kind == 1:  # unknown or non-string mechanism
    mechanism = draw(JSON.filter(lambda m: not (isinstance(m, str) and m in FIELDS)))
    return _dump({"mechanism": mechanism})
  mechanism = draw(hs.sampled_from(["bandmf", "band-toeplitz", "blt", "dense"]))
  obj = dict(VALID[mechanism])
  field = {"bandmf": "columns", "band-toeplitz": "coefficients", "blt": "buf_decay"}.get(
    mechanism, "matrix"
  )
  if kind == 2:  # a non-finite or too large entry
    bad = draw(EXTREME_NUMBERS)
    if field in ("columns", "matrix"):
      obj[field] = [list(row) for row in obj[field]]
      obj[field][-1][0] = bad
    else:
      obj[field] = [bad] + list(obj[field])[1:]
  elif kind == 3:
    obj[field] = draw(NOT_A_NUMBER_LIST)
  elif kind == 4:
    del obj[field]
  else:  # a near-singular C: a tiny pivot
    tiny = draw(hs.sampled_from([1e-300, 1e-200, 1e-30, 1e-12]))
    if mechanism == "bandmf":
      obj["columns"] = [[tiny, 1.0], [1.0, 0.5], [1.0]]
    elif mechanism == "dense":
      obj["matrix"] = [[tiny, 0, 0], [1, 1, 0], [0, 1, 1]]
    elif mechanism == "band-toeplitz":
      obj["coefficients"] = [tiny, 1.0]
    else:
      obj["output_scale"] = [draw(hs.sampled_from([3.0, 1e10, 1e308])), 0.2]
  return _dump(obj)


# --- running the CLI ---------------------------------------------------------------------------


def _cli(argv):
  """(exit code, stdout, stderr) of fedmf.cli.main.main(argv), in-process."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = cli.main(argv)
    except SystemExit as e:
      code = e.code
  return code, out.getvalue(), err.getvalue()


def _assert_outcome(code, out, err, *, must_fail=False):
  assert "Traceback" not in err and "Traceback" not in out
  if code == 0 and not must_fail:
    assert not re.search(r"\b(nan|inf|-inf|NaN|Infinity)\b", out), out
    return
  assert code == 2, (code, out, err)
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("fedmf "), err
  assert "error" in lines[0]
  assert out == ""


def _run_in_fresh_dir(text, argv_tail, *, command="evaluate", must_fail=False):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "s.json")
    Path(path).write_text(text, encoding="utf-8", errors="surrogatepass")
    argv = (
      ["strategy", "evaluate", path, *argv_tail]
      if command == "evaluate"
      else ["account", path, *argv_tail]
    )
    code, out, err = _cli(argv + LIMITS)
    _assert_outcome(code, out, err, must_fail=must_fail)
    assert sorted(os.listdir(tmp)) == ["s.json"]  # nothing written, nothing left
    return code


@pytest.fixture(scope="module", autouse=True)
def _imports_done():
  """The first call imports scipy and dp_accounting; keep that out of the examples' deadlines."""
  _run_in_fresh_dir(
    _dump(VALID["blt"]), ["--n", "8", "--min-sep", "2", "--max-participations", "2"]
  )
  _run_in_fresh_dir(
    _dump(VALID["blt"]),
    ["--n", "8", "--noise-multiplier", "1", "--delta", "1e-5"],
    command="account",
  )


EVALUATE_ARGS = ["--n", "12", "--min-sep", "3", "--max-participations", "2"]
ACCOUNT_ARGS = ["--n", "12", "--min-sep", "3", "--noise-multiplier", "2", "--delta", "1e-6"]


@SETTINGS
@given(text=malformed_strategy_text())
def test_malformed_strategies_exit_2_with_one_line(text):
  _run_in_fresh_dir(text, EVALUATE_ARGS, must_fail=True)
  _run_in_fresh_dir(text, ACCOUNT_ARGS, command="account", must_fail=True)


@SETTINGS
@given(obj=any_strategy(), account=hs.booleans())
def test_any_strategy_object_succeeds_with_finite_numbers_or_fails_in_one_line(obj, account):
  if account:
    _run_in_fresh_dir(_dump(obj), ACCOUNT_ARGS, command="account")
  else:
    _run_in_fresh_dir(_dump(obj), EVALUATE_ARGS)


HOSTILE = hs.one_of(
  hs.sampled_from(
    [
      "0",
      "-1",
      "1e400",
      "nan",
      "inf",
      "-inf",
      "abc",
      "",
      "1.5",
      "0x10",
      "9" * 30,
      "9" * 5000,
      str(2**64),
      " 7",
      "1_000",
      "١٢",
      "--n",
    ]
  ),
  hs.integers(min_value=-5, max_value=10**20).map(str),
  hs.floats(allow_nan=True, allow_infinity=True).map(repr),
)
# Plausible values; each example makes at most one argument hostile, so that most get past
# argument parsing and reach the accountant or the evaluation.
COUNT = hs.one_of(
  hs.sampled_from(["1", "2", "3", "5", "12", "60", "1000", "100000", str(10**7), str(10**18)]),
  hs.integers(min_value=1, max_value=400).map(str),
)
REAL = hs.one_of(
  hs.sampled_from(
    ["1e-300", "1e-6", "0.05", "0.5", "1", "2", "7.379", "100", "1e6", "1e9", "1e300", "1.7e308"]
  ),
  hs.floats(min_value=1e-3, max_value=1e3).map(repr),
)
DELTA = hs.one_of(
  hs.sampled_from(["1e-5", "1e-10", "1e-15", "1e-300", "0.5", "0.999999"]),
  hs.floats(min_value=1e-12, max_value=0.5).map(repr),
)
STRATEGY = hs.sampled_from(["dpsgd", "tree", "bandmf", "band-toeplitz", "blt", "dense"])


@hs.composite
def arguments(draw, flags):
  """[flag, value, ...] for `flags` = {flag: plausible values}, at most one value hostile."""
  hostile = draw(hs.sampled_from([None, *flags]))
  argv = []
  for flag, plausible in flags.items():
    argv += [flag, draw(HOSTILE if flag == hostile else plausible)]
  return argv


PARTICIPATION = {"--n": COUNT, "--min-sep": COUNT, "--max-participations": COUNT}


@SETTINGS
@given(
  mechanism=STRATEGY,
  noise=hs.sampled_from(["--noise-multiplier", "--target-epsilon"]).flatmap(
    lambda flag: arguments({**PARTICIPATION, flag: REAL, "--delta": DELTA})
  ),
  accountant=hs.sampled_from(["pld", "analytic"]),
)
def test_random_account_arguments(mechanism, noise, accountant):
  argv = noise + ["--accountant", accountant]
  _run_in_fresh_dir(_dump(VALID[mechanism]), argv, command="account")


@SETTINGS
@given(
  mechanism=STRATEGY,
  argv=arguments({**PARTICIPATION, "--noise-multiplier": REAL}),
  method=hs.sampled_from(["auto", "upper-bound", "lower-bound", "exact"]),
  workload=hs.sampled_from(["prefix", "momentum", "x"]),
)
def test_random_evaluate_arguments(mechanism, argv, method, workload):
  argv = argv + ["--sensitivity", method, "--workload", workload]
  _run_in_fresh_dir(_dump(VALID[mechanism]), argv)


# --- a few cases end to end, in a subprocess ---------------------------------------------------


@pytest.mark.parametrize(
  "text, args",
  [
    ("[" * 100_000 + "]" * 100_000, ["strategy", "evaluate", "{}", *EVALUATE_ARGS]),
    (
      '{"mechanism": "blt", "buf_decay": [0.5], "output_scale": [1e308]}',
      ["account", "{}", *ACCOUNT_ARGS],
    ),
    (
      '{"mechanism": "dpsgd"}',
      [
        "strategy",
        "evaluate",
        "{}",
        "--n",
        str(10**18),
        "--min-sep",
        "1",
        "--max-participations",
        "1",
      ],
    ),
    (
      '{"mechanism": "dpsgd"}',
      ["account", "{}", "--n", "10", "--noise-multiplier", "1e-300", "--delta", "1e-5"],
    ),
    (
      '{"mechanism": "dpsgd"}',
      ["strategy", "optimize", "--mechanism", "dpsgd", *EVALUATE_ARGS, "--out", "."],
    ),
  ],
  ids=["deep-json", "blt-output-scale-1e308", "n-1e18", "sigma-1e-300", "out-is-a-directory"],
)
def test_end_to_end_in_a_subprocess(tmp_path, text, args):
  path = tmp_path / "s.json"
  path.write_text(text)
  argv = [str(path) if a == "{}" else (str(tmp_path) if a == "." else a) for a in args]
  proc = subprocess.run(
    [sys.executable, "-m", "fedmf.cli.main", *argv],
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, PYTHONPATH=str(ROOT)),
    cwd=tmp_path,
  )
  lines = proc.stderr.splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and "error" in lines[0], proc.stderr
  assert proc.stdout == ""
  assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


# --- fedmf audit: random malformed participation logs (issue 14) ---------------------------------

LOG_STRATEGY = _dump({"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]})
BAD_ROUNDS = hs.sampled_from(
  ["", "x", "1.5", "nan", "inf", "-1", "-7", "1e20", "99999999999999999999", "1000000000000", "0x3"]
)
BAD_JSON_IDS = hs.sampled_from(["true", "false", "1.5", "null", "[]", "{}", '""', "-0.5", "1e400"])


def _csv(rows) -> bytes:
  return ("round,client_id\n" + "".join(f"{r},{c}\n" for r, c in rows)).encode()


def _jsonl(rows) -> bytes:
  return "".join(f'{{"round": {r}, "client_id": {c}}}\n' for r, c in rows).encode()


GOOD_ROWS = hs.lists(
  hs.tuples(hs.integers(0, 30), hs.sampled_from(["a", "b", "c", "7", "d-1"])),
  min_size=1,
  max_size=12,
)


@hs.composite
def malformed_log(draw):
  """(file name, bytes) of a participation log that no reading accepts."""
  import gzip  # pylint: disable=import-outside-toplevel

  rows = draw(GOOD_ROWS)
  kind = draw(hs.integers(0, 8))
  if kind == 0:  # a gzip stream cut short
    name = draw(hs.sampled_from(["log.csv.gz", "log.jsonl.gz"]))
    body = (
      _csv(rows * 400)
      if name.startswith("log.csv")
      else _jsonl([(r, f'"{c}"') for r, c in rows * 400])
    )
    data = gzip.compress(body)
    return name, data[: draw(hs.integers(1, len(data) - 9))]
  if kind == 1:  # a bad round in a CSV row
    at = draw(hs.integers(0, len(rows)))
    bad = (draw(BAD_ROUNDS), "z")
    return "log.csv", _csv(rows[:at] + [bad] + rows[at:])
  if kind == 2:  # a client id that is not a string or an integer
    at = draw(hs.integers(0, len(rows)))
    quoted = [(r, f'"{c}"') for r, c in rows]
    return "log.jsonl", _jsonl(quoted[:at] + [(3, draw(BAD_JSON_IDS))] + quoted[at:])
  if kind == 3:  # no rows, no header, a missing column
    return draw(
      hs.sampled_from(
        [
          ("log.csv", b""),
          ("log.csv", b"round,client_id\n"),
          ("log.csv", b"round,client\n0,a\n"),
          ("log.jsonl", b""),
          ("log.jsonl", b'{"round": 0}\n'),
        ]
      )
    )
  if kind == 4:  # a line that is not a JSON object
    quoted = [(r, f'"{c}"') for r, c in rows]
    lines = _jsonl(quoted).decode().splitlines(keepends=True)
    at = draw(hs.integers(0, len(lines)))
    lines.insert(at, draw(hs.sampled_from(["{", "[1, 2]\n", '{"round": 1, \n', "nul\n"])))
    return "log.jsonl", "".join(lines).encode()
  if kind == 5:  # bytes that are not UTF-8
    return "log.csv", _csv(rows) + b"\xff\xfe,\x80\n"
  if kind == 6:  # not a Parquet file
    return "log.parquet", draw(hs.binary(min_size=0, max_size=64))
  if kind == 7:  # an unknown extension
    return draw(hs.sampled_from(["log.txt", "log.csv.bz2", "log"])), _csv(rows)
  # A round that is a timestamp: per-round work beyond --max-memory.
  return "log.csv", _csv(rows + [(draw(hs.integers(10**10, 10**15)), "a")])


def _audit_in_fresh_dir(name, data, flags, *, must_fail, report=True):
  with tempfile.TemporaryDirectory() as tmp:
    log, strategy = os.path.join(tmp, name), os.path.join(tmp, "s.json")
    Path(log).write_bytes(data)
    Path(strategy).write_text(LOG_STRATEGY)
    argv = ["audit", log, "--strategy", strategy, "--noise-multiplier", "2", "--delta", "1e-6"]
    argv += flags + (["--report", os.path.join(tmp, "report")] if report else []) + LIMITS
    code, out, err = _cli(argv)
    assert "Traceback" not in err and "Traceback" not in out
    if must_fail or code == 2:
      assert code == 2, (code, out, err)
      lines = err.splitlines()
      assert len(lines) == 1 and lines[0].startswith("fedmf audit: error:"), err
      assert out == ""
      assert sorted(os.listdir(tmp)) == sorted([name, "s.json"])  # no report, no temporary file
    else:
      assert code == 0 or (code == 1 and "--strict" in flags), (code, err)
      assert not re.search(r"\b(nan|NaN|None)\b", out), out
      assert sorted(os.listdir(tmp)) == sorted([name, "s.json"] + (["report"] if report else []))
      if code == 1:
        assert err.splitlines()[-1].startswith("fedmf audit: strict: FAILED:"), err
    return code


@SETTINGS
@given(log=malformed_log(), report=hs.booleans())
def test_malformed_logs_exit_2_with_one_line(log, report):
  _audit_in_fresh_dir(*log, [], must_fail=True, report=report)


@SETTINGS
@given(
  rows=GOOD_ROWS,
  fmt=hs.sampled_from(["csv", "jsonl"]),
  flags=arguments(
    {
      "--rounds": hs.sampled_from(["31", "40", "1000", "1000000000", "1", "5"]),
      "--min-sep": hs.sampled_from(["1", "3", "10"]),
      "--max-epsilon": hs.sampled_from(["1", "8", "1e6"]),
    }
  ),
  strict=hs.booleans(),
  report=hs.integers(0, 4),
)
def test_any_log_and_flags_audit_or_fail_in_one_line(rows, fmt, flags, strict, report):
  data = _csv(rows) if fmt == "csv" else _jsonl([(r, f'"{c}"') for r, c in rows])
  flags = flags + (["--strict"] if strict else [])
  # A report (its plots take a second) in one example of five.
  _audit_in_fresh_dir(f"log.{fmt}", data, flags, must_fail=False, report=report == 0)
