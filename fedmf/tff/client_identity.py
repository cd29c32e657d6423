"""Which clients a `fedmf worker` serves: an allow-list of certificate names or fingerprints.

One concept: client identity. Mutual TLS proves that a client's certificate was signed by the
worker's client CA; but a CA (an organisation's above all) signs many certificates, and whoever
reaches a worker runs code on it. So a worker also requires its client's certificate to

* carry the extended key usage clientAuth (a certificate made for a TLS client), and
* name an allowed identity: one of its subject alternative names (or its common name, where it
  has no SAN) is on the allow-list, or its SHA-256 fingerprint is (pinning one certificate).

The allow-list comes from `--allow-client` flags and `--allow-clients-file` files (one entry a
line, `#` comments); the default is `DEFAULT_CLIENT`, the name `deploy/certs/make-certs.sh` gives
the coordinator's certificate (as its CN and its SAN). In the style of Flower's SuperNode
allow-list of public keys, but on the names an organisation's CA already certifies.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional, Sequence

from fedmf.errors import FedmfUserError
from fedmf.tff.certificates import Identity

DEFAULT_CLIENT = "fedmf-coordinator"
_FINGERPRINT = re.compile(r"^(?:sha256:)?((?:[0-9a-fA-F]{2}:?){31}[0-9a-fA-F]{2})$")


class AllowListError(FedmfUserError):
  """An allow-list entry or file that cannot be used."""


@dataclasses.dataclass(frozen=True)
class AllowList:
  names: frozenset[str]
  fingerprints: frozenset[str]  # lower-case hex, no colons

  @classmethod
  def from_entries(cls, entries: Iterable[str], what: str = "--allow-client") -> "AllowList":
    names, fingerprints = set(), set()
    for raw in entries:
      entry = raw.strip()
      if not entry or any(c in entry for c in "\n\r\t"):
        raise AllowListError(f"{what}: empty or malformed entry {raw!r}")
      match = _FINGERPRINT.match(entry)
      if match:
        fingerprints.add(match.group(1).replace(":", "").lower())
      elif entry.lower().startswith("sha256:"):
        raise AllowListError(f"{what}: {entry!r} is not a SHA-256 fingerprint (64 hex digits)")
      else:
        names.add(entry)
    return cls(frozenset(names), frozenset(fingerprints))

  @classmethod
  def load(cls, entries: Sequence[str] = (), files: Sequence[str] = ()) -> "AllowList":
    """From flags and files; the default (`DEFAULT_CLIENT`) when both are empty."""
    collected = list(entries)
    for path in files:
      try:
        with open(path, encoding="utf-8") as f:
          lines = f.read().splitlines()
      except (OSError, UnicodeDecodeError) as e:
        raise AllowListError(f"--allow-clients-file: cannot read {path}: {e}") from None
      found = [line.split("#", 1)[0].strip() for line in lines]
      found = [line for line in found if line]
      if not found:
        raise AllowListError(f"--allow-clients-file: {path} lists no client")
      collected += found
    if not files and not entries:
      collected = [DEFAULT_CLIENT]
    return cls.from_entries(collected)

  def refusal(self, identity: Identity) -> Optional[str]:
    """None when `identity` may call the worker; else why not (a few words)."""
    if not identity.client_auth:
      return "the certificate lacks the clientAuth extended key usage"
    if identity.fingerprint in self.fingerprints:
      return None
    if any(name in self.names for name in identity.names):
      return None
    return "its identity is not on the allow-list"

  def describe(self) -> str:
    parts = sorted(self.names) + [f"sha256:{f[:16]}..." for f in sorted(self.fingerprints)]
    return ", ".join(parts)
