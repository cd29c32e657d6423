"""The import structure of fedmf/: no import cycles (function-level imports included) and no import
from a lower layer to a higher one, with the layers read from the one table in docs/architecture.md."""

import re
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _load_depgraph():
  return load_script("tools/depgraph.py")


depgraph = _load_depgraph()


def parse_layers(markdown: str) -> dict[str, int]:
  """{'fedmf/mf': 1, ...} from the rows between the layers:begin / layers:end markers."""
  block = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", markdown, re.S)
  if block is None:
    raise ValueError(
      "docs/architecture.md has no <!-- layers:begin --> ... <!-- layers:end --> table"
    )
  layers = {}
  for line in block.group(1).splitlines():
    row = re.match(r"\|\s*(\d+)\s*\|(.*)\|\s*$", line)
    if row is None:
      continue
    for package in re.findall(r"`(fedmf(?:/\w+)*)`", row.group(2)):
      if package in layers:
        raise ValueError(f"{package} is listed twice in the layer table")
      layers[package] = int(row.group(1))
  return layers


LAYERS = parse_layers((ROOT / "docs" / "architecture.md").read_text())


def layer_of(module: str, layers: dict[str, int] = LAYERS) -> int:
  """The layer of the longest package path containing the module (fedmf.mf.banded -> fedmf/mf)."""
  parts = module.split(".")
  for end in range(len(parts), 0, -1):
    package = "/".join(parts[:end])
    if package in layers:
      if end == 1 and len(parts) > 2:
        break  # fedmf.newpkg.x is not a top-level module: its package needs a row of its own.
      return layers[package]
  raise KeyError(f"{module} is in no package of the layer table in docs/architecture.md")


def upward_imports(graph, layers=LAYERS) -> list[str]:
  return sorted(
    f"{importer} (layer {layer_of(importer, layers)}) imports {imported} "
    f"(layer {layer_of(imported, layers)})"
    for importer, targets in graph.items()
    for imported in targets
    if layer_of(imported, layers) > layer_of(importer, layers)
  )


def test_the_layer_table_lists_the_packages():
  assert LAYERS["fedmf"] == 0
  assert LAYERS["fedmf/mf"] == 1
  assert LAYERS["fedmf/privacy"] == LAYERS["fedmf/participation"] == 2
  assert LAYERS["fedmf/cli"] == max(LAYERS.values())


def test_every_module_has_a_layer():
  for module in depgraph.modules():
    layer_of(module)  # Raises for a package missing from the table.


def test_no_import_cycles_in_fedmf():
  found = depgraph.cycles(depgraph.import_graph())
  assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_from_a_lower_layer_to_a_higher_one():
  bad = upward_imports(depgraph.import_graph())
  assert not bad, "\n".join(bad)


# The checks themselves, on small made-up packages (each could fail).


def _write(root: Path, files: dict[str, str]) -> None:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_function_level_import_cycle_is_found(tmp_path):
  _write(
    tmp_path,
    {
      "fedmf/__init__.py": "",
      "fedmf/mf/__init__.py": "",
      "fedmf/mf/a.py": "from fedmf.mf import b\n",
      "fedmf/mf/b.py": "def f():\n  from fedmf.mf.c import g\n",
      "fedmf/mf/c.py": "def g():\n  from . import a\n",
      "fedmf/mf/d.py": "from fedmf.mf import a\n",
    },
  )
  graph = depgraph.import_graph("fedmf", tmp_path)
  assert graph["fedmf.mf.b"] == {"fedmf.mf.c"}
  assert graph["fedmf.mf.c"] == {"fedmf.mf.a"}
  assert depgraph.cycles(graph) == [["fedmf.mf.a", "fedmf.mf.b", "fedmf.mf.c"]]


def test_an_acyclic_graph_has_no_cycles():
  graph = {"x": {"y", "z"}, "y": {"z"}, "z": set()}
  assert depgraph.cycles(graph) == []
  assert depgraph.cycles({"x": {"x"}}) == [["x"]]


def test_an_upward_import_is_reported():
  layers = parse_layers(
    "<!-- layers:begin -->\n| 0 | `fedmf` |\n| 1 | `fedmf/mf` |\n| 2 | `fedmf/tff` |\n"
    "<!-- layers:end -->"
  )
  graph = {"fedmf.mf.s": {"fedmf.tff.agg", "fedmf.errors"}, "fedmf.tff.agg": {"fedmf.mf.s"}}
  assert upward_imports(graph, layers) == ["fedmf.mf.s (layer 1) imports fedmf.tff.agg (layer 2)"]
  with pytest.raises(KeyError, match="fedmf.tasks.x"):
    layer_of("fedmf.tasks.x", layers)
