"""`fedmf worker`: a TFF executor service for a coordinator, over mutual TLS or a private Unix socket.

It starts TFF's `worker_binary` in a network namespace of its own (nothing reaches it but this
process), and serves TFF's executor methods on --listen through a front that fedmf owns
(`fedmf.tff.front`): on TCP (loopback included) only over mutual TLS, to clients whose certificate
is signed by --tls-client-ca and names an allowed identity (`fedmf.tff.client_identity`); on
`unix:PATH` to the worker's own user (a 0600 socket in a 0700 directory). See deploy/README.md for
the trust model.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import signal
import sys
import threading
from typing import Any

from fedmf.cli import common
from fedmf.errors import FedmfUserError

DESCRIPTION = """\
Serve TFF computations to a fedmf coordinator (`fedmf train` or `fedmf simulate` with
`workers: ["HOST:PORT" or "unix:PATH", ...]`). TFF's worker_binary runs in a network namespace
of its own, reached only by this process; this command listens on --listen and forwards TFF's
executor calls to it.

A worker runs ANY TensorFlow computation its clients send, with this process's file access. So
on a TCP address, loopback included, it serves only over mutual TLS: to clients holding a
certificate signed by --tls-client-ca, with the clientAuth usage, that names an allowed identity
(--allow-client, --allow-clients-file; default: fedmf-coordinator, the name
deploy/certs/make-certs.sh gives the coordinator). Refused clients are logged with their identity.
On unix:PATH it serves this user only (a 0600 socket in a 0700 directory), without TLS.

Prints one line when ready ("serving on ADDRESS ..."); re-reads the TLS files when they change
or on SIGHUP (running calls go on); stops with its worker on SIGTERM or Ctrl-C.

examples:
  fedmf worker --listen unix:/run/fedmf/worker.sock
  fedmf worker --listen 0.0.0.0:8470 --tls-cert worker.pem --tls-key worker.key \\
    --tls-client-ca ca.pem --allow-client fedmf-coordinator"""


def add_parser(subparsers: Any) -> None:
  parser = common.add_command(
    subparsers,
    "worker",
    "serve TFF computations to a coordinator (mutual TLS, or a private Unix socket)",
    DESCRIPTION,
  )
  parser.add_argument(
    "--listen",
    default="127.0.0.1:8470",
    metavar="ADDRESS",
    help="HOST:PORT (port 0 picks a free one; needs the three --tls-* files) or unix:PATH "
    "(default 127.0.0.1:8470)",
  )
  parser.add_argument("--tls-cert", metavar="PATH", help="this worker's certificate (PEM)")
  parser.add_argument(
    "--tls-key", metavar="PATH", help="this worker's private key (PEM, not readable by others)"
  )
  parser.add_argument(
    "--tls-client-ca",
    metavar="PATH",
    help="CA certificate(s) (PEM) that must have signed every client's certificate",
  )
  parser.add_argument(
    "--allow-client",
    action="append",
    default=[],
    metavar="NAME|sha256:HEX",
    help="a client allowed to run computations: a name its certificate carries (a subject "
    "alternative name, or its CN where it has none) or its SHA-256 fingerprint; repeatable "
    "(default, when neither this nor --allow-clients-file is given: fedmf-coordinator)",
  )
  parser.add_argument(
    "--allow-clients-file",
    action="append",
    default=[],
    metavar="FILE",
    help="a file of allowed clients, one name or sha256:HEX a line (# comments); repeatable",
  )
  parser.add_argument(
    "--health-listen",
    metavar="HOST:PORT",
    help="also serve the standard gRPC health service alone, in plaintext, on HOST:PORT (for "
    "Kubernetes gRPC probes, which speak no TLS); it runs nothing and tells only whether the "
    "worker serves",
  )
  parser.add_argument(
    "--isolation",
    choices=("namespace", "none"),
    default=None,
    help="where no network namespace can be made: refuse (namespace, default) or run TFF's "
    "worker_binary exposed on every interface (none; not recommended)",
  )
  parser.add_argument("--log", metavar="FILE", help="worker_binary's own output (default: none)")
  parser.set_defaults(func=run)


def worker_binary_path() -> str:
  """TFF's worker_binary, found without importing TFF (which takes seconds)."""
  spec = importlib.util.find_spec("tensorflow_federated")
  if spec is None or not spec.submodule_search_locations:
    raise FedmfUserError("tensorflow_federated is not installed in this environment")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", "worker_binary")
  if not os.access(path, os.X_OK):
    raise FedmfUserError(f"TFF's worker_binary is missing or not executable: {path}")
  return path


