"""`fedmf train` on `fedmf worker --listen unix:PATH` services: the contract of issue 35 (the
coordinator's `workers` list accepts `unix:PATH`), no TLS, and the in-process model bit for bit."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedmf.cli import main as cli_main
from tests.helpers import settings
from tests.deploy.workers_helpers import running_worker

TINY = [
  "num_clients=40",
  "vocab_size=30",
  "clients_per_round=4",
  "clients_per_call=1",
  "max_sentences_per_client=8",
  "test_sentences=32",
  "eval_every=3",
  "participation.min_sep=3",
  "noise_seed=3",
  "noise_multiplier=1.0",
  "rounds=3",
  "checkpoint_every=2",
]


def _train(root: Path, extra: list[str], capsys) -> None:
  args = ["train", "--root", str(root), "--no-progress"]
  for item in settings(TINY, extra):
    args += ["--set", item]
  assert cli_main.main(args) == 0, capsys.readouterr().err[-3000:]


def _weights(root: Path):
  with np.load(root / "release" / "final_model.npz") as f:
    return [f[k] for k in f.files]


@pytest.mark.slow  # two trainings (about 1 min each, 6 under a loaded machine)
def test_two_unix_socket_workers_give_the_in_process_model(tmp_path, capsys, monkeypatch):
  from fedmf.tff import sandbox  # pylint: disable=import-outside-toplevel

  if sandbox.namespace_unavailable_reason():
    pytest.skip(sandbox.namespace_unavailable_reason())
  monkeypatch.setenv("FEDMF_CACHE_DIR", str(tmp_path / "cache"))
  _train(tmp_path / "in-process", [], capsys)
  a, b = f"unix:{tmp_path}/w/a.sock", f"unix:{tmp_path}/w/b.sock"
  with running_worker("--listen", a) as (pa, _), running_worker("--listen", b) as (pb, _):
    _train(tmp_path / "unix", [f"workers=['{a}', '{b}']"], capsys)
    assert pa.poll() is None and pb.poll() is None
  for x, y in zip(_weights(tmp_path / "in-process"), _weights(tmp_path / "unix"), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not os.path.exists(a[5:])
