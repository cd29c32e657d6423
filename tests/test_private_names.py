"""No private names across fedmf modules and no re-export facades (issue 39 item 2).

A name another module needs is public in the module that owns it. So no module of fedmf/
imports an underscore name from another fedmf module (``from fedmf.x import _y``), or reads one
through a module it imported (``x_lib._y``, ``fedmf.x._y``); and no module outside a package's
``__init__.py`` carries a ``# noqa: F401`` block, the mark of names imported only to be
re-exported."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in (ROOT / "fedmf").rglob("*.py") if "__pycache__" not in p.parts)


def _module_of(path: Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_private(name: str) -> bool:
  return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str, module: str) -> list[str]:
  """'line: what' for each underscore name of another fedmf module that ``source`` uses."""
  tree = ast.parse(source)
  found = []
  aliases: dict[str, str] = {}  # local name -> fedmf module it stands for
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedmf"):
      for alias in node.names:
        if _is_private(alias.name) and node.module != module:
          found.append(f"{node.lineno}: from {node.module} import {alias.name}")
        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("fedmf"):
          aliases[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or "fedmf"
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and _is_private(node.attr):
      base = node.value
      chain = []
      while isinstance(base, ast.Attribute):
        chain.append(base.attr)
        base = base.value
      if isinstance(base, ast.Name) and base.id in aliases:
        target = ".".join([aliases[base.id], *reversed(chain)])
        if target != module:
          found.append(f"{node.lineno}: {target}.{node.attr}")
  return found


def test_the_check_sees_both_forms():
  source = (
    "from fedmf.privacy import audit as audit_lib\n"
    "from fedmf.tff.aggregators import _seed_pair\n"
    "audit_lib._declared_in_words(1)\n"
    "audit_lib.public(1)\n"
  )
  assert private_imports(source, "fedmf.program.x") == [
    "2: from fedmf.tff.aggregators import _seed_pair",
    "3: fedmf.privacy.audit._declared_in_words",
  ]
  assert private_imports("from fedmf.a import _b\n", "fedmf.a") == []  # its own


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_names_across_modules(path):
  assert private_imports(path.read_text(), _module_of(path)) == []


def test_no_reexport_blocks_outside_package_inits():
  offenders = [
    f"{path.relative_to(ROOT)}:{i}"
    for path in FILES
    if path.name != "__init__.py"
    for i, line in enumerate(path.read_text().splitlines(), 1)
    if "noqa: F401" in line and not line.lstrip().startswith("import ")
  ]
  assert offenders == []
