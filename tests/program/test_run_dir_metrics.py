"""`run_dir.read_metrics`: a run's metrics.csv and initial accuracy, read by the program for its report."""

import math

import numpy as np

from fedmf.program import run_dir


def test_reads_the_columns_and_the_initial_accuracy(tmp_path):
  (tmp_path / "metrics.csv").write_text("round,loss,accuracy\n0,2.5,\n1,2.0,0.25\n")
  (tmp_path / "summary.json").write_text('{"initial_test_accuracy": 0.125}\n')
  metrics = run_dir.read_metrics(tmp_path)
  np.testing.assert_array_equal(metrics.columns["round"], [0.0, 1.0])
  np.testing.assert_array_equal(metrics.columns["loss"], [2.5, 2.0])
  assert math.isnan(metrics.columns["accuracy"][0]) and metrics.columns["accuracy"][1] == 0.25
  assert metrics.initial_accuracy == 0.125
  assert run_dir.read_metrics(tmp_path, initial_accuracy=0.5).initial_accuracy == 0.5


def test_no_or_unusable_metrics_is_none(tmp_path):
  assert run_dir.read_metrics(tmp_path) is None
  (tmp_path / "metrics.csv").write_text("loss\n1.0\n")  # No round column.
  assert run_dir.read_metrics(tmp_path) is None
  (tmp_path / "metrics.csv").write_text("round,loss\n0,1.0\n")
  assert run_dir.read_metrics(tmp_path).initial_accuracy is None  # No summary.json.


def test_metrics_csv_has_one_reader(tmp_path, monkeypatch):
  """`fedmf train`'s summary reads metrics.csv back through `run_dir.metrics_rows`, the report's
  reader too: one reader of the file, whatever wrote it."""
  from fedmf.program import run_dir, train

  (tmp_path / "metrics.csv").write_text("round,loss,clients,accuracy\n0,2.5,4,\n1,2.0,4,0.25\n")
  rows = run_dir.metrics_rows(tmp_path)
  assert [r["round"] for r in rows] == ["0", "1"]
  records = train._all_records(tmp_path)
  assert [(r.round, r.loss, r.clients, r.accuracy) for r in records] == [
    (0, 2.5, 4, None),
    (1, 2.0, 4, 0.25),
  ]
  monkeypatch.setattr(run_dir, "metrics_rows", lambda directory: [{"round": "7", "loss": "1"}])
  assert [r.round for r in train._all_records(tmp_path)] == [7]
  (tmp_path / "metrics.csv").write_text("no,rounds,column\n1,2,3\n")
  monkeypatch.undo()
  assert run_dir.metrics_rows(tmp_path) is None and run_dir.read_metrics(tmp_path) is None


def test_metrics_rows_keep_a_float32_metric_exactly():
  from fedmf.program import outputs

  rng = np.random.default_rng(0)
  values = rng.uniform(0, 10, size=1000).astype(np.float32)
  for value in values:
    row = outputs.metrics_row({"round": 3, "loss": float(value)}, ("round", "loss"))
    assert np.float32(float(row.strip().split(",")[1])) == value
