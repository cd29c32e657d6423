"""Docstrings, comments and docs name only things that exist (issue 21 §5).

Every `fedmf.a.b[.Name[.attr]]` written in backticks in fedmf/, benchmarks/, tools/ and docs/ must
resolve: the longest module prefix is a file under fedmf/, and the names after it are defined at
the top level of that module (def, class, assignment, import) or, for a class, in its body. Read
with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = re.compile(r"`(fedmf(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# A file of the project in backticks: `tests/x.py`, `fedmf/mf/x.py`, or a package-relative
# `mf/x.py` as docs/architecture.md's module table writes them.
PACKAGES = ("mf", "privacy", "participation", "tff", "tasks", "program", "cli", "public_features")
FILE = re.compile(
  r"`((?:fedmf|tests|benchmarks|tools|deploy|simulations|docs|"
  + "|".join(PACKAGES)
  + r")/[A-Za-z0-9_./-]+\.(?:py|md|yaml|sh))`"
)


def _module_file(dotted: str) -> Path | None:
  path = ROOT.joinpath(*dotted.split("."))
  if path.with_suffix(".py").is_file():
    return path.with_suffix(".py")
  if (path / "__init__.py").is_file():
    return path / "__init__.py"
  return None


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
  return ast.parse(path.read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
  names: dict[str, ast.AST] = {}
  for node in body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names[node.name] = node
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for t in targets:
        for n in ast.walk(t):
          if isinstance(n, ast.Name):
            names[n.id] = node
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      for alias in node.names:
        names[(alias.asname or alias.name).split(".")[0]] = node
    elif isinstance(node, (ast.If, ast.Try)):
      names.update(_defined(node.body))
  return names


def _exports(tree: ast.Module) -> set[str]:
  """Names a PEP 562 package exports through an `_EXPORTS = {name: module}` table."""
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
    ):
      if isinstance(node.value, ast.Dict):
        return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
  return set()


def _resolves(dotted: str) -> bool:
  parts = dotted.split(".")
  for cut in range(len(parts), 0, -1):
    path = _module_file(".".join(parts[:cut]))
    if path is None:
      continue
    rest = parts[cut:]
    if not rest:
      return True
    tree = _tree(path)
    names = _defined(tree.body)
    node = names.get(rest[0])
    if node is None:
      return rest[0] in _exports(tree)
    for attr in rest[1:]:
      if not isinstance(node, ast.ClassDef):
        return True  # an attribute of a value: not checked
      members = _defined(node.body)
      if attr not in members:
        return False
      node = members[attr]
    return True
  return False


def _sources() -> list[Path]:
  files = [p for d in ("fedmf", "benchmarks", "tools") for p in (ROOT / d).rglob("*.py")]
  return files + sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]


def test_every_fedmf_name_in_code_and_docs_exists():
  missing = []
  for path in _sources():
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      for match in REFERENCE.finditer(line):
        dotted = match.group(1).rstrip(".")
        if not _resolves(dotted):
          missing.append(f"{path.relative_to(ROOT)}:{number}: {dotted}")
  assert not missing, "names that do not exist:\n" + "\n".join(missing)


def test_every_project_file_named_in_code_and_docs_exists():
  missing = []
  for path in _sources():
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      for match in FILE.finditer(line):
        name = match.group(1)
        if name.split("/")[0] in PACKAGES:
          if name.count("/") > 1:
            continue  # another project's path (tensorflow_privacy's privacy/analysis/...)
          name = "fedmf/" + name
        if "*" not in name and not (ROOT / name).exists():
          missing.append(f"{path.relative_to(ROOT)}:{number}: {match.group(1)}")
  assert not missing, "files that do not exist:\n" + "\n".join(missing)


def test_the_check_itself_finds_a_missing_name():
  assert _resolves("fedmf.mf.strategies.load_strategy")
  assert _resolves("fedmf.mf.strategy.Strategy.sensitivity")
  assert not _resolves("fedmf.mf.strategies.no_such_function")
  assert not _resolves("fedmf.mf.strategy.Strategy.no_such_method")
  assert not _resolves("fedmf.no_such_package")
