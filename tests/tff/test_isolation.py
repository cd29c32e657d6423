"""No fedmf run opens a network port: local TFF workers live in network namespaces of their own.

TFF's worker_binary listens on every interface without authentication; fedmf starts it in a
namespace holding only loopback and reaches it through a 0600 Unix socket (fedmf.tff.sandbox).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedmf.tff import sandbox
from tests import netns


def _listening_pids_host_namespace() -> dict[int, list[str]]:
  """pid -> local addresses of its listening TCP/UDP sockets, in this network namespace."""
  out = subprocess.run(["ss", "-HltunpA", "inet"], capture_output=True, text=True).stdout
  found: dict[int, list[str]] = {}
  for line in out.splitlines():
    parts = line.split()
    for token in line.split("pid=")[1:]:
      pid = int(token.split(",")[0])
      found.setdefault(pid, []).append(parts[4])
  return found


def _interfaces(pid: int) -> list[str]:
  lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
  return sorted(line.split(":")[0].strip() for line in lines)


def _same_netns(pid: int) -> bool:
  return os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_simulation_listens_on_no_network_address(tmp_path, workers):
  if sandbox.namespace_unavailable_reason():
    pytest.skip(sandbox.namespace_unavailable_reason())
  args = [
    sys.executable,
    "-m",
    "fedmf.cli.main",
    "simulate",
    "--out",
    str(tmp_path / "run"),
    "--no-progress",
  ]
  for item in [
    "num_clients=40",
    "vocab_size=30",
    "clients_per_round=4",
    "clients_per_call=2",
    "max_sentences_per_client=8",
    "test_sentences=32",
    "rounds=12",  # Every round's chunks start, train and end under the watch below.
    "eval_every=6",
    "participation.min_sep=2",
    "noise_multiplier=1.0",
    f"workers={workers}",
  ]:
    args += ["--set", item]
  env = dict(os.environ, FEDMF_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  seen_workers: set[int] = set()
  try:
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
      tree = netns.descendants(proc.pid) | {proc.pid}
      listening = _listening_pids_host_namespace()
      for pid in tree:
        assert pid not in listening, f"pid {pid} listens on {listening[pid]}"
        try:
          program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
          if program.endswith(b"/worker_binary"):
            # Its own namespace, with nothing but loopback: unreachable from any network.
            assert not _same_netns(pid)
            assert _interfaces(pid) == ["lo"]
            seen_workers.add(pid)
        except (FileNotFoundError, ProcessLookupError):
          continue
      time.sleep(0.2)
  finally:
    if proc.poll() is None:
      proc.kill()
    err = proc.communicate()[1].decode()
  assert proc.returncode == 0, err[-2000:]
  assert len(seen_workers) == max(workers, 1)


def test_the_worker_socket_is_owner_only(tmp_path):
  if sandbox.namespace_unavailable_reason():
    pytest.skip(sandbox.namespace_unavailable_reason())
  from fedmf.tff import context  # pylint: disable=import-outside-toplevel

  worker = sandbox.IsolatedWorker(context.worker_binary_path(), [])
  try:
    path = worker.address.removeprefix("unix:")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert not worker.exposed
  finally:
    worker.close()
  assert not os.path.exists(os.path.dirname(path))


_UNPRIVILEGED = textwrap.dedent("""
    import sys
    from fedmf.tff import sandbox, context
    reason = sandbox.namespace_unavailable_reason()
    print('REASON', reason)
    if reason is None:
      w = sandbox.IsolatedWorker(context.worker_binary_path(), [])
      print('ADDRESS', w.address, w.exposed)
      w.close()
""")


def test_an_unprivileged_user_gets_a_user_and_network_namespace(tmp_path):
  if os.geteuid() != 0:
    pytest.skip("needs root to switch to an unprivileged user")
  import shutil  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel

  readable = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is root-only
  request_cleanup = lambda: shutil.rmtree(readable, ignore_errors=True)  # noqa: E731
  os.chmod(readable, 0o755)
  script = readable / "probe.py"
  script.write_text(_UNPRIVILEGED)
  os.chmod(script, 0o644)
  root = Path(__file__).resolve().parents[2]
  proc = subprocess.run(
    ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, str(script)],
    capture_output=True,
    text=True,
    timeout=300,
    env=dict(os.environ, PYTHONPATH=str(root), HOME="/tmp"),
  )
  request_cleanup()
  if "REASON" not in proc.stdout:  # e.g. the checkout sits in a directory only root can read
    pytest.skip(f"an unprivileged user cannot run fedmf from this checkout: {proc.stderr[-300:]}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  if "REASON None" not in proc.stdout:
    pytest.skip(
      f"an unprivileged user cannot start a namespaced process here: {proc.stdout.strip()}"
    )
  assert "ADDRESS unix:" in proc.stdout and "False" in proc.stdout


def test_without_namespaces_the_policy_refuses_or_warns(monkeypatch, caplog):
  from fedmf.tff import context  # pylint: disable=import-outside-toplevel

  monkeypatch.setattr(sandbox, "_PROBE", "unshare(network namespace) failed: [Errno 1] EPERM")
  with pytest.raises(sandbox.WorkerIsolationError) as refused:
    sandbox.IsolatedWorker(context.worker_binary_path(), [], policy="namespace")
  message = str(refused.value)
  assert "every network interface" in message and "worker_isolation: none" in message
  assert "\n" not in message
  worker = sandbox.IsolatedWorker(context.worker_binary_path(), [], policy="none")
  try:
    assert worker.exposed and worker.address.startswith("localhost:")
    assert "WITHOUT authentication" in caplog.text
  finally:
    worker.close()
  with pytest.raises(Exception, match="worker_isolation must be one of"):
    sandbox.check_policy("open")
