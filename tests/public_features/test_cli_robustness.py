"""`fedmf public-features` meets the standard of the rest of fedmf (issue 34, "What does not" item 4,
every case): bad input is one line on stderr, exit 2, no traceback, and nothing is written (not even
an empty --out); a finished run is replaced only with --force, whole, and a crash leaves OUT as it
was."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from fedmf.public_features import movielens
from tests.public_features import movielens_files as files

TINY = ["--set", "num_users=200", "--set", "num_items=20", "--set", "num_people=40"]
TINY += ["--set", "outer_steps=1", "--set", "item_steps=3", "--set", "dpsgd_steps=3"]


def _refused(tmp_path, capsys, args, message, out=None):
  out = str(tmp_path / "o") if out is None else out
  try:
    code = cli_main.main(["public-features", *args, "--out", out])
  except SystemExit as e:  # a usage error, printed by argparse
    code = e.code
  stdout, err = capsys.readouterr()
  assert code == 2, err
  assert message in err, err
  assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and not stdout
  return err


def _nothing_written(tmp_path):
  assert not (tmp_path / "o").exists()
  assert not [p for p in tmp_path.iterdir() if ".staging-" in p.name]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--set", "seed=100000000000000000000000"], "seed must be an integer from 0 to 2^63 - 1"),
    (["--set", "seed=-1"], "seed must be an integer from 0 to 2^63 - 1, got -1"),
    (["--set", "seed=1.5"], "seed must be an integer, got 1.5"),
    (["--set", "reg_item=1e308"], "reg_item must be a number from 1e-09 to 1e+12, got 1e+308"),
    (["--set", "reg_item=1e300"], "reg_item must be a number from 1e-09 to 1e+12, got 1e+300"),
    (["--set", "reg_item=1e-320"], "reg_item must be a number from 1e-09 to 1e+12, got 1e-320"),
    (["--set", "rating_offset=.nan"], "rating_offset must be finite, got nan"),
    (["--set", "clip_user=.inf"], "clip_user must be finite"),
    (["--set", "outer_steps=1000000000000"], "outer_steps must be an integer from 1 to 1e+09"),
    (["--set", "epsilon=0"], "epsilon must be a number > 0 (or inf)"),
    (["--set", "epsilon=-inf"], "epsilon must be a number > 0 (or inf)"),
    (["--set", "delta=1"], "delta must be in (0, 1)"),
    (["--set", "colour=red"], "unknown config key 'colour'"),
    (["--set", "privacy.delta=1e-6"], "fedmf public-features keys are flat"),
    (["--set", "algorithm=sgd"], "algorithm must be one of"),
    (["--set", "dpsgd_optimizer=rmsprop"], "dpsgd_optimizer must be one of sgd, adam"),
    (["--set", "data=movielens-10m"], "needs a data directory"),
    (["--set", "dim=two"], "dim must be an integer, got 'two'"),
    (["--set", "dim="], "dim must be an integer, got null"),  # --set KEY= is null
    (["--set", "federated=true", "--set", "algorithm=am-dpsgd"], "federated runs am-ssp"),
    (["--set", "delta=1e-6", "--set", "delta=1e-7"], "--set delta is given twice"),
    (["--set", "rounds", "10"], "argument --set: takes KEY=VALUE, got 'rounds'"),
    (["--set", "validation_fraction=0.5", "--set", "test_fraction=0.5"], "must be < 1"),
  ],
)
def test_a_bad_value_is_one_line_exit_2_and_nothing_is_written(tmp_path, capsys, args, message):
  _refused(tmp_path, capsys, args, message)
  _nothing_written(tmp_path)


def test_a_yaml_key_given_twice_is_refused_with_both_lines(tmp_path, capsys):
  config = tmp_path / "c.yaml"
  config.write_text("epsilon: 1\ndim: 4\nepsilon: 2\n")
  _refused(
    tmp_path, capsys, ["--config", str(config)], "key 'epsilon' is given twice (lines 1 and 3)"
  )
  _nothing_written(tmp_path)


def test_a_huge_run_is_refused_from_its_estimate_before_any_work(tmp_path, capsys):
  err = _refused(tmp_path, capsys, ["--set", "outer_steps=1000000"], "--max-seconds S raises it")
  assert "days" in err or "years" in err
  _refused(tmp_path, capsys, ["--set", "num_users=100000000"], "--max-memory GIB raises it")
  _nothing_written(tmp_path)


def test_a_1_gib_ratings_file_is_refused_from_its_size_without_reading_it(tmp_path, capsys):
  directory = files.write("movielens-100k", tmp_path / "d", [(1, 1, 3.0)])
  with open(directory / "u.data", "r+b") as f:
    f.truncate(2**30)  # sparse: 1 GiB of NUL bytes, which the reader would refuse as a bad row
  args = ["--set", "data=movielens-100k", "--data-dir", str(directory)]
  err = _refused(tmp_path, capsys, args, "of memory")
  assert "ratings" in err and "u.data" not in err  # refused by the estimate, not by reading
  _nothing_written(tmp_path)


@pytest.mark.parametrize(
  "bad, message",
  [
    ("7\t1\t1e308\t0", "u.data:5: rating 1e308 is not a finite number in [-1e6, 1e6]"),
    ("-7\t1\t4\t0", "u.data:5: user id -7 is not an integer in [0, 2^63)"),
    ("12345678901234567890123\t1\t4\t0", "u.data:5: user id 12345678901234567890123 is not an"),
    ("1\t1\t4\t0", "u.data:5: user 1 rated movie 1 again (first at line 1)"),
  ],
)
def test_a_bad_rating_is_refused_with_its_line(tmp_path, capsys, bad, message):
  rows = [(1, 1, 3.0), (2, 1, 4.0), (2, 2, 5.0), (3, 7, 1.0)]
  directory = files.write("movielens-100k", tmp_path / "d", rows)
  with open(directory / "u.data", "a") as f:
    f.write(bad + "\n")
  args = ["--set", "data=movielens-100k", "--data-dir", str(directory)]
  _refused(tmp_path, capsys, args, message)
  _nothing_written(tmp_path)


def test_a_movie_listed_twice_is_refused(tmp_path, capsys):
  directory = files.write("movielens-10m", tmp_path / "d", [(1, 1, 3.0)])
  with open(directory / "movies.dat", "a", encoding="latin-1") as f:
    f.write("1::Toy Story again (1995)::Comedy\n")
  args = ["--set", "data=movielens-10m", "--data-dir", str(directory)]
  _refused(tmp_path, capsys, args, "movies.dat:7: movie 1 is listed again (first at line 1)")
  _nothing_written(tmp_path)


def test_a_bom_and_crlf_files_run(tmp_path, capsys):
  rows = files.random_rows(np.random.default_rng(0), num_users=30)
  directory = files.write("movielens-10m", tmp_path / "d", rows, "\r\n", bom=True)
  argv = ["public-features", "--set", "data=movielens-10m", "--data-dir", str(directory), *TINY]
  assert cli_main.main([*argv, "--out", str(tmp_path / "o")]) == 0
  capsys.readouterr()


@pytest.mark.parametrize("where", ["file", "under-file", "sys", "empty"])
def test_an_unusable_out_is_refused_before_work(tmp_path, capsys, where):
  (tmp_path / "f").write_text("x")
  out, message = {
    "file": (str(tmp_path / "f"), "output path exists and is not a directory"),
    "under-file": (str(tmp_path / "f" / "o"), "is not a directory"),
    "sys": ("/sys/fedmf-pf-test", "does not accept new directories"),
    "empty": ("", "--out must name a directory, got ''"),
  }[where]
  cwd = os.getcwd()
  os.chdir(tmp_path)  # `--out ''` must not write into the working directory
  try:
    _refused(tmp_path, capsys, TINY, message, out=out)
  finally:
    os.chdir(cwd)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
  assert (tmp_path / "f").read_text() == "x"


def test_a_finished_run_is_replaced_only_with_force_and_whole(tmp_path, capsys):
  out = tmp_path / "o"
  assert cli_main.main(["public-features", *TINY, "--out", str(out)]) == 0
  first = json.loads((out / "run.json").read_text())
  capsys.readouterr()
  err = _refused(tmp_path, capsys, [*TINY, "--set", "seed=1"], "already holds a run")
  assert "--force" in err
  assert json.loads((out / "run.json").read_text()) == first
  assert (
    cli_main.main(["public-features", *TINY, "--set", "seed=1", "--force", "--out", str(out)]) == 0
  )
  capsys.readouterr()
  second = json.loads((out / "run.json").read_text())
  assert second["run_id"] != first["run_id"] and second["state"] == "finished"
  assert json.loads((out / "summary.json").read_text())["seed"] == 1
  assert set(second["files"]) == {"config.json", "metrics.csv", "summary.json"}


def test_a_directory_of_other_files_is_never_replaced(tmp_path, capsys):
  out = tmp_path / "o"
  out.mkdir()
  (out / "thesis.tex").write_text("mine")
  _refused(tmp_path, capsys, [*TINY, "--force"], "holds files that are not a fedmf run's")
  assert (out / "thesis.tex").read_text() == "mine"


def test_a_crash_during_the_run_leaves_the_earlier_run_and_no_staging(
  tmp_path, capsys, monkeypatch
):
  out = tmp_path / "o"
  assert cli_main.main(["public-features", *TINY, "--out", str(out)]) == 0
  capsys.readouterr()
  before = {p.name: p.read_bytes() for p in out.iterdir()}
  from fedmf.public_features import driver

  def crash(cfg, directory, progress=None):
    (Path(directory) / "summary.json").write_text("half")
    raise KeyboardInterrupt

  monkeypatch.setattr(driver, "run", crash)
  assert cli_main.main(["public-features", *TINY, "--force", "--out", str(out)]) == 130
  capsys.readouterr()
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before
  assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
  # And a first run that crashes leaves no OUT at all, nor the parents it would have made.
  assert cli_main.main(["public-features", *TINY, "--out", str(tmp_path / "a" / "b")]) == 130
  capsys.readouterr()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_the_layouts_are_named_in_the_help(capsys):
  with pytest.raises(SystemExit):
    cli_main.main(["public-features", "--help"])
  text = capsys.readouterr().out
  for layout, names in movielens.LAYOUTS.items():
    assert layout in text and names.ratings in text
