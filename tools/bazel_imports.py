"""Imports every module of one fedmf package, for a Bazel py_test that depends on its library only.

  bazel test //:mf_imports        (BUILD: one `<library>_imports` test per library, tagged "ci")

Bazel's runfiles of such a test hold the library and what its BUILD deps name, nothing else, so an
import the generator missed (a dependency of the library not in its `deps`) fails here by name. The
pytest suite cannot catch that: it runs in the source tree, where every module is importable.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print("bazel_imports: usage: bazel_imports.py PACKAGE (e.g. fedmf.mf)", file=sys.stderr)
    return 2
  package = importlib.import_module(argv[0])
  names = [argv[0]]
  if hasattr(package, "__path__"):  # The package's own modules; subpackages are other libraries.
    names += [
      f"{argv[0]}.{info.name}" for info in pkgutil.iter_modules(package.__path__) if not info.ispkg
    ]
  failed = []
  for name in names:
    try:
      importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(f"{name}: {type(e).__name__}: {e}")
  for line in failed:
    print(f"bazel_imports: cannot import {line}", file=sys.stderr)
  print(f"bazel_imports: {len(names) - len(failed)} of {len(names)} modules of {argv[0]} import")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
