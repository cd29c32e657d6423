"""The network front of a `fedmf worker`: TFF's executor service over mutual TLS.

One concept: exposing one isolated `worker_binary` (`fedmf.tff.sandbox`) to coordinators on other
hosts, safely. `worker_binary` cannot bind an address of our choice nor speak TLS, so it stays in
its own network namespace and this front, a gRPC server fedmf owns, listens on `HOST:PORT`. It
accepts only TFF's `ExecutorGroup` methods (all unary) and forwards each request's bytes unchanged
to the worker over its Unix socket. gRPC's own TLS does the authentication
(`require_client_auth=True`): a client without a certificate signed by the client CA, or a
plaintext client, fails the handshake before any request reaches the worker.
"""

from __future__ import annotations

import concurrent.futures
from typing import Optional

import grpc

from fedmf.tff import channels

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


class _Forwarder(grpc.GenericRpcHandler):
  """Forwards TFF's executor methods, bytes in and bytes out, to the worker's channel."""

  def __init__(self, upstream: grpc.Channel):
    self._calls = {
      f"/{SERVICE}/{m}": upstream.unary_unary(f"/{SERVICE}/{m}") for m in METHODS
    }  # No (de)serializers: the request and response bytes pass through untouched.

  def service(self, handler_call_details):
    call = self._calls.get(handler_call_details.method)
    if call is None:
      return None  # UNIMPLEMENTED: nothing but TFF's executor service is offered.

    def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
      remaining = context.time_remaining()
      # gRPC reports "no deadline" as None or as a huge value, depending on the version.
      timeout = remaining if remaining is not None and 0 < remaining < 1e7 else None
      try:
        return call(request, timeout=timeout)
      except grpc.RpcError as e:
        context.abort(e.code(), e.details() or "worker error")

    return grpc.unary_unary_rpc_method_handler(forward)


def serve(
  listen: str,
  upstream_target: str,
  *,
  tls_cert: Optional[bytes] = None,
  tls_key: Optional[bytes] = None,
  tls_client_ca: Optional[bytes] = None,
  max_threads: int = 32,
) -> tuple[grpc.Server, int]:
  """Starts the front on `listen` (host:port); returns the server and its bound port.

  With the three TLS values, only clients with a certificate signed by `tls_client_ca` connect.
  """
  upstream = channels.open_channel(upstream_target)
  server = grpc.server(
    concurrent.futures.ThreadPoolExecutor(max_workers=max_threads),
    handlers=[_Forwarder(upstream)],
    options=list(channels.CHANNEL_OPTIONS),
  )
  if tls_cert is not None:
    credentials = grpc.ssl_server_credentials(
      [(tls_key, tls_cert)], root_certificates=tls_client_ca, require_client_auth=True
    )
    port = server.add_secure_port(listen, credentials)
  else:
    port = server.add_insecure_port(listen)
  if not port:
    raise OSError(f"cannot listen on {listen}")
  server.start()
  return server, port
