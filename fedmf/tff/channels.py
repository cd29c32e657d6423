"""gRPC channels to TFF executor services: addresses, mutual TLS, keep-alive and their validation.

One concept: how fedmf reaches a worker. A worker is named by `host:port` (a `fedmf worker`
service over TCP) or `unix:PATH` (a `fedmf worker --listen unix:PATH`, or a local worker in its own
network namespace, `fedmf.tff.sandbox`). Every TCP worker, loopback included, is reached only over
mutual TLS: the coordinator checks the worker's certificate against `ca` and presents
`cert`/`key`, which the worker checks against its client CA and its allow-list
(`fedmf worker --tls-client-ca`, `fedmf.tff.client_identity`). A Unix socket is protected by its
file mode (0600 in a 0700 directory: its owner and root only) and carries plaintext.

Keep-alive: the coordinator pings every `KEEPALIVE_S` seconds, also during a silent chunk, so that
a vanished host is noticed within about 20 s; the worker's front accepts pings every
`MIN_PING_INTERVAL_S` (`SERVER_OPTIONS`). gRPC's default server policy (one ping per 5 minutes
without data, 2 strikes) answered such a coordinator with GOAWAY too_many_pings after about 30 s
of a silent chunk.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from typing import Optional, Sequence, Union

from fedmf.errors import FedmfUserError
from fedmf.tff import certificates
from fedmf.tff.certificates import WorkerTLSError

# TFF's own channel options (`tff.backends.native` local contexts): messages up to 2 GB.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
MESSAGE_OPTIONS = (
  ("grpc.max_message_length", _MAX_MESSAGE_BYTES),
  ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
  ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
)
KEEPALIVE_S = 10
MIN_PING_INTERVAL_S = 5  # < KEEPALIVE_S: every ping of the coordinator is welcome.
# The coordinator's channels: a peer that vanishes (host down, cable out) is noticed within about
# 20 s, not hours; pings continue while a call is silent (no data either way).
CHANNEL_OPTIONS = MESSAGE_OPTIONS + (
  ("grpc.keepalive_time_ms", KEEPALIVE_S * 1000),
  ("grpc.keepalive_timeout_ms", 10_000),
  ("grpc.keepalive_permit_without_calls", 1),
  ("grpc.http2.max_pings_without_data", 0),
)
# The front's server (gRPC core's chttp2 ping policy): pings are accepted every
# MIN_PING_INTERVAL_S, with or without calls; a client pinging faster still gets GOAWAY after
# max_ping_strikes. The server pings its clients too, to drop a coordinator that vanished.
SERVER_OPTIONS = MESSAGE_OPTIONS + (
  ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_S * 1000),
  ("grpc.http2.max_ping_strikes", 2),
  ("grpc.keepalive_permit_without_calls", 1),
  ("grpc.keepalive_time_ms", 30_000),
  ("grpc.keepalive_timeout_ms", 10_000),
)
# The front's channel to its own worker_binary (a Unix socket to a local process): no pings, which
# worker_binary's default server policy would answer with GOAWAY during a long chunk.
LOCAL_OPTIONS = MESSAGE_OPTIONS

UNIX_PREFIX = "unix:"


class WorkerAddressError(FedmfUserError):
  """A worker address that is not `host:port` or `unix:PATH`."""


@dataclasses.dataclass(frozen=True)
class Address:
  host: str
  port: int

  def __str__(self) -> str:
    return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

  @property
  def is_loopback(self) -> bool:
    if self.host == "localhost":
      return True
    try:
      return ipaddress.ip_address(self.host).is_loopback
    except ValueError:
      return False


@dataclasses.dataclass(frozen=True)
class UnixSocket:
  path: str

  def __str__(self) -> str:
    return f"{UNIX_PREFIX}{self.path}"


def parse_target(
  text: str, what: str = "worker address", allow_port_zero: bool = False
) -> Union[Address, UnixSocket]:
  """`unix:PATH` (an absolute path) -> UnixSocket; else `parse_address`."""
  if isinstance(text, str) and text.strip().startswith(UNIX_PREFIX):
    path = text.strip()[len(UNIX_PREFIX) :]
    if path.startswith("//"):  # gRPC's unix:///abs form
      path = path[2:]
    if not path.startswith("/") or "\0" in path:
      raise WorkerAddressError(f"{what} {text!r}: give unix:/ABSOLUTE/PATH")
    return UnixSocket(os.path.normpath(path))
  return parse_address(text, what, allow_port_zero)


def parse_address(
  text: str, what: str = "worker address", allow_port_zero: bool = False
) -> Address:
  """`host:port` (`[v6]:port` for IPv6) -> Address; raises WorkerAddressError naming the text."""
  if not isinstance(text, str) or not text.strip():
    raise WorkerAddressError(f"{what} must be 'host:port' or 'unix:PATH', got {text!r}")
  text = text.strip()
  if text.startswith("["):
    host, sep, port = text[1:].partition("]:")
  else:
    host, sep, port = text.rpartition(":")
  if not sep or not host or ":" in host and not text.startswith("["):
    raise WorkerAddressError(f"{what} must be 'host:port' or 'unix:PATH', got {text!r}")
  lowest = 0 if allow_port_zero else 1
  if not port.isdigit() or not lowest <= int(port) < 65536:
    raise WorkerAddressError(f"{what} {text!r} has no valid port ({lowest}-65535)")
  if any(c.isspace() or c in "/@?#" for c in host):
    raise WorkerAddressError(f"{what} {text!r} has an invalid host")
  return Address(host, int(port))


@dataclasses.dataclass(frozen=True)
class TLSFiles:
  """PEM files for mutual TLS: the CA that signed the peer, and this side's certificate and key."""

  ca: str
  cert: str
  key: str

  @classmethod
  def from_mapping(cls, value, what: str = "worker_tls") -> "TLSFiles":
    if not isinstance(value, dict):
      raise WorkerTLSError(f"{what} must be a mapping with ca, cert and key, got {value!r}")
    missing = [k for k in ("ca", "cert", "key") if not value.get(k)]
    unknown = sorted(set(value) - {"ca", "cert", "key"})
    if missing or unknown:
      detail = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"
      raise WorkerTLSError(f"{what} needs exactly ca, cert and key ({detail})")
    return cls(str(value["ca"]), str(value["cert"]), str(value["key"]))

  def read(self, what: str = "worker_tls") -> tuple[bytes, bytes, bytes]:
    """(ca, cert, key) bytes, checked (`fedmf.tff.certificates`): WorkerTLSError naming an
    unreadable or non-PEM file, a key readable by every user, a key of another certificate, or a
    certificate out of its dates."""
    ca = certificates.read_pem(self.ca, f"{what}.ca")
    cert = certificates.read_pem(self.cert, f"{what}.cert")
    key = certificates.read_key(self.key, f"{what}.key")
    certificates.check_server_files(cert, key, ca, (f"{what}.cert", f"{what}.key", f"{what}.ca"))
    return ca, cert, key


