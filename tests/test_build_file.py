"""The Bazel BUILD file declares every library module and every test file (kept in step with the code)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared_sources() -> set[str]:
  text = (ROOT / "BUILD").read_text()
  return set(re.findall(r'"((?:fedmf|tests|simulations|deploy|benchmarks)/[\w/]+\.py)"', text))


def test_every_python_file_is_declared():
  declared = _declared_sources()
  on_disk = {
    str(p.relative_to(ROOT))
    for d in ("fedmf", "tests", "deploy", "benchmarks")
    for p in (ROOT / d).rglob("*.py")
  }
  missing = sorted(on_disk - declared)
  stale = sorted(p for p in declared if not (ROOT / p).exists())
  assert not missing, f"BUILD does not declare: {missing}"
  assert not stale, f"BUILD declares files that do not exist: {stale}"


def test_math_library_does_not_depend_on_tensorflow():
  text = (ROOT / "BUILD").read_text()
  block = re.search(r'py_library\(\s*name = "mf",(.*?)\n\)', text, re.S)
  assert block, "BUILD needs a py_library named mf for the pure-math layer"
  assert "tensorflow" not in block.group(1)
