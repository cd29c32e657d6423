"""Local workers get one intra-op thread per op when a call's clients fill the cores, and the
model does not change with it."""

import subprocess

import numpy as np
import pytest

from fedmf.tff.worker_threads import INTRA_OP, usable_cores, worker_environment


def test_one_thread_per_op_only_when_the_clients_fill_the_cores():
  assert worker_environment(4, environ={}, cores=2) == {INTRA_OP: "1"}
  assert worker_environment(2, environ={}, cores=2) == {INTRA_OP: "1"}
  assert worker_environment(1, environ={}, cores=2) == {}  # one thread would idle a core
  assert worker_environment(8, environ={}, cores=16) == {}
  assert worker_environment(None, environ={}, cores=2) == {}  # unknown: TF's default


def test_the_users_setting_is_left_alone():
  assert worker_environment(20, environ={INTRA_OP: "2"}, cores=2) == {}


def test_usable_cores_is_this_process_affinity():
  import os  # pylint: disable=import-outside-toplevel

  assert usable_cores() == len(os.sched_getaffinity(0)) >= 1


def _environ_of_worker(pid: int) -> dict[str, str]:
  """The environment of the worker_binary `pid` started (itself, or its child behind the bridge)."""
  children = subprocess.run(
    ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
  ).stdout.split()
  for candidate in [pid, *map(int, children)]:
    with open(f"/proc/{candidate}/cmdline", "rb") as f:
      if b"worker_binary" not in f.read().split(b"\0")[0]:
        continue
    with open(f"/proc/{candidate}/environ", "rb") as f:
      pairs = [item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}
  raise AssertionError(f"no worker_binary at or under pid {pid}")


@pytest.fixture(scope="module")
def round_inputs():
  from fedmf.tasks.synthetic import SyntheticTask  # pylint: disable=import-outside-toplevel

  # lstm-paper's shapes (LSTM 670, projection 96) at a small vocabulary: matmuls whose inner
  # dimension is large enough for TF to split them across threads.
  task = SyntheticTask(
    num_clients=2,
    vocab_size=2000,
    preset="lstm-paper",
    sequence_length=20,
    batch_size=16,
    max_sentences=16,
    test_sentences=16,
    seed=5,
  )
  return task, [task.client_dataset(i) for i in range(2)]


def test_the_worker_gets_it_and_the_round_is_the_same(round_inputs, monkeypatch):
  import tensorflow_federated as tff  # pylint: disable=import-outside-toplevel

  from fedmf.tff import context  # pylint: disable=import-outside-toplevel
  from fedmf.tff.rounds import build_client_round  # pylint: disable=import-outside-toplevel

  monkeypatch.delenv(INTRA_OP, raising=False)
  task, datasets = round_inputs
  weights = tff.learning.models.ModelWeights(trainable=task.initial_weights(0), non_trainable=[])
  sums = {}
  for env in ({INTRA_OP: "1"}, {}):
    with context.local_execution_context(worker_env=env) as ctx:
      assert _environ_of_worker(ctx.worker_pid).get(INTRA_OP) == env.get(INTRA_OP)
      client_round, _ = build_client_round(
        task.functional_model(), client_learning_rate=0.5, clip_norm=100.0
      )
      sums[bool(env)] = [np.asarray(a) for a in client_round(weights, datasets)["clipped_sum"]]
  assert np.abs(sums[True][0]).sum() > 0  # the clients trained
  for one_thread, default in zip(sums[True], sums[False]):
    # Measured bit-identical on 2 cores; bounded in case another machine's TF splits sums
    # differently.
    np.testing.assert_allclose(one_thread, default, rtol=1e-5, atol=1e-7)
