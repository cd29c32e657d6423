"""Starts TFF's `worker_binary` where nothing but fedmf can reach it.

One concept: the isolation of a local executor service. TFF 0.87's `worker_binary` listens on
`[::]:PORT` of every interface, without authentication, and runs any computation it is sent
(TensorFlow ops read and write files: the noise seed in fedmf's checkpoints among them). It has no
flag for its address or for TLS, and TFF has no in-process executor. So fedmf starts it in a
network namespace of its own, which holds only a loopback interface, and reaches it through a Unix
socket of mode 0600 in a directory of mode 0700 (`netns_bridge.py` forwards the socket to the
worker's port inside the namespace). Unix sockets are file-system objects: only the user who
started the run (and root) can connect, and no port of the run is reachable from the network.

Namespaces: with the capabilities CAP_SYS_ADMIN and CAP_NET_ADMIN (root on a host),
`unshare(CLONE_NEWNET)`; otherwise a user namespace with it (`CLONE_NEWUSER | CLONE_NEWNET`, the
equivalent of `unshare -U -r -n`, where the kernel and the seccomp profile allow unprivileged user
namespaces: a non-root user, or a container without added capabilities). Where neither is
possible, the policy `isolation` decides (docs/security.md):

* `"namespace"` (default): refuse with a one-line error naming the exposure and the ways out;
* `"none"`: start the worker exposed, as TFF does, and log a warning naming the port.

The policy's default comes from the environment variable FEDMF_WORKER_ISOLATION (library users)
or the config key `worker_isolation` (fedmf's commands).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Optional

from fedmf.errors import FedmfUserError

logger = logging.getLogger("fedmf.tff.sandbox")

ISOLATION_POLICIES = ("namespace", "none")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_PR_SET_PDEATHSIG = 1
_BRIDGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_bridge.py")


class WorkerIsolationError(FedmfUserError):
  """The local worker cannot be isolated and the policy refuses to expose it."""


class WorkerStartError(RuntimeError):
  """The worker process exited or did not become ready."""


def default_policy() -> str:
  policy = os.environ.get("FEDMF_WORKER_ISOLATION", "namespace")
  return check_policy(policy)


def check_policy(policy: str) -> str:
  if policy not in ISOLATION_POLICIES:
    raise FedmfUserError(
      f"worker_isolation must be one of {', '.join(ISOLATION_POLICIES)}, got {policy!r}"
    )
  return policy


_LIBC = ctypes.CDLL(None, use_errno=True)
_EXEC_FAILED = 140  # probe exit codes: errno of unshare, or this + errno of exec
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


def _has_net_capabilities() -> bool:
  """CAP_SYS_ADMIN (unshare a network namespace) and CAP_NET_ADMIN (bring its `lo` up), effective."""
  try:
    with open("/proc/self/status") as f:
      line = next(line for line in f if line.startswith("CapEff:"))
  except (OSError, StopIteration):
    return False
  caps = int(line.split()[1], 16)
  return all(caps >> bit & 1 for bit in (_CAP_NET_ADMIN, _CAP_SYS_ADMIN))


def _enter_namespace(uid: int, gid: int, user_namespace: bool) -> None:
  """In the child between fork and exec: a network namespace of its own, dying with the parent.

  Without the capabilities, through a user namespace in which the caller is root (needed to bring
  `lo` up), like `unshare -U -r -n`: this needs no capability at all."""
  libc = _LIBC  # Loaded by the parent: no dynamic loading between fork and exec.
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  flags = _CLONE_NEWUSER | _CLONE_NEWNET if user_namespace else _CLONE_NEWNET
  if libc.unshare(flags) != 0:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))
  if user_namespace:  # Map the caller to root of the new user namespace.
    with open("/proc/self/setgroups", "w") as f:
      f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
      f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
      f.write(f"0 {gid} 1")


_DIR_PREFIX = "fedmf-worker-"


def remove_stale_directories(tmp: Optional[str] = None) -> list[str]:
  """Removes this user's `fedmf-worker-PID-*` directories whose PID is gone (a process killed
  with SIGKILL cannot clean up: the next start does). Returns what it removed."""
  tmp = tmp or tempfile.gettempdir()
  removed = []
  try:
    names = os.listdir(tmp)
  except OSError:
    return removed
  for name in names:
    pid = name[len(_DIR_PREFIX) :].split("-", 1)[0]
    if not name.startswith(_DIR_PREFIX) or not pid.isdigit():
      continue
    path = os.path.join(tmp, name)
    try:
      if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
        continue
      os.kill(int(pid), 0)
      continue  # Alive (or the PID was reused): not ours to remove.
    except ProcessLookupError:
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
    except OSError:  # PermissionError: another user's live process has that PID.
      continue
  return removed


_PROBE: Optional[str] = None
_PROBE_LOCK = threading.Lock()


def namespace_unavailable_reason() -> Optional[str]:
  """None when this process can start children in a network namespace; else why not (cached)."""
  global _PROBE
  with _PROBE_LOCK:
    if _PROBE is None:
      if not sys.platform.startswith("linux"):
        _PROBE = f"network namespaces need Linux (this is {sys.platform})"
      else:
        _PROBE = _probe_namespace()
    return _PROBE or None


def _probe_namespace() -> str:
  """ "" when a child can enter a network namespace as `IsolatedWorker` makes it; else why not."""
  uid, gid, userns = os.getuid(), os.getgid(), not _has_net_capabilities()
  what = "user and network namespace" if userns else "network namespace"
  python = sys.executable
  pid = os.fork()
  if pid == 0:  # The child enters the namespace as a preexec_fn would, then starts python.
    code = 0
    try:
      _enter_namespace(uid, gid, userns)
      os.execv(python, [python, "-S", "-c", "pass"])
    except OSError as e:
      code = (e.errno or 99) + (_EXEC_FAILED if e.filename == python else 0)
    except BaseException:  # pylint: disable=broad-except
      code = 255
    os._exit(min(code, 255))  # pylint: disable=protected-access
  _, status = os.waitpid(pid, 0)
  code = os.waitstatus_to_exitcode(status)
  if code == 0:
    return ""
  if code == 255:
    return f"unshare({what}) failed"
  if code >= _EXEC_FAILED:
    return f"{python} cannot be started in a {what}: {os.strerror(code - _EXEC_FAILED)}"
  return f"unshare({what}) failed: {os.strerror(code)}"


class IsolatedWorker:
  """One `worker_binary` in a network namespace of its own, reached at `address` (`unix:PATH`).

  With policy "none" on a machine without namespaces, the worker listens on `localhost:PORT` of
  every interface instead (`exposed` is True). `extra_env` is added to the environment the worker
  inherits.
  """

  def __init__(
    self,
    binary: str,
    worker_args: list[str],
    *,
    log_path: Optional[str] = None,
    policy: Optional[str] = None,
    ready_timeout_s: float = 120.0,
    extra_env: Optional[Mapping[str, str]] = None,
  ):
    self.policy = check_policy(policy) if policy is not None else default_policy()
    remove_stale_directories()
    self._dir = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")  # mode 0700
    self._process: Optional[subprocess.Popen] = None
    self.exposed = False
    # The worker inherits this process's environment, plus `extra_env` (fedmf.tff.worker_threads).
    self._env = {**os.environ, **extra_env} if extra_env else None
    try:
      reason = namespace_unavailable_reason()
      if reason is None:
        self.address = self._start_isolated(binary, worker_args, log_path, ready_timeout_s)
      elif self.policy == "none":
        self.address = self._start_exposed(binary, worker_args, log_path)
      else:
        raise WorkerIsolationError(
          f"cannot isolate TFF's worker_binary ({reason}): it would listen without "
          "authentication on every network interface; run as root, allow unprivileged user "
          "namespaces (in a container: a seccomp profile that allows unshare, deploy/README.md), "
          "or accept the exposure with worker_isolation: none (FEDMF_WORKER_ISOLATION=none)"
        )
    except BaseException:
      self.close()
      raise

  @property
  def process(self) -> Optional[subprocess.Popen]:
    return self._process

  @property
  def pid(self) -> Optional[int]:
    return None if self._process is None else self._process.pid

  def _log_file(self, log_path: Optional[str]):
    if log_path:
      return open(log_path, "ab")  # pylint: disable=consider-using-with
    return subprocess.DEVNULL

  def _start_isolated(
    self, binary: str, worker_args: list[str], log_path: Optional[str], timeout: float
  ) -> str:
    socket_path = os.path.join(self._dir, "worker.sock")
    uid, gid, userns = os.getuid(), os.getgid(), not _has_net_capabilities()
    log = self._log_file(log_path)
    try:
      self._process = subprocess.Popen(  # pylint: disable=consider-using-with
        [sys.executable, "-S", _BRIDGE, socket_path, binary, *worker_args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        close_fds=True,
        env=self._env,
        preexec_fn=lambda: _enter_namespace(uid, gid, userns),
      )
    finally:
      if log is not subprocess.DEVNULL:
        log.close()
    line = _read_line(self._process, timeout)
    if line != "ready":
      code = self._process.poll()
      raise WorkerStartError(
        f"TFF worker_binary did not start in its network namespace (exit code {code})"
      )
    return f"unix:{socket_path}"

  def _start_exposed(self, binary: str, worker_args: list[str], log_path: Optional[str]) -> str:
    import portpicker  # pylint: disable=g-import-not-at-top

    port = portpicker.pick_unused_port()
    log = self._log_file(log_path)
    try:
      self._process = subprocess.Popen(  # pylint: disable=consider-using-with
        [binary, f"--port={port}", *worker_args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        close_fds=True,
        env=self._env,
        preexec_fn=_die_with_parent,
      )
    finally:
      if log is not subprocess.DEVNULL:
        log.close()
    self.exposed = True
    logger.warning(
      "TFF worker_binary listens WITHOUT authentication on port %d of every interface "
      "(worker_isolation: none): anyone who can reach this machine can run code as you",
      port,
    )
    return f"localhost:{port}"

  def close(self, timeout: float = 5.0) -> None:
    proc, self._process = self._process, None
    if proc is not None and proc.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)  # The bridge stops its worker, then exits.
      try:
        proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
          proc.kill()
        proc.wait()
    if proc is not None and proc.stdout is not None:
      proc.stdout.close()
    shutil.rmtree(self._dir, ignore_errors=True)


def _die_with_parent() -> None:
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
  """The first stdout line of `proc`, or "" when it exits or `timeout` passes first."""
  result: list[str] = []
  reader = threading.Thread(
    target=lambda: result.append(proc.stdout.readline().decode(errors="replace").strip()),
    daemon=True,
  )
  reader.start()
  deadline = time.monotonic() + timeout
  while reader.is_alive() and time.monotonic() < deadline:
    reader.join(0.05)
  return result[0] if result else ""
