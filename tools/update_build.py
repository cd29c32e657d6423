#!/usr/bin/env python3
"""Regenerates the Bazel BUILD files from the code's imports (tests/test_build_file.py checks them).

  python3 tools/update_build.py               write BUILD and third_party/bazel/pypi/BUILD
  python3 tools/update_build.py --check       exit 1 (naming the stale files) if they are not current
  python3 tools/update_build.py --from-index  build from the files staged in git
  python3 tools/update_build.py --durations LOG...  merge the per-file seconds of pytest
                                              `--durations=0` reports into tests/durations.json
                                              (then regenerate)

Every Python package under fedmf/ (a directory holding .py files) becomes one py_library whose
deps are the packages and third-party modules its files import (read with `ast`, function-level
imports included), so a dependency nothing imports is never listed. Each test file becomes a
py_test run through tools/bazel_pytest.py; scripts in benchmarks/ and deploy/ become py_binary.
Third-party modules map to empty targets in @pypi (third_party/bazel/pypi/BUILD, also generated):
the modules themselves come from the .venv interpreter of the Python toolchain.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPI_BUILD = "third_party/bazel/pypi/BUILD"
SCRIPT_DIRS = ("benchmarks", "deploy")
RUNNER = "tools/bazel_pytest.py"
# Tests that need the real machine: root, network namespaces (ip netns, veth, tc), or the user's
# ~/.cache. They run outside Bazel's sandbox ("no-sandbox") and one at a time with the rest
# ("exclusive"), since they create system-wide network namespaces.
LOCAL_MARKERS = ("tests.netns", "from tests import netns", "unshare", "geteuid")
# Test sizes come from measured durations: tests/durations.json holds each test file's seconds
# (setup + call + teardown of its tests, summed from `pytest --durations=0` on a 2-core machine,
# merged by --durations). A file gets the least Bazel size whose timeout (small 60 s, medium 300 s,
# large 900 s, enormous 3600 s) is at least SIZE_MARGIN times its time, since a CI machine shared by
# other work runs slower; a file never measured gets "large".
DURATIONS = "tests/durations.json"
SIZE_MARGIN = 3.0
SIZES = (("small", 60.0), ("medium", 300.0), ("large", 900.0), ("enormous", 3600.0))
UNMEASURED_SIZE = "large"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
IMPORTS_RUNNER = "tools/bazel_imports.py"
# CI runs what only Bazel can check (`python3 dev.py bazel`: `bazel test --test_tag_filters=ci
# //...`, which builds every target and runs the tests tagged "ci"): each library imports with only
# the deps BUILD gives it (`<library>_imports`), and these tests, one or two per package, run
# through the Bazel toolchain and sandbox. The whole suite runs under pytest in CI already;
# `python3 dev.py bazel //...` runs all of it under Bazel too (about 20 min on 2 cores).
CI_TESTS = (
  "tests/test_build_file.py",  # BUILD is current
  "tests/test_layers.py",  # the layer table
  "tests/test_foundation.py",  # the console script in a subprocess, layer imports
  "tests/test_cli_startup.py",  # what `fedmf --help` imports
  "tests/mf/test_strategies.py",  # the math layer and its loader
  "tests/participation/test_models.py",
  "tests/privacy/test_log_statistics.py",  # pyarrow, the auditor
  "tests/tff/test_noise.py",  # TensorFlow and TFF graphs in the toolchain
  "tests/tasks/test_synthetic.py",
  "tests/program/test_config_sections.py",  # the program layer's config, TF-free
  "tests/public_features/test_math.py",
  "tests/deploy/test_manifests.py",
)


def _all_files() -> list[str]:
  """Python files on disk, or with --from-index those staged in git (to build a commit's BUILD)."""
  if "--from-index" in sys.argv:
    out = subprocess.run(
      ["git", "ls-files", "--cached", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return sorted(line for line in out.stdout.splitlines() if (ROOT / line).exists())
  skip = {".venv", ".tools", "out", ".bench-env", "third_party", ".git"}
  return sorted(
    p.relative_to(ROOT).as_posix()
    for p in ROOT.rglob("*.py")
    if not skip.intersection(p.relative_to(ROOT).parts)
  )


def _imports(rel: str) -> set[str]:
  """Dotted names of every module `rel` imports, relative imports resolved."""
  tree = ast.parse((ROOT / rel).read_text(), filename=rel)
  package = rel[:-3].split("/")[:-1]
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package[: len(package) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      names.add(base)
      # `from fedmf import errors` imports the module fedmf.errors.
      names.update(f"{base}.{alias.name}" for alias in node.names)
  return {n for n in names if n}


def _library_name(package_dir: str) -> str:
  """Target name of the py_library of a package directory: fedmf/mf -> mf; fedmf -> fedmf_root."""
  parts = package_dir.split("/")[1:]
  return "_".join(parts) if parts else "fedmf_root"


class _Layout:
  """Which file belongs to which target, and what each file depends on."""

  def __init__(self, files: list[str]):
    self.files = files
    self.file_set = set(files)
    self.packages = sorted({f.rsplit("/", 1)[0] for f in files if f.startswith("fedmf/")})
    self.package_set = set(self.packages)
    self.third_party: set[str] = set()
    # A script imports a sibling by its bare name (its own directory is on sys.path; a `benchmarks`
    # package in site-packages would shadow `from benchmarks import ...`).
    self.scripts = {f for f in files if f.split("/")[0] in SCRIPT_DIRS}
    self.script_names = {Path(f).stem for f in self.scripts}

  def target_of(self, module: str) -> str | None:
    """The label of the first-party target that provides `module`, or None (stdlib/third party)."""
    parts = module.split(".")
    if parts[0] == "fedmf":
      # The longest prefix that is a package directory owns the module.
      for i in range(len(parts), 0, -1):
        directory = "/".join(parts[:i])
        if directory in self.package_set:
          return ":" + _library_name(directory)
      return None
    if parts[0] == "tests":
      return ":test_utils"
    if parts[0] in SCRIPT_DIRS or parts[0] in ("tools",) or parts[0] in self.script_names:
      return None
    top = parts[0]
    if top in STDLIB or top.startswith("_"):
      return None
    self.third_party.add(top)
    return "@pypi//:" + top

  def deps(self, files: list[str], own: str | None = None) -> list[str]:
    labels = {label for f in files for m in _imports(f) if (label := self.target_of(m))}
    labels.discard(own)
    return sorted(labels, key=lambda label: (label.startswith("@"), label))

  def imported_tests(self, rel: str) -> list[str]:
    """The tests/**/test_*.py files `rel` imports, directly or through each other."""
    found: list[str] = []
    frontier = [rel]
    while frontier:
      for module in sorted(_imports(frontier.pop())):
        path = module.replace(".", "/") + ".py"
        parts = module.split(".")
        if parts[0] == "tests" and parts[-1].startswith("test_") and path in self.file_set:
          if path != rel and path not in found:
            found.append(path)
            frontier.append(path)
    return found

  def script_srcs(self, rel: str) -> list[str]:
    """A script and the sibling scripts it imports, directly or through each other
    (benchmarks.x or, from benchmarks/y.py, x -> benchmarks/x.py)."""
    srcs = [rel]
    frontier = [rel]
    while frontier:
      script = frontier.pop()
      for module in sorted(_imports(script)):
        path = module.replace(".", "/") + ".py"
        sibling = f"{Path(script).parent.as_posix()}/{path}"
        for candidate in (path, sibling):
          if candidate in self.scripts and candidate not in srcs:
            srcs.append(candidate)
            frontier.append(candidate)
    return srcs


def _list(items, indent=8):
  pad = " " * indent
  return "[\n" + "".join(f'{pad}"{item}",\n' for item in items) + " " * (indent - 4) + "]"


def _rule(kind: str, **attrs) -> list[str]:
  lines = [f"{kind}("]
  for key, value in attrs.items():
    if value is None or value == []:
      continue
    if isinstance(value, bool):
      lines.append(f"    {key} = {value},")
    elif isinstance(value, list):
      lines.append(f"    {key} = {_list(value)},")
    else:
      lines.append(f'    {key} = "{value}",')
  return lines + [")", ""]


def _check_acyclic(graph: dict[str, list[str]]) -> None:
  """Bazel rejects a cycle between targets; name it instead of writing a BUILD that cannot load."""
  state: dict[str, int] = {}

  def visit(node, path):
    state[node] = 1
    for dep in graph.get(node, []):
      if state.get(dep) == 1:
        cycle = path[path.index(dep) :] + [dep] if dep in path else [node, dep]
        raise SystemExit("update_build: import cycle between packages: " + " -> ".join(cycle))
      if dep not in state:
        visit(dep, path + [dep])
    state[node] = 2

  for node in sorted(graph):
    if node not in state:
      visit(node, [node])


def render() -> dict[str, str]:
  """The generated files: {path relative to the repository: text}."""
  layout = _Layout(_all_files())
  durations = load_durations()
  files = layout.files
  out = [
    "# Bazel build for fedmf: `python3 dev.py bazel` runs `bazel test //...` offline.",
    "# Generated by tools/update_build.py from the imports; tests/test_build_file.py checks it.",
    "# Python rules are Bazel's built-in ones; the interpreter is the project's .venv",
    "# (third_party/bazel/python).",
    "",
    'package(default_visibility = ["//visibility:public"])',
    "",
    'licenses(["notice"])',
    "",
    'exports_files(["pyproject.toml"])',
    "",
  ]
  graph: dict[str, list[str]] = {}
  for package in layout.packages:
    name = _library_name(package)
    srcs = [f for f in files if f.rsplit("/", 1)[0] == package]
    deps = layout.deps(srcs, own=":" + name)
    graph[":" + name] = [d for d in deps if d.startswith(":")]
    out += [f"# {package}/"] + _rule("py_library", name=name, srcs=srcs, deps=deps)
    out += _rule(
      "py_test",
      name=f"{name}_imports",
      size="large",  # (TensorFlow's import alone takes ~10 s on a loaded machine)
      srcs=[IMPORTS_RUNNER],
      main=IMPORTS_RUNNER,
      args=[package.replace("/", ".")],
      deps=[":" + name],
      tags=["ci"],
    )

  tests = [f for f in files if f.startswith("tests/")]
  helpers = [f for f in tests if not Path(f).name.startswith("test_")]
  helper_deps = layout.deps(helpers, own=":test_utils")
  graph[":test_utils"] = [d for d in helper_deps if d.startswith(":")]
  _check_acyclic(graph)
  out += ["# Test helpers, conftest.py files and package markers."]
  out += _rule("py_library", name="test_utils", testonly=True, srcs=helpers, deps=helper_deps)
  out += ["# The pytest runner of every py_test (pytest's settings come from pyproject.toml)."]
  out += _rule(
    "py_library",
    name="bazel_pytest",
    testonly=True,
    srcs=[RUNNER],
    data=["pyproject.toml"],
    deps=["@pypi//:pytest"],
  )
  layout.third_party.add("pytest")

  if "fedmf/cli/main.py" in layout.file_set:
    out += ["# The `fedmf` console script."]
    out += _rule(
      "py_binary",
      name="fedmf_cli",
      srcs=["fedmf/cli/main.py"],
      main="fedmf/cli/main.py",
      deps=[":cli"],
    )
  scripts = [f for f in files if f.split("/")[0] in SCRIPT_DIRS]
  for rel in scripts:
    srcs = layout.script_srcs(rel)
    deps = layout.deps(srcs)
    out += _rule(
      "py_binary",
      name=rel[:-3].replace("/", "_"),
      testonly=":test_utils" in deps or None,
      srcs=srcs,
      main=rel,
      deps=deps,
    )

  for rel in (f for f in tests if Path(f).name.startswith("test_")):
    text = (ROOT / rel).read_text()
    # Test files another test imports (its fixtures, its helpers) are sources of that test too:
    # :test_utils holds only the non-test_ helpers.
    imported = layout.imported_tests(rel)
    deps = sorted(set(layout.deps([rel, *imported])) | {":bazel_pytest", ":test_utils"})
    deps.sort(key=lambda label: (label.startswith("@"), label))
    local = any(marker in text for marker in LOCAL_MARKERS)
    tags = (["exclusive", "no-sandbox"] if local else []) + (["ci"] if rel in CI_TESTS else [])
    out += _rule(
      "py_test",
      name=rel[len("tests/") : -3].replace("/", "_"),
      size=size_of(durations.get(rel)),
      srcs=[RUNNER, rel, *imported],
      main=RUNNER,
      args=[rel],
      deps=deps,
      tags=tags or None,
    )

  pypi = [
    "# Offline stand-in for the third-party Python packages, generated by tools/update_build.py:",
    "# one empty py_library per top-level module the code imports, so BUILD can name what each",
    "# target uses. The modules come from the .venv interpreter (third_party/bazel/python).",
    "",
    'package(default_visibility = ["//visibility:public"])',
    "",
  ]
  for module in sorted(layout.third_party):
    pypi += [f'py_library(name = "{module}")', ""]
  return {
    "BUILD": "\n".join(out).rstrip("\n") + "\n",
    PYPI_BUILD: "\n".join(pypi).rstrip("\n") + "\n",
  }


def load_durations() -> dict[str, float]:
  """{test file: seconds} of tests/durations.json ({"measured": how, "seconds": {...}})."""
  path = ROOT / DURATIONS
  return json.loads(path.read_text())["seconds"] if path.exists() else {}


def size_of(seconds: float | None) -> str:
  """The least Bazel size whose timeout covers SIZE_MARGIN × the measured seconds."""
  if seconds is None:
    return UNMEASURED_SIZE
  for size, timeout in SIZES:
    if seconds * SIZE_MARGIN <= timeout:
      return size
  return SIZES[-1][0]


# "12.34s call     tests/mf/test_tree.py::test_x[3]" (pytest's --durations lines).
_DURATION_LINE = re.compile(r"^\s*([0-9.]+)s\s+(setup|call|teardown)\s+(tests/\S+?\.py)::")


def parse_durations(report: str) -> dict[str, float]:
  """{test file: seconds} summed over the --durations lines of a pytest report."""
  totals: dict[str, float] = {}
  for line in report.splitlines():
    match = _DURATION_LINE.match(line)
    if match:
      totals[match[3]] = totals.get(match[3], 0.0) + float(match[1])
  return totals


def merge_durations(reports: list[str]) -> dict[str, float]:
  """tests/durations.json's seconds with the files measured in `reports` replaced (others kept;
  files no longer on disk dropped)."""
  durations = load_durations()
  for report in reports:
    durations.update({f: round(t, 1) for f, t in parse_durations(report).items()})
  return {f: t for f, t in sorted(durations.items()) if (ROOT / f).is_file()}


def stale() -> list[str]:
  """Generated files whose text on disk differs from what render() gives."""
  return [
    path
    for path, text in render().items()
    if not (ROOT / path).exists() or (ROOT / path).read_text() != text
  ]


def main() -> int:
  if "--durations" in sys.argv:
    logs = sys.argv[sys.argv.index("--durations") + 1 :]
    merged = merge_durations([Path(log).read_text() for log in logs])
    how = (
      "pytest --durations=0 (setup + call + teardown per file), merged by "
      "python3 tools/update_build.py --durations LOG..."
    )
    text = json.dumps({"measured": how, "seconds": merged}, indent=1, ensure_ascii=False)
    (ROOT / DURATIONS).write_text(text + "\n")
  if "--check" in sys.argv:
    old = stale()
    if old:
      print(f"update_build: not current: {', '.join(old)}; run python3 tools/update_build.py")
      return 1
    return 0
  for path, text in render().items():
    (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
    (ROOT / path).write_text(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
