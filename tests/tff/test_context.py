"""The owned execution context runs computations and leaves no worker_binary."""

import os
import subprocess
import sys
import textwrap

import numpy as np


def _worker_pids() -> set[int]:
  out = subprocess.run(
    ['pgrep', '-f', 'tensorflow_federated/data/worker_binary|fedmf/tff/netns_bridge.py'],
    capture_output=True,
    text=True,
    check=False,
  ).stdout
  return {int(p) for p in out.split()}


def _children_of(pid: int) -> set[int]:
  out = subprocess.run(
    ['pgrep', '-P', str(pid)], capture_output=True, text=True, check=False
  ).stdout
  return {int(p) for p in out.split()}


def test_context_runs_and_owns_worker(tff_context):
  import tensorflow_federated as tff  # pylint: disable=import-outside-toplevel

  @tff.tensorflow.computation(np.int32)
  def add_one(x):
    return x + 1

  assert add_one(3) == 4
  assert tff_context.worker_pid in _children_of(os.getpid())


_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import tensorflow_federated as tff
    from fedmf.tff import context
    with context.local_execution_context() as ctx:
      @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
      def total(x):
        return tff.federated_sum(x)
      assert float(total([1.0, 2.0])) == 3.0
      print('WORKER', ctx.worker_pid, flush=True)
    assert ctx.worker_pid is None
    # ensure_context(): the CLI path, cleaned up by the atexit hook.
    ctx2 = context.ensure_context()
    assert float(total([1.0, 2.0, 4.0])) == 7.0
    print('WORKER', ctx2.worker_pid, flush=True)
    """)


def test_no_worker_binary_left_behind():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  # stdout is a pipe: this also checks that the worker does not hold it open
  # (communicate() would block until the worker died otherwise).
  proc = subprocess.run(
    [sys.executable, '-c', _CHILD],
    capture_output=True,
    text=True,
    timeout=240,
    env=env,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  started = {int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith('WORKER')}
  assert len(started) == 2
  # Compare pids, not counts: other processes may run TFF concurrently.
  after = _worker_pids()
  assert not started & after, f'orphaned worker_binary: {started & after}'
