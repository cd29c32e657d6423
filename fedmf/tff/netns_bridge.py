"""Runs TFF's `worker_binary` where only its parent can reach it (run as a script, stdlib only).

TFF 0.87's `worker_binary` binds `[::]:PORT` with no authentication and no flag for its address.
This script is started by `fedmf.tff.sandbox` already inside a network namespace of its own, which
has nothing but a loopback interface. It brings loopback up, starts `worker_binary` on a port of
that loopback, and forwards every connection made to a Unix socket (mode 0600, in a 0700
directory) to that port. Unix sockets are file-system objects, so the parent, in the host's
network namespace, reaches the worker through the socket, and nothing else on the network can.

It prints `ready` on stdout once the worker accepts connections, and exits (killing the worker)
when its parent dies or when it receives SIGINT/SIGTERM.

Kept free of fedmf and TensorFlow imports on purpose: it starts in about 30 ms.

Usage: python netns_bridge.py SOCKET_PATH WORKER_BINARY [WORKER_ARGS...]
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_F_SETPIPE_SZ = 1031
_CHUNK = 1 << 20


def _die_with_parent() -> None:
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def loopback_up() -> None:
  """`ip link set lo up`, by ioctl (a new network namespace starts with `lo` down)."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    ifreq = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, ifreq))[1]
    fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _free_loopback_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pump(src: socket.socket, dst: socket.socket) -> None:
  """Copies src to dst in the kernel (splice through a pipe) until src ends."""
  r, w = os.pipe()
  with contextlib.suppress(OSError):
    fcntl.fcntl(w, _F_SETPIPE_SZ, _CHUNK)
  try:
    while True:
      n = os.splice(src.fileno(), w, _CHUNK)
      if n == 0:
        break
      while n:
        n -= os.splice(r, dst.fileno(), n)
  except OSError:
    pass
  finally:
    os.close(r)
    os.close(w)
    with contextlib.suppress(OSError):
      dst.shutdown(socket.SHUT_WR)


def _serve_connection(conn: socket.socket, port: int) -> None:
  try:
    upstream = socket.create_connection(("127.0.0.1", port))
  except OSError:
    conn.close()
    return
  upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
  back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
  back.start()
  _pump(conn, upstream)
  back.join()
  conn.close()
  upstream.close()


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    print(__doc__, file=sys.stderr)
    return 2
  socket_path, binary, *worker_args = argv
  _die_with_parent()
  loopback_up()
  port = _free_loopback_port()
  worker = subprocess.Popen(  # pylint: disable=consider-using-with
    [binary, f"--port={port}", *worker_args],
    stdin=subprocess.DEVNULL,
    stdout=sys.stderr,  # The parent's log (or /dev/null); our stdout carries only `ready`.
    stderr=sys.stderr,
    close_fds=True,
    preexec_fn=_die_with_parent,
  )

  def stop(signum=None, frame=None):  # pylint: disable=unused-argument
    with contextlib.suppress(ProcessLookupError):
      worker.send_signal(signal.SIGINT)
    try:
      worker.wait(timeout=5)
    except subprocess.TimeoutExpired:
      worker.kill()
    os._exit(0)  # pylint: disable=protected-access

  signal.signal(signal.SIGTERM, stop)
  signal.signal(signal.SIGINT, stop)
  while True:  # Ready when the worker accepts TCP connections on the namespace's loopback.
    if worker.poll() is not None:
      return worker.returncode or 1
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
      break
    time.sleep(0.02)
  old = os.umask(0o077)
  try:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
  finally:
    os.umask(old)
  os.chmod(socket_path, 0o600)
  server.listen(16)
  threading.Thread(
    target=lambda: (worker.wait(), os._exit(worker.returncode or 1)), daemon=True
  ).start()
  print("ready", flush=True)
  while True:
    conn, _ = server.accept()
    threading.Thread(target=_serve_connection, args=(conn, port), daemon=True).start()


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
