"""`fedmf worker`: refusals before anything starts, the ready line, and a clean stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import netns

ROOT = Path(__file__).resolve().parents[2]


def _worker(*args: str, **kwargs):
  return [sys.executable, "-m", "fedmf.cli.main", "worker", *args]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
  out = tmp_path_factory.mktemp("certs")
  subprocess.run(
    ["bash", str(ROOT / "deploy/certs/make-certs.sh"), str(out)], check=True, capture_output=True
  )
  return out


@pytest.mark.parametrize(
  "args, message",
  [
    (["--listen", "0.0.0.0:8470"], "is not a loopback address: serving there needs mutual TLS"),
    (["--listen", "nohost"], "--listen must be 'host:port'"),
    (["--listen", "1.2.3.4:8470", "--tls-cert", "C"], "missing --tls-key, --tls-client-ca"),
    (
      [
        "--listen",
        "1.2.3.4:8470",
        "--tls-cert",
        "/nope.pem",
        "--tls-key",
        "K",
        "--tls-client-ca",
        "A",
      ],
      "--tls-cert: cannot read /nope.pem",
    ),
  ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
  proc = subprocess.run(_worker(*args), capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], proc.stderr


def test_a_key_that_is_no_pem_is_refused(certs, tmp_path):
  bad = tmp_path / "key.pem"
  bad.write_text("not a key")
  proc = subprocess.run(
    _worker(
      "--listen",
      "0.0.0.0:0",
      "--tls-cert",
      str(certs / "worker.pem"),
      "--tls-key",
      str(bad),
      "--tls-client-ca",
      str(certs / "ca.pem"),
    ),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 2 and "is not a PEM file" in proc.stderr


@pytest.mark.parametrize("stop, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_ready_line_then_a_signal_stops_every_child(certs, stop, code):
  proc = subprocess.Popen(
    _worker(
      "--listen",
      "127.0.0.1:0",
      "--tls-cert",
      str(certs / "worker.pem"),
      "--tls-key",
      str(certs / "worker.key"),
      "--tls-client-ca",
      str(certs / "ca.pem"),
    ),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    line = netns.read_line(proc, 120)
    assert line.startswith("fedmf worker: serving on 127.0.0.1:") and "mutual TLS on" in line
    children = netns.descendants(proc.pid)
    assert len(children) >= 2  # The namespace bridge and TFF's worker_binary.
    proc.send_signal(stop)
    assert proc.wait(timeout=30) == code
    assert netns.wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in children), 10)
  finally:
    if proc.poll() is None:
      proc.kill()
