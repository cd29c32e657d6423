"""`fedmf worker`: a TFF executor service for coordinators on other hosts, over mutual TLS.

It starts TFF's `worker_binary` in a network namespace of its own (nothing reaches it but this
process), and serves TFF's executor methods on --listen through a front that fedmf owns
(`fedmf.tff.front`). On a non-loopback address the front accepts only clients whose certificate
is signed by --tls-client-ca. See deploy/README.md for the trust model.
"""

from __future__ import annotations

import argparse
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
`workers: ["HOST:PORT", ...]`). TFF's worker_binary runs in a network namespace of its own,
reached only by this process; this command listens on --listen and forwards TFF's executor
calls to it.

A worker runs ANY TensorFlow computation its clients send, with this process's file access:
on any address other than loopback it serves only over mutual TLS, to clients holding a
certificate signed by --tls-client-ca (give the coordinator worker_tls: {ca, cert, key}).
Prints one line when ready ("serving on HOST:PORT ..."); stops with its worker on SIGTERM or
Ctrl-C."""


def add_parser(subparsers: Any) -> None:
  parser = common.add_command(
    subparsers,
    "worker",
    "serve TFF computations to a coordinator on another host (mutual TLS)",
    DESCRIPTION,
  )
  parser.add_argument(
    "--listen",
    default="127.0.0.1:8470",
    metavar="HOST:PORT",
    help="address to serve on (default 127.0.0.1:8470; port 0 picks a free one); a non-loopback "
    "address needs the three --tls-* files",
  )
  parser.add_argument("--tls-cert", metavar="PATH", help="this worker's certificate (PEM)")
  parser.add_argument("--tls-key", metavar="PATH", help="this worker's private key (PEM)")
  parser.add_argument(
    "--tls-client-ca",
    metavar="PATH",
    help="CA certificate (PEM) that must have signed every client's certificate",
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
  """Validates --listen and the TLS files before anything starts; returns (address, tls bytes)."""
  from fedmf.tff import channels  # pylint: disable=g-import-not-at-top

  address = channels.parse_address(args.listen, "--listen", allow_port_zero=True)
  given = {
    "--tls-cert": args.tls_cert,
    "--tls-key": args.tls_key,
    "--tls-client-ca": args.tls_client_ca,
  }
  missing = [flag for flag, value in given.items() if not value]
  if len(missing) not in (0, 3):
    raise FedmfUserError(f"mutual TLS needs all three files: missing {', '.join(missing)}")
  if missing and not address.is_loopback:
    raise FedmfUserError(
      f"--listen {address} is not a loopback address: serving there needs mutual TLS "
      "(--tls-cert, --tls-key, --tls-client-ca), because a worker runs any code it is sent"
    )
  tls = None
  if not missing:
    tls = tuple(channels.read_pem(path, flag) for flag, path in given.items())
  return address, tls


def run(args: argparse.Namespace) -> int:
  from fedmf.tff import front, sandbox  # pylint: disable=g-import-not-at-top

  address, tls = check_args(args)
  binary = worker_binary_path()
  stopped = threading.Event()
  reasons: list[str] = []

  def stop(reason: str) -> None:
    reasons.append(reason)
    stopped.set()

  # A flag, not an exception: a signal arriving inside a gc callback would lose the exception.
  signal.signal(signal.SIGTERM, lambda signum, frame: stop("terminated"))
  signal.signal(signal.SIGINT, lambda signum, frame: stop("interrupted"))
  worker = sandbox.IsolatedWorker(
    binary,
    ["--max_concurrent_computation_calls=-1"],
    log_path=args.log,
    policy=args.isolation,
  )
  server = None
  try:
    cert, key, client_ca = tls if tls else (None, None, None)
    try:
      server, port = front.serve(
        str(address), worker.address, tls_cert=cert, tls_key=key, tls_client_ca=client_ca
      )
    except (OSError, RuntimeError) as e:
      raise FedmfUserError(f"cannot listen on {address}: {e}") from None
    bound = f"[{address.host}]:{port}" if ":" in address.host else f"{address.host}:{port}"
    print(
      f"fedmf worker: serving on {bound} (mutual TLS {'on' if tls else 'off'}; TFF "
      f"worker_binary {'exposed' if worker.exposed else 'isolated in its own network namespace'})",
      flush=True,
    )

    threading.Thread(target=lambda: (worker.process.wait(), stop("worker")), daemon=True).start()
    while not stopped.wait(1.0):
      pass
    if reasons[0] == "worker":
      print("fedmf worker: error: TFF's worker_binary exited; stopping", file=sys.stderr)
      return 1
    print(f"fedmf worker: {reasons[0]}; stopped", file=sys.stderr)
    return 143 if reasons[0] == "terminated" else 130
  finally:
    stopped.set()
    if server is not None:
      server.stop(grace=1).wait(5)
    worker.close()
