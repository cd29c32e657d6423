"""`fedmf worker`: refusals before anything starts (one line, exit 2), the ready line, Unix sockets,
client identities, certificate rotation, and clean stops (issue 35)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests import netns
from tests.deploy.workers_helpers import (
  credentials,
  executor_call,
  make_certs,
  running_worker,
  sign_client,
  tls_args,
  worker_command,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  return make_certs(tmp_path_factory.mktemp("certs"))


def _refused(*args: str, timeout: float = 60) -> str:
  """Runs `fedmf worker ARGS`, expecting a refusal: exit 2 and one line; returns that line."""
  proc = subprocess.run(worker_command(*args), capture_output=True, text=True, timeout=timeout)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-3000:])
  return lines[0]


@pytest.mark.parametrize(
  "args, message",
  [
    (["--listen", "0.0.0.0:8470"], "plaintext would let every host that reaches it run code"),
    (["--listen", "nohost"], "--listen must be 'host:port' or 'unix:PATH'"),
    (["--listen", "1.2.3.4:8470", "--tls-cert", "C"], "missing --tls-key, --tls-client-ca"),
    (
      [
        "--listen",
        "1.2.3.4:8470",
        "--tls-cert",
        "/nope.pem",
        "--tls-key",
        "K",
        "--tls-client-ca",
        "A",
      ],
      "--tls-cert: cannot read /nope.pem",
    ),  # fmt: skip
    (["--listen", "unix:relative.sock"], "give unix:/ABSOLUTE/PATH"),
  ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
  assert message in _refused(*args)


@pytest.mark.parametrize("listen", [None, "127.0.0.1:8470", "[::1]:0", "localhost:0"])
def test_plaintext_tcp_is_refused_even_on_loopback(listen):
  """Loopback reaches every local user: the refusal names the exposure and both ways out."""
  line = _refused(*([] if listen is None else ["--listen", listen]))
  assert "plaintext would let every local user run code" in line
  assert "--tls-cert, --tls-key and --tls-client-ca" in line and "--listen unix:PATH" in line


def test_a_key_that_is_no_pem_is_refused(certs, tmp_path):
  bad = tmp_path / "key.pem"
  bad.write_text("not a key")
  bad.chmod(0o600)
  args = ["--listen", "0.0.0.0:0", "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(bad)]
  assert "is not a PEM file" in _refused(*args, "--tls-client-ca", str(certs / "ca.pem"))


def test_a_key_readable_by_every_user_is_refused(certs, tmp_path):
  key = tmp_path / "worker.key"
  key.write_bytes((certs / "worker.key").read_bytes())
  key.chmod(0o644)
  args = ["--listen", "127.0.0.1:0", "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(key)]
  line = _refused(*args, "--tls-client-ca", str(certs / "ca.pem"))
  assert "readable by every user (mode 0644)" in line and f"chmod 600 {key}" in line


def test_a_key_of_another_certificate_is_refused_at_once(certs):
  """gRPC said "Failed to bind to address 0.0.0.0:0" after about 8 s; fedmf names both files
  before starting anything (no worker_binary is started: well under a second of work)."""
  args = ["--listen", "127.0.0.1:0", "--tls-cert", str(certs / "worker.pem")]
  args += ["--tls-key", str(certs / "coordinator.key"), "--tls-client-ca", str(certs / "ca.pem")]
  line = _refused(*args)
  assert "--tls-key does not belong to --tls-cert: their public keys differ" in line


def test_tls_flags_on_a_unix_socket_are_refused(certs, tmp_path):
  line = _refused("--listen", f"unix:{tmp_path}/w.sock", *tls_args(certs))
  assert "is a Unix socket, served without TLS" in line


def test_a_port_in_use_is_one_line(certs):
  """Issue 38 item 16: gRPC's own errors (absl log lines) used to come first."""
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    line = _refused("--listen", f"127.0.0.1:{port}", *tls_args(certs))
  assert line == f"fedmf worker: error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_unix_socket_serves_its_owner_only(tmp_path):
  directory = tmp_path / "private"  # made 0700 by the worker
  path = directory / "w.sock"
  with running_worker("--listen", f"unix:{path}") as (proc, served):
    assert served == f"unix:{path}"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    code, details = executor_call(served)
    assert code.name == "NOT_FOUND", details  # The request reached TFF's executor.
    # The health service answers on the same socket.
    from fedmf.tff import front  # pylint: disable=import-outside-toplevel

    assert front.check_health(served)
  assert not path.exists()  # Removed on stop.


def test_a_unix_socket_in_a_shared_directory_is_refused(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o755)
  line = _refused("--listen", f"unix:{shared}/w.sock")
  assert "is not private to this user (mode 0755" in line


