#!/usr/bin/env python3
"""The module import graph of fedmf/, function-level imports included, and its import cycles.

Every `import` / `from ... import` anywhere in a module (top level, inside functions, under
`if TYPE_CHECKING`) is an edge: a function-level import hides a cycle from Python but not from the
design. `from fedmf.mf import banded` points at the module fedmf.mf.banded; `from fedmf.mf.strategy
import X` at fedmf.mf.strategy; `from fedmf.mf import name` where `name` is not a module at the
package fedmf.mf (its __init__). Cycles are the strongly connected components with more than one
module (or a module importing itself), found by Tarjan's algorithm (Tarjan 1972).

Run: python3 tools/depgraph.py            # cycles (exit 1 if any)
     python3 tools/depgraph.py --edges    # every edge, one "importer -> imported" per line
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path = ROOT) -> str:
  """fedmf/mf/banded.py -> fedmf.mf.banded; fedmf/mf/__init__.py -> fedmf.mf."""
  parts = list(path.relative_to(root).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def modules(package: str = "fedmf", root: Path = ROOT) -> dict[str, Path]:
  """Every module of the package on disk, by dotted name."""
  return {
    module_name(p, root): p
    for p in sorted((root / package).rglob("*.py"))
    if "__pycache__" not in p.parts
  }


def _imported_names(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[str, list[str]]]:
  """(module, names) for every import statement anywhere in the tree; relative ones resolved."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.extend((alias.name, []) for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
      found.append((base, [alias.name for alias in node.names]))
  return found


def import_graph(package: str = "fedmf", root: Path = ROOT) -> dict[str, set[str]]:
  """importer -> the package's modules it imports (edges to other packages are dropped)."""
  known = modules(package, root)
  graph: dict[str, set[str]] = {name: set() for name in known}
  for name, path in known.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    for target, names in _imported_names(tree, name, path.name == "__init__.py"):
      if not names:  # import a.b.c
        if target in known:
          graph[name].add(target)
        continue
      for imported in names:
        if f"{target}.{imported}" in known:  # from a.b import c (a module)
          graph[name].add(f"{target}.{imported}")
        elif target in known:  # from a.b import name (defined in a.b)
          graph[name].add(target)
  return graph


def strongly_connected_components(graph: dict[str, set[str]]) -> list[list[str]]:
  """Tarjan's algorithm, iterative (no recursion limit), components in sorted order."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  on_stack: set[str] = set()
  stack: list[str] = []
  components: list[list[str]] = []
  counter = 0
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = counter
    counter += 1
    stack.append(start)
    on_stack.add(start)
    while work:
      node, successors = work[-1]
      advanced = False
      for succ in successors:
        if succ not in graph:
          continue
        if succ not in index:
          index[succ] = low[succ] = counter
          counter += 1
          stack.append(succ)
          on_stack.add(succ)
          work.append((succ, iter(sorted(graph[succ]))))
          advanced = True
          break
        if succ in on_stack:
          low[node] = min(low[node], index[succ])
      if advanced:
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        components.append(sorted(component))
  return sorted(components)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The import cycles: components of more than one module, or a module importing itself."""
  return [
    c for c in strongly_connected_components(graph) if len(c) > 1 or c[0] in graph.get(c[0], ())
  ]


def main(argv: list[str]) -> int:
  graph = import_graph()
  if "--edges" in argv:
    for importer in sorted(graph):
      for imported in sorted(graph[importer]):
        print(f"{importer} -> {imported}")
    return 0
  found = cycles(graph)
  for component in found:
    print("import cycle: " + " <-> ".join(component))
  edges = sum(len(v) for v in graph.values())
  print(f"{len(graph)} modules, {edges} imports, {len(found)} cycle(s)")
  return 1 if found else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
