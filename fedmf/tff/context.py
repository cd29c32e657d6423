"""An owned local TFF C++ execution context that leaves no `worker_binary` behind.

Layer 3 of docs/architecture.md (`fedmf.tff`).

TFF 0.87's default context (installed on `import tensorflow_federated`) lazily
spawns `tensorflow_federated/data/worker_binary`, a gRPC executor service. That
process is only killed from a `__del__` of an object hidden in a closure, so it
often outlives Python, and it inherits the parent's stdout/stderr: a shell
pipeline such as `python x.py | tail` then never sees EOF and hangs.

This module builds the same stack as
`tff.backends.native.create_sync_local_cpp_execution_context()` (same compiler,
same remote executor; secure sums, which the C++ runtime does not implement, run
as their insecure equivalents, as in TFF's own test context), but it owns the
worker process:

* the worker's stdout/stderr go to /dev/null (or a log file), never to our pipes;
* the worker runs in a network namespace of its own and is reached through a
  0600 Unix socket (`fedmf.tff.sandbox`): nothing of the run listens on the
  network, where TFF's own context opens an unauthenticated port on every
  interface;
* on Linux the worker gets `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the
  thread that started it even if Python is killed with SIGKILL;
* `LocalExecutionContext.close()` (called on exiting `local_execution_context()`)
  sends SIGINT, waits, then SIGKILLs;
* an `atexit` hook closes every context still open at interpreter exit.

Usage:

  with local_execution_context():
    process = build_some_tff_process()
    state = process.initialize()

or, for command-line programs, `ensure_context()` once at start-up.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Mapping, Optional

import grpc
import tensorflow_federated as tff

from fedmf.tff import sandbox

# TFF-internal modules: the same ones `create_sync_local_cpp_execution_context`
# uses (TFF is pinned to 0.87.0 in pyproject.toml).
from tensorflow_federated.python.core.backends.native import compiler as _native_compiler
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
  tensorflow_computation as _tf_computation,
)
from tensorflow_federated.python.core.impl.types import placements as _placements

__all__ = [
  'LocalExecutionContext',
  'create_local_execution_context',
  'local_execution_context',
  'ensure_context',
  'close_all',
  'worker_binary_path',
]

_GRPC_MAX_MESSAGE_LENGTH_BYTES = 2 * 1000 * 1000 * 1000
_GRPC_CHANNEL_OPTIONS = [
  ('grpc.max_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
  ('grpc.max_receive_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
  ('grpc.max_send_message_length', _GRPC_MAX_MESSAGE_LENGTH_BYTES),
]
_READY_POLL_SEC = 0.05
_READY_TIMEOUT_SEC = 120.0


def worker_binary_path() -> str:
  """Path of TFF's C++ `worker_binary` shipped inside the wheel."""
  return os.path.normpath(os.path.join(os.path.dirname(tff.__file__), 'data', 'worker_binary'))


class WorkerService:
  """Starts, restarts and stops one isolated `worker_binary` (`fedmf.tff.sandbox`)."""

  def __init__(
    self,
    max_concurrent_computation_calls: int,
    log_path: Optional[str],
    isolation: Optional[str] = None,
    worker_env: Optional[Mapping[str, str]] = None,
  ):
    self._max_calls = max_concurrent_computation_calls
    self._log_path = log_path
    self._isolation = isolation
    self._worker_env = dict(worker_env or {})
    self._lock = threading.RLock()
    self._worker: Optional[sandbox.IsolatedWorker] = None
    self._channel: Optional[grpc.Channel] = None
    self._stub = None
    self._closed = False

  @property
  def pid(self) -> Optional[int]:
    """PID of the process fedmf started (the namespace's bridge, parent of worker_binary)."""
    return None if self._worker is None else self._worker.pid

  @property
  def process(self):
    return None if self._worker is None else self._worker.process

  @property
  def is_ready(self) -> bool:
    """True while the started worker answers (False before the first `get_stub` and after close)."""
    stub = self._stub
    return bool(stub is not None and stub.is_ready)

  @property
  def address(self) -> Optional[str]:
    return None if self._worker is None else self._worker.address

  def _start(self) -> None:
    binary = worker_binary_path()
    if not os.path.isfile(binary):
      raise RuntimeError(f'TFF worker binary not found at {binary}.')
    self._worker = sandbox.IsolatedWorker(
      binary,
      [f'--max_concurrent_computation_calls={self._max_calls}'],
      log_path=self._log_path,
      policy=self._isolation,
      ready_timeout_s=_READY_TIMEOUT_SEC,
      extra_env=self._worker_env,
    )
    self._channel = grpc.insecure_channel(self._worker.address, _GRPC_CHANNEL_OPTIONS)
    self._stub = tff.framework.RemoteExecutorGrpcStub(self._channel)
    deadline = time.monotonic() + _READY_TIMEOUT_SEC
    while not self._stub.is_ready:
      if self._worker.process.poll() is not None:
        raise RuntimeError(f'TFF worker_binary exited with code {self._worker.process.returncode}.')
      if time.monotonic() > deadline:
        self._stop_process()
        raise RuntimeError('TFF worker_binary did not become ready in time.')
      time.sleep(_READY_POLL_SEC)

  def get_stub(self):
    with self._lock:
      if self._closed:
        raise RuntimeError('This fedmf LocalExecutionContext has been closed.')
      if self._stub is not None and self._stub.is_ready:
        return self._stub
      self._stop_process()  # Dead or unresponsive: restart (as TFF does).
      self._start()
      return self._stub

  def _stop_process(self, timeout: float = 5.0) -> None:
    if self._channel is not None:
      with contextlib.suppress(Exception):
        self._channel.close()
    self._channel = None
    self._stub = None
    worker, self._worker = self._worker, None
    if worker is not None:
      worker.close(timeout)

  def close(self) -> None:
    with self._lock:
      self._closed = True
      self._stop_process()


