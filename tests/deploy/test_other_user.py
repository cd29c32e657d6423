"""Acceptance of issue 35: as an unprivileged local user, no TCP port and no Unix socket reaches a
`fedmf worker` started by another user with fedmf's defaults.

A real second user is made for the test (`useradd`, removed afterwards, also on failure). Root
starts workers the ways fedmf allows: on a Unix socket, and on loopback TCP with mutual TLS (plain
TCP is refused, tested too). Every socket the workers' process trees listen on (`ss`), their
`worker_binary` bridges included, is then tried by the second user with a standard-library
script (the checkout's virtualenv lives under /root, which the user cannot read): a Unix socket
must refuse to connect, a TCP port must neither answer plaintext HTTP/2 nor complete a TLS
handshake without a client certificate. The same script run by the owner reaches the Unix
socket, so the probe can tell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests import netns
from tests.deploy.workers_helpers import make_certs, running_worker, tls_args, worker_command

_PROBE = textwrap.dedent(r"""
  import json, socket, ssl, sys
  targets = json.loads(sys.argv[1])
  preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
  out = []
  def http2_answer(sock):
    sock.settimeout(5)
    sock.sendall(preface)
    data = b""
    try:
      while len(data) < 9:
        chunk = sock.recv(64)
        if not chunk:
          break
        data += chunk
    except OSError:
      pass
    return len(data) >= 9 and data[3] == 4  # a SETTINGS frame: a gRPC server talks to us
  for kind, where in targets:
    result = {"kind": kind, "where": where}
    try:
      if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(where if not where.startswith("@") else "\0" + where[1:])
        result["connected"] = True
        result["http2"] = http2_answer(s)
        s.close()
      else:
        host, port = where.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=5)
        result["connected"] = True
        result["http2"] = http2_answer(s)
        s.close()
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        try:
          with socket.create_connection((host, int(port)), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
              result["tls_http2"] = http2_answer(tls)
        except (OSError, ssl.SSLError) as e:
          result["tls_error"] = type(e).__name__
    except OSError as e:
      result["connected"] = False
      result["errno"] = e.errno
    out.append(result)
  print(json.dumps(out))
""")


def _listening(pids: set[int]) -> list[tuple[str, str]]:
  """(kind, address) of every socket the processes listen on: TCP in this network namespace, Unix
  sockets in every namespace they run in (a pathname socket is reachable from any namespace)."""
  found = []
  namespaces = {os.readlink(f"/proc/{p}/ns/net"): p for p in pids if os.path.exists(f"/proc/{p}")}
  for flag, kind, pid in [("-Hltnp", "tcp", None)] + [
    ("-Hxlp", "unix", p) for p in namespaces.values()
  ]:
    enter = [] if pid is None else ["nsenter", "-t", str(pid), "-n"]
    out = subprocess.run([*enter, "ss", flag], capture_output=True, text=True).stdout
    for line in out.splitlines():
      if not any(f"pid={p}," in line for p in pids):
        continue
      local = line.split()[4 if kind == "unix" else 3]
      if kind == "tcp":
        host, port = local.rsplit(":", 1)
        host = host.strip("[]").removeprefix("::ffff:")
        local = f"{'127.0.0.1' if host in ('*', '0.0.0.0', '::') else host}:{port}"
      if (kind, local) not in found:
        found.append((kind, local))
  return found


@pytest.fixture
def second_user():
  if os.geteuid() != 0:
    pytest.skip("needs root to add a second user (the refusals are tested in test_worker_cli.py)")
  if not shutil.which("useradd"):
    pytest.skip("needs useradd")
  name = f"scaleout{os.getpid() % 100000}"
  subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", name], check=True)
  try:
    uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)
    yield name, uid
  finally:
    subprocess.run(["userdel", name], capture_output=True)
  assert subprocess.run(["id", name], capture_output=True).returncode != 0


def _probe_as(user, targets, workdir: Path) -> list[dict]:
  script = workdir / "probe.py"
  argv = ["/usr/bin/python3", "-S", str(script), json.dumps(targets)]
  if user is not None:
    argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
  proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout)


def test_no_socket_of_a_worker_reaches_another_local_user(second_user, tmp_path):
  if not os.path.exists("/usr/bin/python3"):
    pytest.skip("needs the system python3 for the second user's probe")
  name, uid = second_user
  public = Path(tempfile.mkdtemp(prefix="fedmf-scaleout-probe-"))
  try:
    public.chmod(0o755)
    (public / "probe.py").write_text(_PROBE)
    (public / "probe.py").chmod(0o644)
    # Plain TCP with the defaults is refused before anything listens.
    refused = subprocess.run(worker_command(), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "plaintext would let every local user" in refused.stderr
    certs = make_certs(tmp_path / "certs")
    unix = f"unix:{tmp_path}/sock/worker.sock"
    with (
      running_worker("--listen", unix) as (a, _),
      running_worker("--listen", "127.0.0.1:0", *tls_args(certs)) as (b, _),
    ):
      pids = {a.pid, b.pid} | netns.descendants(a.pid) | netns.descendants(b.pid)
      targets = _listening(pids)
      kinds = [k for k, _ in targets]
      # The front's socket and each worker_binary's bridge socket; one TLS port.
      assert kinds.count("unix") >= 3 and kinds.count("tcp") == 1, targets
      seen = _probe_as(uid, targets, public)
      owner = _probe_as(None, [t for t in targets if t[1] == unix[5:]], public)
    assert owner[0]["connected"] and owner[0]["http2"]  # the probe does reach a worker
    for result in seen:
      if result["kind"] == "unix":
        assert not result["connected"] and result["errno"] == 13, result  # EACCES
      else:
        assert result["connected"] and not result["http2"], result  # no plaintext gRPC
        # TLS 1.3: the client's side of the handshake completes, then the server, missing the
        # client certificate, sends an alert instead of any HTTP/2 frame.
        assert not result.get("tls_http2"), result
  finally:
    shutil.rmtree(public, ignore_errors=True)
  assert sys.executable  # (the test ran under fedmf's interpreter; the probe did not)