def channel_credentials(tls: TLSFiles):
  """gRPC client credentials for mutual TLS: the PEM files read (and checked) once, for every channel."""
  import grpc  # pylint: disable=g-import-not-at-top

  ca, cert, key = tls.read()
  return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def open_channel(target: str, credentials=None, options=CHANNEL_OPTIONS):
  """A gRPC channel to `target` (`unix:PATH` or `host:port`), over mutual TLS with `credentials`
  (`channel_credentials`) for a TCP target, else in plaintext (Unix sockets only: the callers
  check). A Unix socket carries plaintext whatever `credentials` says."""
  import grpc  # pylint: disable=g-import-not-at-top

  if credentials is None or target.startswith(UNIX_PREFIX):
    return grpc.insecure_channel(target, list(options))
  return grpc.secure_channel(target, credentials, list(options))


def check_remote_workers(
  addresses: Sequence[str], tls: Optional[TLSFiles]
) -> list[Union[Address, UnixSocket]]:
  """Parses worker addresses; a TCP worker, loopback included, needs mutual TLS.

  The PEM files themselves are read by `channel_credentials` (once per pool) or `TLSFiles.read`.
  """
  parsed = [parse_target(a) for a in addresses]
  if len(set(parsed)) != len(parsed):
    raise WorkerAddressError(f"workers lists an address twice: {list(addresses)}")
  tcp = [str(a) for a in parsed if isinstance(a, Address)]
  if tcp and tls is None:
    where = "every local user" if parse_address(tcp[0]).is_loopback else "anyone on the path"
    raise WorkerTLSError(
      f"worker {tcp[0]} is a TCP address, where plaintext would let {where} run code on it: "
      "give worker_tls (ca, cert, key) to reach it over mutual TLS, or serve that worker on a "
      "Unix socket (fedmf worker --listen unix:PATH; workers: ['unix:PATH'])"
    )
  return parsed
