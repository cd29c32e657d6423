"""The network front of a `fedmf worker`: TFF's executor service over mutual TLS or a Unix socket.

One concept: exposing one isolated `worker_binary` (`fedmf.tff.sandbox`) to coordinators, safely.
`worker_binary` cannot bind an address of our choice nor speak TLS, so it stays in its own network
namespace and this front, a gRPC server fedmf owns, listens on `HOST:PORT` (mutual TLS only) or on
`unix:PATH` (mode 0600 in a 0700 directory). It accepts only TFF's `ExecutorGroup` methods (all
unary), forwarding each request's bytes unchanged to the worker over its Unix socket, and the
standard gRPC health service (`grpc.health.v1.Health`: SERVING while its worker_binary answers).

On TCP, gRPC's TLS authenticates the client (`require_client_auth`: a certificate signed by the
client CA, else no handshake), and each executor call is then checked against the allow-list
(`fedmf.tff.client_identity`): a refused client gets PERMISSION_DENIED before any byte reaches the
worker, and the worker writes one line naming the certificate's identity (an audit log of who
tried). The TLS files are re-read when they change or on `reload()` (SIGHUP): new handshakes use
the new files, established connections (a running chunk) go on (`ReloadingTLS`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import stat
import sys
import threading
import time
from typing import Callable, Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fedmf.errors import FedmfUserError
from fedmf.tff import certificates, channels
from fedmf.tff.client_identity import AllowList

logger = logging.getLogger("fedmf.front")

SERVICE = "tensorflow_federated.v0.ExecutorGroup"
METHODS = (
  "GetExecutor",
  "CreateValue",
  "CreateCall",
  "CreateStruct",
  "CreateSelection",
  "Compute",
  "Dispose",
  "DisposeExecutor",
)
_REFUSAL_LOG_EVERY_S = 60.0
# How long a health check waits for the worker_binary to accept a connection (the coordinator's
# check waits 5 s for the answer: `check_health`).
_UPSTREAM_PROBE_S = 2.0


def _say(line: str) -> None:
  """One line on the worker's output (stderr): what an operator's log collector keeps."""
  print(f"fedmf worker: {line}", file=sys.stderr, flush=True)


class ClientGate:
  """Decides, per executor call, whether the caller's certificate may run code here.

  Identities are parsed once per certificate; a refusal is written once a minute per certificate
  (with the number of calls refused since), so a client retrying in a loop cannot flood the log.
  """

  def __init__(self, allow: AllowList, say: Callable[[str], None] = _say):
    self.allow = allow
    self._say = say
    self._lock = threading.Lock()
    self._decisions: dict[bytes, tuple[Optional[str], str]] = {}
    self._last_said: dict[bytes, tuple[float, int]] = {}

  def refusal(self, context: grpc.ServicerContext) -> Optional[str]:
    """None to serve the call; else the reason (already logged)."""
    auth = context.auth_context()
    pems = auth.get("x509_pem_cert") or []
    if not pems:
      return "no client certificate"  # Cannot happen with require_client_auth; refuse anyway.
    pem = pems[0]
    with self._lock:
      decision = self._decisions.get(pem)
    if decision is None:
      try:
        identity = certificates.identity_of(pem)
        decision = (self.allow.refusal(identity), identity.describe())
      except ValueError as e:
        decision = (f"unreadable certificate ({e})", "(unparsable certificate)")
      with self._lock:
        if len(self._decisions) > 1024:
          self._decisions.clear()
        self._decisions[pem] = decision
    reason, who = decision
    if reason is not None:
      now = time.monotonic()
      with self._lock:
        last, count = self._last_said.get(pem, (-1e18, 0))
        count += 1
        due = now - last >= _REFUSAL_LOG_EVERY_S
        self._last_said[pem] = (now, 0) if due else (last, count)
      if due:
        self._say(
          f"refused client {who} from {context.peer()}: {reason}"
          + (f" ({count} calls refused)" if count > 1 else "")
        )
    return reason


class _Forwarder(grpc.GenericRpcHandler):
  """Forwards TFF's executor methods, bytes in and bytes out, to the worker's channel."""

  def __init__(self, upstream: grpc.Channel, gate: Optional[ClientGate]):
    self._calls = {
      f"/{SERVICE}/{m}": upstream.unary_unary(f"/{SERVICE}/{m}") for m in METHODS
    }  # No (de)serializers: the request and response bytes pass through untouched.
    self._gate = gate

  def service(self, handler_call_details):
    call = self._calls.get(handler_call_details.method)
    if call is None:
      return None  # UNIMPLEMENTED: nothing but TFF's executor service is offered.

    def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
      if self._gate is not None:
        reason = self._gate.refusal(context)
        if reason is not None:
          context.abort(grpc.StatusCode.PERMISSION_DENIED, f"client refused: {reason}")
      remaining = context.time_remaining()
      # gRPC reports "no deadline" as None or as a huge value, depending on the version.
      timeout = remaining if remaining is not None and 0 < remaining < 1e7 else None
      try:
        return call(request, timeout=timeout)
      except grpc.RpcError as e:
        context.abort(e.code(), e.details() or "worker error")

    return grpc.unary_unary_rpc_method_handler(forward)


class ReloadingTLS:
  """The front's certificate, key and client CA, re-read when a file changes or on `reload()`.

  gRPC calls `fetch` at each new handshake (`grpc.dynamic_ssl_server_credentials`); it returns the
  newly loaded files once, else None (keep). Files are checked before use
  (`certificates.check_server_files`); a bad set is reported and the previous one kept, so a
  half-finished rotation never stops a worker. `poll` (called every second by `fedmf worker`)
  loads and reports changes at once rather than at the next connection.
  """

  def __init__(self, cert: str, key: str, client_ca: str, say: Callable[[str], None] = _say):
    self.paths = (cert, key, client_ca)
    self._say = say
    self._lock = threading.Lock()
    self._forced = False
    self._pending = None
    self._signature = self._stat()
    self.initial = self._load()  # Raises WorkerTLSError: bad files at start are refused.

  def _stat(self):
    out = []
    for path in self.paths:
      try:
        st = os.stat(path)  # Follows symlinks: Kubernetes swaps a secret's `..data` link.
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
      except OSError:
        out.append(None)
    return tuple(out)

  def _load(self):
    cert_path, key_path, ca_path = self.paths
    cert = certificates.read_pem(cert_path, "--tls-cert")
    key = certificates.read_key(key_path, "--tls-key")
    ca = certificates.read_pem(ca_path, "--tls-client-ca")
    certificates.check_server_files(cert, key, ca, ("--tls-cert", "--tls-key", "--tls-client-ca"))
    self.identity = certificates.identity_of(cert)
    return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

  def reload(self) -> None:
    """Re-read the files at the next `poll` (SIGHUP), changed or not."""
    self._forced = True

  def poll(self) -> None:
    signature = self._stat()
    if not self._forced and signature == self._signature:
      return
    self._forced = False
    self._signature = signature
    try:
      config = self._load()
    except FedmfUserError as e:
      self._say(f"kept the previous TLS files: {e}")
      return
    with self._lock:
      self._pending = config
    self._say(f"reloaded TLS files; serving as {self.identity.describe()}")

  def fetch(self):
    with self._lock:
      config, self._pending = self._pending, None
    return config

  def credentials(self):
    return grpc.dynamic_ssl_server_credentials(
      self.initial, self.fetch, require_client_authentication=True
    )


class _UpstreamHealth(health.HealthServicer):
  """The standard health service: SERVING when the worker_binary answers a new connection now.

  Asked at each `Check` on a channel of its own, not tracked from the forwarding channel's
  connectivity callbacks: those were seen to stop at CONNECTING while that channel carried calls
  (gRPC Python 1.74), which left a healthy worker NOT_SERVING for good, so a coordinator that had
  dropped it never took it back (tests/deploy/test_worker_liveness.py failed 1 run in ~15).
  A `Watch` stream sees the status of the latest `Check`.
  """

  def __init__(self, upstream_target: str, probe_s: float = _UPSTREAM_PROBE_S):
    super().__init__()
    self._upstream_target = upstream_target
    self._probe_s = probe_s
    self._set(health_pb2.HealthCheckResponse.SERVING)  # Started after its worker_binary was ready.

  def _set(self, status) -> None:
    for service in ("", SERVICE):
      self.set(service, status)

  def _refresh(self) -> None:
    channel = channels.open_channel(self._upstream_target, options=channels.LOCAL_OPTIONS)
    try:
      grpc.channel_ready_future(channel).result(timeout=self._probe_s)
      status = health_pb2.HealthCheckResponse.SERVING
    except grpc.FutureTimeoutError:
      status = health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
      channel.close()
    self._set(status)

  def Check(self, request, context):  # gRPC names it so.
    self._refresh()
    return super().Check(request, context)


def _prepare_unix_socket(path: str) -> None:
  """A socket path in a private directory: made 0700 if missing, refused if others may enter;
  a stale socket of a killed worker is removed, a live one refused ("in use")."""
  import socket  # pylint: disable=g-import-not-at-top

  directory = os.path.dirname(path) or "."
  if not os.path.isdir(directory):
    os.makedirs(directory, mode=0o700)
  st = os.stat(directory)
  if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
    raise FedmfUserError(
      f"--listen unix:{path}: its directory {directory} is not private to this user (mode "
      f"{stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}); use a directory of mode 0700 "
      "owned by the worker's user (fedmf makes a missing one so)"
    )
  if os.path.lexists(path):
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
      raise FedmfUserError(f"--listen unix:{path}: the path exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
      try:
        probe.connect(path)
      except OSError:
        os.unlink(path)  # Nobody listens: a socket left by a killed worker.
      else:
        raise FedmfUserError(f"--listen unix:{path}: in use by another process")


def check_tcp_port_free(host: str, port: int) -> None:
  """Refuses (one line) a TCP port that is taken, before gRPC logs its own errors about it."""
  import socket  # pylint: disable=g-import-not-at-top

  if port == 0:
    return
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  with socket.socket(family, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As gRPC binds.
    try:
      s.bind((host, port))
    except OSError as e:
      raise FedmfUserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(
  listen: str,
  upstream_target: str,
  *,
  tls: Optional[ReloadingTLS] = None,
  allow: Optional[AllowList] = None,
  max_threads: int = 32,
) -> tuple[grpc.Server, str, health.HealthServicer]:
  """Starts the front on `listen` (`host:port`, with `tls`; or `unix:PATH`, without).

  Returns the server, the address it serves on (the bound port filled in) and its health
  servicer. With `tls`, only clients with a certificate signed by its client CA connect, and
  only those `allow` names run executor calls.
  """
  target = channels.parse_target(listen, "--listen", allow_port_zero=True)
  is_unix = isinstance(target, channels.UnixSocket)
  if is_unix == (tls is not None):
    raise FedmfUserError(f"--listen {listen}: TCP needs mutual TLS, a Unix socket takes no TLS")
  upstream = channels.open_channel(upstream_target, options=channels.LOCAL_OPTIONS)
  gate = ClientGate(allow or AllowList.load()) if tls is not None else None
  servicer = _UpstreamHealth(upstream_target)
  server = grpc.server(
    concurrent.futures.ThreadPoolExecutor(max_workers=max_threads),
    handlers=[_Forwarder(upstream, gate)],
    options=list(channels.SERVER_OPTIONS),
  )
  health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
  if is_unix:
    _prepare_unix_socket(target.path)
    old = os.umask(0o177)  # The socket is created 0600 (gRPC binds it inside add_*_port).
    try:
      ok = server.add_insecure_port(str(target))
    finally:
      os.umask(old)
    if ok:
      os.chmod(target.path, 0o600)
    bound = str(target)
  else:
    check_tcp_port_free(target.host, target.port)
    ok = port = server.add_secure_port(str(target), tls.credentials())
    bound = str(channels.Address(target.host, port))
  if not ok:
    raise FedmfUserError(f"cannot listen on {listen}")
  server.start()
  return server, bound, servicer


def serve_health(listen: str, servicer: health.HealthServicer) -> tuple[grpc.Server, str]:
  """A plaintext server offering only the health service (Kubernetes' gRPC probes speak no TLS):
  it tells whether the worker serves, and runs nothing."""
  target = channels.parse_address(listen, "--health-listen", allow_port_zero=True)
  check_tcp_port_free(target.host, target.port)
  server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
  health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
  port = server.add_insecure_port(str(target))
  if not port:
    raise FedmfUserError(f"cannot listen on {listen}")
  server.start()
  return server, str(channels.Address(target.host, port))


def check_health(target: str, credentials=None, timeout_s: float = 5.0) -> bool:
  """True when the `fedmf worker` at `target` answers the health service with SERVING."""
  channel = channels.open_channel(target, credentials)
  try:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout_s)
    return reply.status == health_pb2.HealthCheckResponse.SERVING
  except grpc.RpcError:
    return False
  finally:
    with contextlib.suppress(Exception):
      channel.close()
