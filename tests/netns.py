"""Emulated hosts for tests: Linux network namespaces joined to this one by veth links.

Each host gets a namespace of its own with one address, reachable from the test's namespace (the
"coordinator host") only; traffic goes nowhere else. Everything made here is removed on exit, also
after failures: the processes started in a namespace, the namespace and its links.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest


def available() -> Optional[str]:
  """None when this test process can make network namespaces; else the reason it cannot."""
  if os.geteuid() != 0:
    return "needs root (ip netns)"
  if shutil.which("ip") is None:
    return "needs iproute2 (ip)"
  return None


def require() -> None:
  reason = available()
  if reason:
    pytest.skip(reason)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclasses.dataclass
class Host:
  name: str  # the namespace
  address: str  # its address on the link to the test's namespace
  link: str  # the test side of the veth link
  processes: list = dataclasses.field(default_factory=list)

  def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
    proc = subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)
    self.processes.append(proc)
    return proc

  def shape(self, delay_ms: float = 0.0, rate_mbit: Optional[float] = None) -> float:
    """Latency and bandwidth on both directions of the link; returns the one-way delay applied.

    `tc netem` where the kernel has it; otherwise (no sch_netem) a token bucket (`tbf`) for the
    bandwidth only, and no added delay (0.0 is returned).
    """
    netem = ["netem", "delay", f"{delay_ms}ms"] + (
      ["rate", f"{rate_mbit}mbit"] if rate_mbit else []
    )
    tbf = ["tbf", "rate", f"{rate_mbit}mbit", "burst", "256kb", "latency", "50ms"]
    for spec, applied in ((netem, delay_ms), (tbf if rate_mbit else None, 0.0)):
      if spec is None:
        return 0.0
      first = subprocess.run(["tc", "qdisc", "replace", "dev", self.link, "root", *spec],
                             capture_output=True)  # fmt: skip
      if first.returncode == 0:
        subprocess.run(
          [
            "ip",
            "netns",
            "exec",
            self.name,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            *spec,
          ],
          check=True,
          capture_output=True,
        )
        return applied
    return 0.0


@contextlib.contextmanager
def hosts(count: int, tag: str = "t") -> Iterator[list[Host]]:
  """`count` emulated hosts; names and addresses unique to this process."""
  uid = f"{os.getpid() % 100000}"
  subnet = 16 + os.getpid() % 200  # 10.<subnet>.<i>.0/30: private, ours only
  made: list[Host] = []
  try:
    for i in range(count):
      name = f"fedmf{tag}{uid}h{i}"
      link = f"fm{uid}{tag}{i}"[:15]
      _ip("netns", "add", name)
      host = Host(name, f"10.{subnet}.{i}.2", link)
      made.append(host)
      _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", name)
      _ip("addr", "add", f"10.{subnet}.{i}.1/30", "dev", link)
      _ip("link", "set", link, "up")
      _ip("-n", name, "addr", "add", f"{host.address}/30", "dev", "eth0")
      _ip("-n", name, "link", "set", "eth0", "up")
      _ip("-n", name, "link", "set", "lo", "up")
    yield made
  finally:
    for host in made:
      for proc in host.processes:
        if proc.poll() is None:
          proc.kill()
        with contextlib.suppress(Exception):
          proc.wait(timeout=10)
      pids = _ip("netns", "pids", host.name, check=False).stdout.split()
      for pid in pids:  # Whatever else still runs there (the worker_binary of a killed worker).
        with contextlib.suppress(ProcessLookupError, ValueError):
          os.kill(int(pid), 9)
      _ip("link", "del", host.link, check=False)
      _ip("netns", "del", host.name, check=False)


def read_line(proc: subprocess.Popen, timeout: float) -> str:
  """The next stdout line of `proc` ("" on EOF or timeout)."""
  out: list[str] = []
  reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
  reader.start()
  reader.join(timeout)
  return out[0].strip() if out else ""


def wait_until(predicate, timeout: float, step: float = 0.05) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(step)
  return False


def descendants(pid: int) -> set[int]:
  """Every process below `pid` (children, their children, ...), by `pgrep -P`."""
  found, frontier = set(), [pid]
  while frontier:
    out = subprocess.run(["pgrep", "-P", str(frontier.pop())], capture_output=True, text=True)
    for child in map(int, out.stdout.split()):
      if child not in found:
        found.add(child)
        frontier.append(child)
  return found


def start_worker(host: Host, certs: Path, port: int, timeout: float = 120) -> subprocess.Popen:
  """`fedmf worker` on `host`:`port` with mutual TLS (certs/{worker.pem,worker.key,ca.pem}).

  Returns once it printed its ready line; raises RuntimeError (with that line) if it did not.
  """
  proc = host.popen(
    [
      sys.executable, "-m", "fedmf.cli.main", "worker", "--listen", f"{host.address}:{port}",
      "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(certs / "worker.key"),
      "--tls-client-ca", str(certs / "ca.pem"),
    ],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
  )  # fmt: skip
  line = read_line(proc, timeout)
  if f"serving on {host.address}:{port}" not in line or "mutual TLS on" not in line:
    raise RuntimeError(f"fedmf worker on {host.name} did not start: {line!r} (exit {proc.poll()})")
  return proc
