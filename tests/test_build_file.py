"""The Bazel BUILD files are current (tools/update_build.py regenerates them from the imports),
declare every Python file, and their dependencies follow the imports."""

import re
import textwrap
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def _generator():
  return load_script("tools/update_build.py")


def _declared_sources() -> set[str]:
  text = (ROOT / "BUILD").read_text()
  return set(
    re.findall(r'"((?:fedmf|tests|simulations|deploy|benchmarks|tools)/[\w/]+\.py)"', text)
  )


def test_build_files_are_current():
  stale = _generator().stale()
  assert not stale, f"regenerate with `python3 tools/update_build.py`: {stale} not current"


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


def test_every_test_file_is_a_py_test_run_by_pytest():
  text = (ROOT / "BUILD").read_text()
  tests = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
  for rel in tests:
    block = re.search(r'py_test\((?:(?!\n\)).)*?args = \[\s*"' + re.escape(rel) + r'"', text, re.S)
    assert block, f"no py_test runs {rel}"
  libraries = re.findall(r'py_library\(\s*name = "(\w+)"', text)
  packages = [name for name in libraries if name not in ("test_utils", "bazel_pytest")]
  # One py_test per test file, plus one import check per fedmf library (tools/bazel_imports.py).
  assert text.count("py_test(") == len(tests) + len(packages)
  assert text.count('main = "tools/bazel_pytest.py"') == len(tests)
  for name in packages:
    block = re.search(r'py_test\(\s*name = "' + name + r'_imports",(?:(?!\n\)).)*', text, re.S)
    assert block, f"no import check of :{name}"
    assert 'main = "tools/bazel_imports.py"' in block.group(0)
    assert f'deps = [\n        ":{name}",\n    ]' in block.group(0)  # Its library alone.
    assert '"ci"' in block.group(0)


def test_ci_runs_what_only_bazel_checks():
  """Issue 38 item 21: `python3 dev.py bazel` (CI) builds every target and runs the tests tagged
  ci, a representative set, instead of the whole suite a second time."""
  text = (ROOT / "BUILD").read_text()
  tagged = re.findall(r'args = \[\s*"(tests/[^"]+)",(?:(?!\n\)).)*?"ci"', text, re.S)
  update_build = load_script("tools/update_build.py")
  assert sorted(tagged) == sorted(update_build.CI_TESTS)
  assert all((ROOT / rel).is_file() for rel in update_build.CI_TESTS)
  dev = (ROOT / "dev.py").read_text()
  assert '"--test_tag_filters=ci", "--", "//..."' in dev


def _write(root: Path, rel: str, text: str = "") -> None:
  (root / rel).parent.mkdir(parents=True, exist_ok=True)
  (root / rel).write_text(textwrap.dedent(text))


def test_generator_derives_deps_from_imports(tmp_path, monkeypatch):
  gen = _generator()
  _write(tmp_path, "fedmf/__init__.py")
  _write(tmp_path, "fedmf/mf/__init__.py")
  _write(tmp_path, "fedmf/mf/a.py", "import numpy as np\nfrom .. import errors\n")
  _write(tmp_path, "fedmf/errors.py")
  _write(tmp_path, "fedmf/new_pkg/x.py", "def f():\n  from fedmf.mf import a\n  import yaml\n")
  _write(tmp_path, "tests/__init__.py")
  _write(tmp_path, "tests/test_x.py", "import pytest\nfrom fedmf.new_pkg import x\n")
  monkeypatch.setattr(gen, "ROOT", tmp_path)
  build = gen.render()["BUILD"]
  pypi = gen.render()[gen.PYPI_BUILD]

  def block(kind, name):
    found = re.search(kind + r'\(\s*name = "' + name + r'",(.*?)\n\)', build, re.S)
    assert found, f"no {kind} {name}"
    return found.group(1)

  assert '":fedmf_root"' in block("py_library", "mf") and '"@pypi//:numpy"' in block(
    "py_library", "mf"
  )
  new = block(
    "py_library", "new_pkg"
  )  # a package added later is picked up, function-level imports too
  assert '":mf"' in new and '"@pypi//:yaml"' in new and "numpy" not in new
  assert '":new_pkg"' in block("py_test", "test_x")
  # Only modules something imports get a @pypi target.
  assert set(re.findall(r'name = "(\w+)"', pypi)) == {"numpy", "yaml", "pytest"}


def test_generator_refuses_an_import_cycle(tmp_path, monkeypatch):
  gen = _generator()
  _write(tmp_path, "fedmf/__init__.py")
  _write(tmp_path, "fedmf/a/m.py", "from fedmf.b import m\n")
  _write(tmp_path, "fedmf/b/m.py", "from fedmf.a import m\n")
  monkeypatch.setattr(gen, "ROOT", tmp_path)
  with pytest.raises(SystemExit, match="import cycle"):
    gen.render()


def test_test_sizes_come_from_measured_durations():
  gen = _generator()
  report = textwrap.dedent(
    """\
    ============================= slowest durations =============================
    12.34s call     tests/mf/test_tree.py::test_x[3]
    0.50s setup    tests/mf/test_tree.py::test_x[3]
    0.01s teardown tests/mf/test_tree.py::test_y
    150.00s call     tests/program/test_train.py::test_resume
    (3 durations < 0.005s hidden.  Use -vv to show these durations.)
    """
  )
  assert gen.parse_durations(report) == pytest.approx(
    {"tests/mf/test_tree.py": 12.85, "tests/program/test_train.py": 150.0}
  )
  # The least size whose timeout covers three times the measured time; unmeasured: large.
  assert [gen.size_of(t) for t in (12.85, 20.0, 21.0, 150.0, 301.0, None)] == [
    "small",
    "small",
    "medium",
    "large",
    "enormous",
    "large",
  ]
  durations = gen.load_durations()
  text = (ROOT / "BUILD").read_text()
  for rel, seconds in durations.items():
    name = rel[len("tests/") : -3].replace("/", "_")
    assert f'name = "{name}",\n    size = "{gen.size_of(seconds)}"' in text, name
