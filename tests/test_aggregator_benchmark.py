"""Smoke tests of benchmarks/aggregator_benchmark.py on its --tiny model (no timing checked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'benchmarks' / 'aggregator_benchmark.py'


def _run(tmp_path, *args):
  out = tmp_path / 'bench.json'
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run(
    [sys.executable, str(SCRIPT), '--tiny', '--rounds', '1', '--json', str(out), *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout, json.loads(out.read_text())


def test_tiny_benchmark_runs_the_split_path_against_gaussian_fixed(tmp_path):
  stdout, result = _run(
    tmp_path, '--arms', 'tff-gaussian-fixed,split-bandmf-4', '--noise-mechs', 'bandmf-4'
  )
  assert '| split-bandmf-4 |' in stdout and '| bandmf-4 |' in stdout
  arms = {row['name']: row for row in result['round']['arms']}
  assert arms['tff-gaussian-fixed']['x_gaussian_fixed'] == 1.0
  assert arms['split-bandmf-4']['noise_buffers_mib'] > 0
  (noise,) = result['noise']
  assert noise['buffers_mib'] > 0 and noise['bound_gbps'] > 0


@pytest.mark.slow
def test_tiny_benchmark_default_arms(tmp_path):
  stdout, result = _run(tmp_path)
  assert {row['name'] for row in result['round']['arms']} >= {'factory-blt-4', 'tff-tree'}
  assert len(result['noise']) == 4