def compile_for_simulation(comp):
  """TFF's native compiler, after replacing secure-summation intrinsics (`federated_secure_sum`,
  `federated_secure_sum_bitwidth`, `federated_secure_modular_sum`) with their insecure equivalents:
  TFF's C++ runtime does not implement them, and a simulation has no parties to hide sums from
  (`tff.backends.test`'s context does the same). A computation without them is unchanged; the
  pipeline caches each computation's compilation."""
  comp = tff.backends.test.replace_secure_intrinsics_with_bodies(comp)
  return _native_compiler.desugar_and_transform_to_native(comp)


def context_kwargs(service: WorkerService, default_num_clients: int = 0) -> dict:
  """The executor stack and compiler of TFF's native local context, over a worker we own."""

  def stack_fn(cardinalities):
    if cardinalities.get(_placements.CLIENTS) is None:
      cardinalities[_placements.CLIENTS] = default_num_clients
    ex = tff.framework.RemoteExecutor(service.get_stub())
    ex.set_cardinalities(cardinalities)
    return ex

  return dict(
    executor_fn=tff.framework.ResourceManagingExecutorFactory(executor_stack_fn=stack_fn),
    compiler_fn=compile_for_simulation,
    transform_args=_tf_computation.transform_args,
    transform_result=_tf_computation.transform_result,
  )


def close_executors(context) -> None:
  """Closes the executors a context's factory cached (before its worker goes)."""
  executors = getattr(context.executor_factory, '_executors', {})
  for ex in list(executors.values()):
    with contextlib.suppress(Exception):
      ex.close()
  with contextlib.suppress(Exception):
    executors.clear()


class LocalExecutionContext(tff.framework.SyncExecutionContext):
  """A synchronous local C++ context whose `worker_binary` we own and close."""

  def __init__(
    self,
    *,
    default_num_clients: int = 0,
    max_concurrent_computation_calls: int = -1,
    log_path: Optional[str] = None,
    isolation: Optional[str] = None,
    worker_env: Optional[Mapping[str, str]] = None,
  ):
    self._service = WorkerService(max_concurrent_computation_calls, log_path, isolation, worker_env)
    super().__init__(**context_kwargs(self._service, default_num_clients))
    # Start now, from the calling (usually main) thread: PR_SET_PDEATHSIG is
    # tied to the thread that forks, and the main thread lives longest.
    self._service.get_stub()
    _LIVE_CONTEXTS.add(self)

  @property
  def worker_pid(self) -> Optional[int]:
    """PID of the running worker_binary, or None when none is running."""
    return self._service.pid

  def close(self) -> None:
    """Stops the worker. Idempotent. Later invocations raise RuntimeError."""
    close_executors(self)
    self._service.close()
    _LIVE_CONTEXTS.discard(self)


_LIVE_CONTEXTS: 'weakref.WeakSet[LocalExecutionContext]' = weakref.WeakSet()
_DEFAULT: Optional[LocalExecutionContext] = None


def close_all() -> None:
  """Closes every `LocalExecutionContext` still open (registered at exit)."""
  global _DEFAULT
  for ctx in list(_LIVE_CONTEXTS):
    ctx.close()
  _DEFAULT = None


atexit.register(close_all)


def create_local_execution_context(**kwargs) -> LocalExecutionContext:
  """Creates (and starts) a `LocalExecutionContext`; the caller closes it."""
  return LocalExecutionContext(**kwargs)


@contextlib.contextmanager
def local_execution_context(**kwargs) -> Iterator[LocalExecutionContext]:
  """Installs a fresh owned local C++ context; kills its worker on exit.

  Args:
    **kwargs: `default_num_clients`, `max_concurrent_computation_calls`,
      `log_path` (worker stdout/stderr; default /dev/null), `isolation`
      ("namespace" or "none"; see `fedmf.tff.sandbox`), `worker_env` (added to the
      environment the worker inherits; see `fedmf.tff.worker_threads`).

  Yields:
    The installed `LocalExecutionContext`.
  """
  ctx = LocalExecutionContext(**kwargs)
  try:
    with tff.framework.get_context_stack().install(ctx):
      yield ctx
  finally:
    ctx.close()


def ensure_context(**kwargs) -> LocalExecutionContext:
  """Sets an owned local context as TFF's default (idempotent; closed at exit).

  Meant for command-line programs: call once before building computations.
  """
  global _DEFAULT
  if _DEFAULT is None or _DEFAULT not in _LIVE_CONTEXTS:
    _DEFAULT = LocalExecutionContext(**kwargs)
    tff.framework.set_default_context(_DEFAULT)
  return _DEFAULT