def check_args(args: argparse.Namespace):
  """Validates --listen, the TLS files and the allow-list before anything starts.

  Returns (target, tls, allow): tls is a `front.ReloadingTLS` (None on a Unix socket), allow the
  `AllowList` (None on a Unix socket)."""
  from fedmf.tff import channels, front  # pylint: disable=g-import-not-at-top
  from fedmf.tff.client_identity import AllowList  # pylint: disable=g-import-not-at-top

  target = channels.parse_target(args.listen, "--listen", allow_port_zero=True)
  given = {
    "--tls-cert": args.tls_cert,
    "--tls-key": args.tls_key,
    "--tls-client-ca": args.tls_client_ca,
  }
  missing = [flag for flag, value in given.items() if not value]
  if isinstance(target, channels.UnixSocket):
    if len(missing) < 3 or args.allow_client or args.allow_clients_file:
      raise FedmfUserError(
        f"--listen {target} is a Unix socket, served without TLS to this user only: drop the "
        "--tls-* and --allow-* flags, or listen on HOST:PORT to use them"
      )
    if args.health_listen:
      raise FedmfUserError("--health-listen is for a TCP worker; a Unix socket serves health too")
    return target, None, None
  if missing == list(given):
    where = "every local user" if target.is_loopback else "every host that reaches it"
    raise FedmfUserError(
      f"--listen {target} is a TCP port, where plaintext would let {where} run code as this "
      "user: give --tls-cert, --tls-key and --tls-client-ca (mutual TLS), or serve this user "
      "only on a Unix socket with --listen unix:PATH"
    )
  if missing:
    raise FedmfUserError(f"mutual TLS needs all three files: missing {', '.join(missing)}")
  if args.health_listen:
    channels.parse_address(args.health_listen, "--health-listen", allow_port_zero=True)
  allow = AllowList.load(args.allow_client, args.allow_clients_file)
  tls = front.ReloadingTLS(args.tls_cert, args.tls_key, args.tls_client_ca)
  return target, tls, allow


def run(args: argparse.Namespace) -> int:
  from fedmf.tff import front, sandbox  # pylint: disable=g-import-not-at-top

  target, tls, allow = check_args(args)
  binary = worker_binary_path()
  stopped = threading.Event()
  reasons: list[str] = []

  def stop(reason: str) -> None:
    reasons.append(reason)
    stopped.set()

  # A flag, not an exception: a signal arriving inside a gc callback would lose the exception.
  signal.signal(signal.SIGTERM, lambda signum, frame: stop("terminated"))
  signal.signal(signal.SIGINT, lambda signum, frame: stop("interrupted"))
  if tls is not None:
    signal.signal(signal.SIGHUP, lambda signum, frame: tls.reload())
  worker = sandbox.IsolatedWorker(
    binary,
    ["--max_concurrent_computation_calls=-1"],
    log_path=args.log,
    policy=args.isolation,
  )
  servers = []
  try:
    try:
      server, bound, servicer = front.serve(str(target), worker.address, tls=tls, allow=allow)
      servers.append(server)
      health_line = ""
      if args.health_listen:
        health_server, health_bound = front.serve_health(args.health_listen, servicer)
        servers.append(health_server)
        health_line = f"; health service alone on {health_bound}"
    except (OSError, RuntimeError) as e:
      raise FedmfUserError(f"cannot listen on {target}: {e}") from None
    if tls is not None:
      security = f"mutual TLS on, as {tls.identity.describe()}; clients allowed: {allow.describe()}"
    else:
      security = "mutual TLS off: a Unix socket of mode 0600 for this user only"
    isolation = "exposed" if worker.exposed else "isolated in its own network namespace"
    print(
      f"fedmf worker: serving on {bound} ({security}; TFF worker_binary {isolation}{health_line})",
      flush=True,
    )

    threading.Thread(target=lambda: (worker.process.wait(), stop("worker")), daemon=True).start()
    while not stopped.wait(1.0):
      if tls is not None:
        tls.poll()
    if reasons[0] == "worker":
      # A signal to the whole process group reaches worker_binary too: it may exit first.
      stopped.clear()
      stopped.wait(0.5)
      signalled = [r for r in reasons if r != "worker"]
      if signalled:
        reasons.insert(0, signalled[0])
    if reasons[0] == "worker":
      print("fedmf worker: error: TFF's worker_binary exited; stopping", file=sys.stderr)
      return 1
    print(f"fedmf worker: {reasons[0]}; stopped", file=sys.stderr)
    return 143 if reasons[0] == "terminated" else 130
  finally:
    stopped.set()
    for server in servers:
      server.stop(grace=1).wait(5)
    worker.close()
    if target is not None and hasattr(target, "path"):
      with contextlib.suppress(OSError):
        os.unlink(target.path)
