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