def test_the_coordinator_is_allowed_and_other_identities_are_refused_and_logged(certs):
  """A certificate from the right CA but another CN, or without the clientAuth usage (what
  mallory-laptop had in issue 35), never reaches TFF's executor; the worker logs who tried."""
  import grpc  # pylint: disable=import-outside-toplevel

  other_cn = sign_client(certs, "mallory", "/CN=mallory-laptop", "extendedKeyUsage=clientAuth")
  no_usage = sign_client(certs, "nousage", "/CN=fedmf-coordinator", "basicConstraints=CA:FALSE")
  server_only = sign_client(
    certs,
    "serveronly",
    "/CN=x",
    "subjectAltName=DNS:fedmf-coordinator\nextendedKeyUsage=serverAuth",
  )
  assert other_cn and no_usage and server_only
  with running_worker("--listen", "127.0.0.1:0", *tls_args(certs)) as (proc, served):
    target = served.replace("127.0.0.1", "localhost")
    assert executor_call(target, credentials(certs))[0] == grpc.StatusCode.NOT_FOUND
    for name in ("mallory", "nousage"):
      code, details = executor_call(target, credentials(certs, name))
      assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
    # A certificate restricted to other usages is refused by the TLS handshake itself (BoringSSL
    # checks a present extended key usage): it never reaches fedmf's gate, so it is not logged.
    assert executor_call(target, credentials(certs, "serveronly"))[0] == grpc.StatusCode.UNAVAILABLE
    assert executor_call(target)[0] == grpc.StatusCode.UNAVAILABLE  # plaintext: no handshake
  err = proc.stderr.read()
  refusals = [line for line in err.splitlines() if "refused client" in line]
  assert len(refusals) == 2, err[-3000:]
  assert "CN='mallory-laptop'" in refusals[0] and "not on the allow-list" in refusals[0]
  assert "CN='fedmf-coordinator'" in refusals[1] and "lacks the clientAuth" in refusals[1]


def test_allow_list_by_flag_file_and_fingerprint(certs, tmp_path):
  import grpc  # pylint: disable=import-outside-toplevel

  from fedmf.tff import certificates  # pylint: disable=import-outside-toplevel

  sign_client(certs, "alice", "/CN=alice", "extendedKeyUsage=clientAuth")
  sign_client(
    certs, "bob", "/CN=bob", "subjectAltName=DNS:bob.example\nextendedKeyUsage=clientAuth"
  )
  bob_print = certificates.identity_of((certs / "bob.pem").read_bytes()).fingerprint
  listed = tmp_path / "clients.txt"
  listed.write_text(f"# who may train here\nsha256:{bob_print}  # bob's laptop, pinned\n")
  args = ["--listen", "127.0.0.1:0", *tls_args(certs), "--allow-client", "alice"]
  with running_worker(*args, "--allow-clients-file", str(listed)) as (proc, served):
    target = served.replace("127.0.0.1", "localhost")
    assert executor_call(target, credentials(certs, "alice"))[0] == grpc.StatusCode.NOT_FOUND
    assert executor_call(target, credentials(certs, "bob"))[0] == grpc.StatusCode.NOT_FOUND
    # The default name is no longer allowed once a list is given.
    assert executor_call(target, credentials(certs))[0] == grpc.StatusCode.PERMISSION_DENIED
  empty = tmp_path / "empty.txt"
  empty.write_text("# nobody\n")
  assert "lists no client" in _refused("--listen", "127.0.0.1:0", *tls_args(certs),
                                       "--allow-clients-file", str(empty))  # fmt: skip


