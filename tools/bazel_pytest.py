"""Runs one test file under pytest for a Bazel py_test (BUILD names it as every test's main).

Bazel starts it in the runfiles tree with the test file's path as the argument; pytest reads its
settings (markers, the `not slow` default, warning filters) from pyproject.toml there. Extra
arguments after the file go to pytest (`bazel test //:x --test_arg=-m --test_arg=slow`).
"""

from __future__ import annotations

import os
import sys

import pytest

# pytest's exit code when every test of the file was deselected (for example all marked slow).
NO_TESTS_COLLECTED = 5


def main(argv: list[str]) -> int:
  if not argv:
    print("bazel_pytest: usage: bazel_pytest.py TEST_FILE [PYTEST_ARGS...]", file=sys.stderr)
    return 2
  args = [argv[0], "-p", "no:cacheprovider", *argv[1:]]
  # Bazel collects a JUnit report from XML_OUTPUT_FILE when the test writes one.
  if os.environ.get("XML_OUTPUT_FILE"):
    args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
  code = pytest.main(args)
  return 0 if code == NO_TESTS_COLLECTED else int(code)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
