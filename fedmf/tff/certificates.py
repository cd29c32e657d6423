"""PEM certificates and keys for fedmf's mutual TLS: read, checked, and who they name.

One concept: what a certificate or key file says and whether it is fit to use, checked before
anything starts so that a mistake is one line naming the file, not a TLS failure much later
(gRPC reports a certificate/key mismatch as "Failed to bind to address" after seconds).

* A private key readable by every user is refused; a group-readable one is accepted with a warning
  (Kubernetes mounts secrets group-readable for the pod's `fsGroup`).
* A key that does not belong to its certificate is refused, naming both files.
* An expired or not yet valid certificate is refused, with its dates.
* `Identity` is who a certificate names: its subject alternative names (or, where it has none,
  its common name), its SHA-256 fingerprint, and whether it may be used by a TLS client
  (extended key usage clientAuth).

Parsing uses `cryptography` (already installed with TensorFlow's google-auth); gRPC's own
auth context has no key usages.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import os
import stat
from typing import Optional

from fedmf.errors import FedmfUserError

logger = logging.getLogger("fedmf.certificates")


class WorkerTLSError(FedmfUserError):
  """A missing, unreadable, unsafe or mismatched certificate or key, or TLS settings that do not
  fit together."""


def read_pem(path: str, what: str) -> bytes:
  """The bytes of a PEM file; WorkerTLSError naming `what` and the path if it is not one."""
  try:
    with open(os.path.expanduser(path), "rb") as f:
      data = f.read()
  except OSError as e:
    raise WorkerTLSError(f"{what}: cannot read {path}: {e.strerror or e}") from None
  if b"-----BEGIN " not in data:
    raise WorkerTLSError(f"{what}: {path} is not a PEM file")
  return data


def read_key(path: str, what: str) -> bytes:
  """A private key's PEM bytes; refused when every user may read the file (a key is a secret)."""
  data = read_pem(path, what)
  mode = stat.S_IMODE(os.stat(os.path.expanduser(path)).st_mode)
  if mode & 0o004:
    raise WorkerTLSError(
      f"{what}: {path} is readable by every user (mode {mode:04o}); a private key must be "
      f"owner-only: chmod 600 {path}"
    )
  if mode & 0o040:
    logger.warning("%s: %s is readable by its group (mode %04o)", what, path, mode)
  return data


def _x509():
  from cryptography import x509  # pylint: disable=g-import-not-at-top

  return x509


def load_certificate(pem: bytes, what: str):
  try:
    return _x509().load_pem_x509_certificate(pem)
  except ValueError as e:
    raise WorkerTLSError(f"{what}: not a PEM certificate ({e})") from None


def check_certificate_dates(pem: bytes, what: str, now: Optional[datetime.datetime] = None) -> None:
  """Refuses a certificate that is expired or not yet valid, with its dates."""
  cert = load_certificate(pem, what)
  now = now or datetime.datetime.now(datetime.timezone.utc)
  start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
  if now > end:
    raise WorkerTLSError(f"{what}: the certificate expired on {end:%Y-%m-%d %H:%M} UTC")
  if now < start:
    raise WorkerTLSError(f"{what}: the certificate is not valid before {start:%Y-%m-%d %H:%M} UTC")


def check_key_pair(cert_pem: bytes, key_pem: bytes, cert_what: str, key_what: str) -> None:
  """Refuses a key that does not belong to the certificate (their public keys differ)."""
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top

  cert = load_certificate(cert_pem, cert_what)
  try:
    key = serialization.load_pem_private_key(key_pem, password=None)
  except (ValueError, TypeError) as e:
    raise WorkerTLSError(f"{key_what}: not an unencrypted PEM private key ({e})") from None

  def public(k) -> bytes:
    return k.public_bytes(
      serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )

  if public(key.public_key()) != public(cert.public_key()):
    raise WorkerTLSError(
      f"{key_what} does not belong to {cert_what}: their public keys differ (give the key the "
      "certificate was made for)"
    )


def check_server_files(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, what: tuple) -> None:
  """The checks a TLS side's files pass before use: the pair matches, the dates hold, the CA
  parses. `what` names (cert, key, ca) in messages."""
  cert_what, key_what, ca_what = what
  check_key_pair(cert_pem, key_pem, cert_what, key_what)
  check_certificate_dates(cert_pem, cert_what)
  load_certificate(ca_pem, ca_what)


@dataclasses.dataclass(frozen=True)
class Identity:
  """Who a certificate names.

  `names`: its subject alternative names (DNS names, IP addresses, URIs, e-mail addresses) or,
  only when it has none, its common name: the names an allow-list matches.
  """

  common_name: Optional[str]
  alt_names: tuple[str, ...]
  fingerprint: str  # SHA-256 of the DER certificate, lower-case hex
  client_auth: bool  # extended key usage includes clientAuth

  @property
  def names(self) -> tuple[str, ...]:
    if self.alt_names:
      return self.alt_names
    return (self.common_name,) if self.common_name else ()

  def describe(self) -> str:
    """One line: CN, SAN and fingerprint, as an audit log shows them."""
    cn = self.common_name if self.common_name is not None else "(none)"
    san = ",".join(self.alt_names) if self.alt_names else "(none)"
    return f"CN={cn!r} SAN={san} sha256={self.fingerprint}"


def identity_of(pem: bytes) -> Identity:
  """The `Identity` of a PEM certificate (the first one of a chain)."""
  x509 = _x509()
  from cryptography.hazmat.primitives import serialization  # pylint: disable=g-import-not-at-top
  from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # pylint: disable=g-import-not-at-top

  cert = x509.load_pem_x509_certificate(pem)
  cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
  common_name = str(cns[0].value) if cns else None
  alt: list[str] = []
  try:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    for kind in (x509.DNSName, x509.IPAddress, x509.UniformResourceIdentifier, x509.RFC822Name):
      alt += [str(v) for v in san.get_values_for_type(kind)]
  except x509.ExtensionNotFound:
    pass
  try:
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    client_auth = ExtendedKeyUsageOID.CLIENT_AUTH in list(usages)
  except x509.ExtensionNotFound:
    client_auth = False  # No usage restriction at all: not a certificate made for a client.
  der = cert.public_bytes(serialization.Encoding.DER)
  return Identity(common_name, tuple(alt), hashlib.sha256(der).hexdigest(), client_auth)
