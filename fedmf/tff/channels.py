"""gRPC channels to TFF executor services: addresses, mutual TLS and their validation.

One concept: how fedmf reaches a worker. A worker is named by `host:port` (a `fedmf worker`
service), or `unix:PATH` (a local worker in its own network namespace, `fedmf.tff.sandbox`).
A remote worker on a non-loopback address is reached only over mutual TLS: the coordinator checks
the worker's certificate against `ca` and presents `cert`/`key`, which the worker checks against its
client CA (`fedmf worker --tls-client-ca`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from typing import Optional, Sequence

from fedmf.errors import FedmfUserError

# TFF's own channel options (`tff.backends.native` local contexts): messages up to 2 GB.
_MAX_MESSAGE_BYTES = 2 * 1000 * 1000 * 1000
CHANNEL_OPTIONS = (
  ("grpc.max_message_length", _MAX_MESSAGE_BYTES),
  ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
  ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
  # A peer that vanishes (host down, cable out) is noticed within about 20 s, not hours.
  ("grpc.keepalive_time_ms", 10_000),
  ("grpc.keepalive_timeout_ms", 10_000),
  ("grpc.keepalive_permit_without_calls", 1),
  ("grpc.http2.max_pings_without_data", 0),
)


class WorkerAddressError(FedmfUserError):
  """A worker address that is not `host:port`."""


class WorkerTLSError(FedmfUserError):
  """A missing or unreadable certificate or key, or TLS settings that do not fit together."""


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


def parse_address(
  text: str, what: str = "worker address", allow_port_zero: bool = False
) -> Address:
  """`host:port` (`[v6]:port` for IPv6) -> Address; raises WorkerAddressError naming the text."""
  if not isinstance(text, str) or not text.strip():
    raise WorkerAddressError(f"{what} must be 'host:port', got {text!r}")
  text = text.strip()
  if text.startswith("["):
    host, sep, port = text[1:].partition("]:")
  else:
    host, sep, port = text.rpartition(":")
  if not sep or not host or ":" in host and not text.startswith("["):
    raise WorkerAddressError(f"{what} must be 'host:port', got {text!r}")
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
    """(ca, cert, key) bytes; raises WorkerTLSError naming an unreadable or non-PEM file."""
    return tuple(
      read_pem(path, f"{what}.{name}")
      for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key))
    )


def read_pem(path: str, what: str) -> bytes:
  try:
    with open(os.path.expanduser(path), "rb") as f:
      data = f.read()
  except OSError as e:
    raise WorkerTLSError(f"{what}: cannot read {path}: {e.strerror or e}") from None
  if b"-----BEGIN " not in data:
    raise WorkerTLSError(f"{what}: {path} is not a PEM file")
  return data


def channel_credentials(tls: TLSFiles):
  """gRPC client credentials for mutual TLS: the PEM files read (and checked) once, for every channel."""
  import grpc  # pylint: disable=g-import-not-at-top

  ca, cert, key = tls.read()
  return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def open_channel(target: str, credentials=None):
  """A gRPC channel to `target` (`unix:PATH` or `host:port`), over mutual TLS with `credentials`
  (`channel_credentials`), else in plaintext (loopback and Unix sockets only: the callers check)."""
  import grpc  # pylint: disable=g-import-not-at-top

  if credentials is None:
    return grpc.insecure_channel(target, list(CHANNEL_OPTIONS))
  return grpc.secure_channel(target, credentials, list(CHANNEL_OPTIONS))


def check_remote_workers(addresses: Sequence[str], tls: Optional[TLSFiles]) -> list[Address]:
  """Parses worker addresses; a non-loopback worker needs mutual TLS (refused in plaintext).

  The PEM files themselves are read by `channel_credentials` (once per pool) or `TLSFiles.read`.
  """
  parsed = [parse_address(a) for a in addresses]
  if len(set(parsed)) != len(parsed):
    raise WorkerAddressError(f"workers lists an address twice: {list(addresses)}")
  exposed = [str(a) for a in parsed if not a.is_loopback]
  if exposed and tls is None:
    raise WorkerTLSError(
      f"worker {exposed[0]} is not on loopback: give worker_tls (ca, cert, key) to reach it "
      "over mutual TLS (plaintext would let anyone on the path run code on it)"
    )
  return parsed