def test_rotated_files_are_used_for_new_connections_and_a_running_call_goes_on(tmp_path):
  """make-certs.sh into the same directory signs new certificates with the kept CA key; the
  worker reloads them (on change, and on SIGHUP), and a call in flight is not dropped."""
  import threading  # pylint: disable=import-outside-toplevel

  import grpc  # pylint: disable=import-outside-toplevel
  import tensorflow_federated as tff  # pylint: disable=import-outside-toplevel

  from fedmf.tff import channels, context  # pylint: disable=import-outside-toplevel
  from tests.deploy.workers_helpers import sleepy_computation  # pylint: disable=import-outside-toplevel

  certs = make_certs(tmp_path / "certs")
  assert stat.S_IMODE((certs / "ca.key").stat().st_mode) == 0o600
  old_ca, old_coordinator = (certs / "ca.pem").read_bytes(), credentials(certs)
  with running_worker("--listen", "127.0.0.1:0", *tls_args(certs)) as (proc, served):
    target = served.replace("127.0.0.1", "localhost")
    channel = channels.open_channel(target, old_coordinator)
    service = _Source(channel)
    ctx = tff.framework.SyncExecutionContext(**context.context_kwargs(service))
    sleepy = sleepy_computation()
    result = {}
    call = threading.Thread(target=lambda: result.update(v=ctx.invoke(sleepy, 8_000_000)))
    call.start()
    time.sleep(2)
    make_certs(certs)  # A rotation: new keys, same CA.
    assert (certs / "ca.pem").read_bytes() == old_ca
    assert netns.wait_until(lambda: _said(proc, "reloaded TLS files"), 10)
    proc.send_signal(signal.SIGHUP)
    assert netns.wait_until(lambda: _said(proc, "reloaded TLS files"), 10)
    call.join(60)
    assert result.get("v") == 1  # The running call finished on its old connection.
    context.close_executors(ctx)
    channel.close()
    # New connections: the new coordinator certificate works (it was made after start).
    assert executor_call(target, credentials(certs))[0] == grpc.StatusCode.NOT_FOUND
    # A broken rotation (a key of another certificate) is reported and the files in use kept.
    (certs / "worker.key").write_bytes((certs / "coordinator.key").read_bytes())
    assert netns.wait_until(lambda: _said(proc, "kept the previous TLS files"), 10)
    assert executor_call(target, credentials(certs))[0] == grpc.StatusCode.NOT_FOUND
  assert proc.returncode == 143


class _Source:
  def __init__(self, channel):
    import tensorflow_federated as tff  # pylint: disable=import-outside-toplevel

    self.stub = tff.framework.RemoteExecutorGrpcStub(channel)

  def get_stub(self):
    return self.stub


def _said(proc: subprocess.Popen, text: str) -> bool:
  """True once `proc` wrote a new stderr line containing `text` (lines are read, so each counts
  once)."""
  import select  # pylint: disable=import-outside-toplevel

  while select.select([proc.stderr], [], [], 0.1)[0]:
    line = proc.stderr.readline()
    if not line:
      break
    if text in line:
      return True
  return False


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_ready_line_then_a_signal_stops_every_child(certs, stop, code):
  with running_worker("--listen", "127.0.0.1:0", *tls_args(certs)) as (proc, served):
    assert served.startswith("127.0.0.1:")
    children = netns.descendants(proc.pid)
    assert len(children) >= 2  # The namespace bridge and TFF's worker_binary.
    proc.send_signal(stop)
    assert proc.wait(timeout=30) == code
    assert netns.wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in children), 10)


def test_sigterm_to_the_process_group_says_terminated(tmp_path):
  """`kill -TERM -PGID` (a terminal's or a container runtime's stop) reaches worker_binary too;
  the worker used to report "worker_binary exited" when that child went first."""
  with running_worker("--listen", f"unix:{tmp_path}/s/w.sock", start_new_session=True) as (
    proc,
    _,
  ):
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    err = proc.stderr.read()
  assert "fedmf worker: terminated; stopped" in err and "worker_binary exited" not in err


def test_a_worker_killed_with_sigkill_leaves_no_directory_after_the_next_start(tmp_path):
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  env = {"TMPDIR": str(tmp)}
  with running_worker("--listen", f"unix:{tmp_path}/a/w.sock", env=env) as (proc, _):
    left = [p for p in tmp.iterdir() if p.name.startswith("fedmf-worker-")]
    assert len(left) == 1
    children = netns.descendants(proc.pid)
    proc.kill()
    proc.wait()
  assert left[0].exists()  # SIGKILL: nothing could clean up ...
  assert netns.wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in children), 10)
  with running_worker("--listen", f"unix:{tmp_path}/a/w.sock", env=env):  # ... the next start does
    assert not left[0].exists()  # (and replaces the killed worker's stale socket).
    assert len([p for p in tmp.iterdir() if p.name.startswith("fedmf-worker-")]) == 1


def test_health_service_alone_on_its_own_port(certs):
  """For Kubernetes' gRPC probes (no TLS): health answers, the executor is not there."""
  import grpc  # pylint: disable=import-outside-toplevel

  from fedmf.tff import front  # pylint: disable=import-outside-toplevel

  args = ["--listen", "127.0.0.1:0", *tls_args(certs), "--health-listen", "127.0.0.1:0"]
  with running_worker(*args) as (proc, served):
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    ports = {
      line.split()[3].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={proc.pid}," in line
    }
    assert len(ports) == 2 and served.rsplit(":", 1)[1] in ports
    (out_port,) = ports - {served.rsplit(":", 1)[1]}
    assert front.check_health(f"127.0.0.1:{out_port}")
    code, _ = executor_call(f"127.0.0.1:{out_port}")
    assert code == grpc.StatusCode.UNIMPLEMENTED
