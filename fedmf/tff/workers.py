"""Several TFF workers: local isolated `worker_binary` services, or `fedmf worker`s by address.

One concept: scaling the federated part of a round out on TFF's own runtime. A `WorkerPool` is
either W local `worker_binary` services (each in a network namespace of its own, reached through a
0600 Unix socket: `fedmf.tff.sandbox`) or a list of `host:port` addresses of `fedmf worker`
services on other hosts, reached over mutual TLS (`fedmf.tff.channels`). Each worker gets its own
synchronous TFF execution context (`tff.framework.RemoteExecutor` over a gRPC stub).

`PoolRunner` runs a round's chunks of clients on the workers and adds the chunk sums on the host in
chunk order. The chunks are the in-process runner's (`RoundRunner.chunks`: a size that does not
depend on the number of workers), and each chunk's sum is computed by the same C++ computation
whichever worker runs it, so on the same hardware the model is bit-identical with 0, 1, 2 or 5
workers, and after a worker is lost midway.

Faults: a chunk that a worker does not finish within `timeout_s`, or whose worker fails or stays
unreachable for `unreachable_grace_s`, is taken back and given to another worker, and the worker
is dropped for the rest of the round. At the start of each later round a dropped worker is asked
for its health (the standard gRPC health service of `fedmf worker`; a local worker is restarted)
and used again if it answers SERVING; one that does not is asked again after 10 s, doubling up to
5 minutes. When no worker is left within a round, `WorkersLostError` names the lost addresses and
the round is not released. (TFF itself retries calls to an unreachable worker forever, which is
why the pool keeps its own deadlines.)

`timeout_s` (`worker_timeout_s`) is measured per call, after warm-up: a worker's first call, in
which TFF compiles the computation and the worker traces it (seconds to minutes for a large
model), may take `WARMUP_FACTOR` times as long. Unreachability is watched from the first call on.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow_federated as tff

from fedmf.errors import FedmfRuntimeError
from fedmf.tff import channels
from fedmf.tff import context as context_lib
from fedmf.tff.runner import RoundResult, RoundRunner, add_chunk_result

logger = logging.getLogger("fedmf.workers")

DEFAULT_TIMEOUT_S = 600.0
WARMUP_FACTOR = 10.0
_UNREACHABLE_GRACE_S = 5.0
_POLL_S = 0.2
_PROBE_FIRST_S = 10.0
_PROBE_MAX_S = 300.0


class WorkersLostError(FedmfRuntimeError):
  """Every worker of the pool was lost; the round cannot be completed (nothing was released)."""


class _StubSource:
  """What `context_lib.context_kwargs` needs: `get_stub()`, for a worker reached by address."""

  def __init__(self, target: str, credentials):
    self.target = target
    self.credentials = credentials
    self.channel = channels.open_channel(target, credentials)
    self.stub = tff.framework.RemoteExecutorGrpcStub(self.channel)

  def healthy(self) -> bool:
    from fedmf.tff import front  # pylint: disable=g-import-not-at-top

    return front.check_health(self.target, self.credentials)

  def get_stub(self):
    return self.stub

  @property
  def is_ready(self) -> bool:
    return bool(self.stub.is_ready)

  def close(self) -> None:
    with contextlib.suppress(Exception):
      self.channel.close()


@dataclasses.dataclass
class _Worker:
  name: str
  source: Union[_StubSource, context_lib.WorkerService]
  context: tff.framework.SyncExecutionContext
  thread: concurrent.futures.ThreadPoolExecutor
  lost: Optional[str] = None
  unreachable_since: Optional[float] = None
  warm: bool = False  # A first call (compilation, tracing) finished on this context.
  next_probe: float = 0.0
  probe_wait: float = _PROBE_FIRST_S

  @property
  def is_ready(self) -> bool:
    return self.source.is_ready


class WorkerPool:
  """Workers to run chunks on: `workers` = a count (local, isolated) or `host:port` addresses."""

  def __init__(
    self,
    workers: Union[int, Sequence[str]],
    *,
    tls: Optional[channels.TLSFiles] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    connect_timeout_s: Optional[float] = None,
    default_num_clients: int = 0,
    log_dir: Optional[str] = None,
    isolation: Optional[str] = None,
    unreachable_grace_s: float = _UNREACHABLE_GRACE_S,
    worker_env: Optional[Mapping[str, str]] = None,
  ):
    if threading.current_thread() is not threading.main_thread():
      raise RuntimeError("start TFF workers from the main thread (PR_SET_PDEATHSIG)")
    self.timeout_s = float(timeout_s)
    self.unreachable_grace_s = float(unreachable_grace_s)
    self.workers: list[_Worker] = []
    self._default_num_clients = default_num_clients
    self._make_source: dict[str, Callable[[], object]] = {}
    try:
      if isinstance(workers, int):
        if workers < 1:
          raise ValueError(f"workers must be >= 1, got {workers}")
        for i in range(workers):
          log_path = None if log_dir is None else os.path.join(log_dir, f"worker-{i}.log")

          def local(log_path=log_path):
            service = context_lib.WorkerService(-1, log_path, isolation, worker_env)
            service.get_stub()  # Start now, from this (main) thread.
            return service

          self._make_source[f"local worker {i}"] = local
          self._add(f"local worker {i}", local())
      else:
        channels.check_remote_workers(workers, tls)
        for address in workers:

          def remote(address=address):
            # Read at each (re)connection: rotated coordinator certificates are picked up.
            credentials = None if tls is None else channels.channel_credentials(tls)
            return _StubSource(address, credentials)

          self._make_source[address] = remote
          self._add(address, remote())
        self._wait_connected(connect_timeout_s or min(self.timeout_s, 60.0))
    except BaseException:
      self.close()
      raise
    _LIVE.add(self)

  def _context(self, name: str, source):
    ctx = tff.framework.SyncExecutionContext(
      **context_lib.context_kwargs(source, self._default_num_clients)
    )
    thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"fedmf-{name}")
    return ctx, thread

  def _add(self, name: str, source) -> None:
    ctx, thread = self._context(name, source)
    self.workers.append(_Worker(name, source, ctx, thread))

  def revive(self) -> list[str]:
    """Asks each dropped worker whose turn it is for its health; the healthy ones serve again.

    Called at the start of every round (`map_chunks`); returns the names taken back."""
    back = []
    now = time.monotonic()
    for worker in self.workers:
      if worker.lost is None or now < worker.next_probe:
        continue
      source = None
      try:
        source = self._make_source[worker.name]()
        healthy = source.healthy() if isinstance(source, _StubSource) else source.is_ready
      except Exception:  # pylint: disable=broad-except
        healthy = False
      if not healthy:
        if source is not None:
          with contextlib.suppress(Exception):
            source.close()
        worker.next_probe = time.monotonic() + worker.probe_wait
        worker.probe_wait = min(worker.probe_wait * 2, _PROBE_MAX_S)
        continue
      context_lib.close_executors(worker.context)
      worker.context, worker.thread = self._context(worker.name, source)
      worker.source = source
      logger.warning(
        "TFF worker %s is back (it answers its health check; dropped for: %s); it takes chunks "
        "again",
        worker.name,
        worker.lost,
      )
      worker.lost, worker.unreachable_since, worker.warm = None, None, False
      worker.next_probe, worker.probe_wait = 0.0, _PROBE_FIRST_S
      back.append(worker.name)
    return back

  def _wait_connected(self, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
      down = [w.name for w in self.workers if not w.is_ready]
      if not down:
        return
      if time.monotonic() > deadline:
        raise WorkersLostError(
          f"worker {down[0]} unreachable after {timeout_s:g} s (is `fedmf worker` running "
          "there, and do worker_tls and its certificates match?)"
        )
      time.sleep(_POLL_S)

  @property
  def live(self) -> list[_Worker]:
    return [w for w in self.workers if w.lost is None]

  @property
  def pids(self) -> list[int]:
    return [w.source.pid for w in self.workers if getattr(w.source, "pid", None) is not None]

  def _lose(self, worker: _Worker, reason: str) -> None:
    if worker.lost is not None:
      return
    worker.lost = reason
    worker.next_probe = 0.0  # Asked for its health at the next round.
    logger.warning(
      "TFF worker %s lost (%s); its chunks go to the other workers", worker.name, reason
    )
    # Closing its channel (and stopping a local worker) fails the call still blocked in its thread
    # (TFF would retry forever).
    with contextlib.suppress(Exception):
      worker.source.close()
    worker.thread.shutdown(wait=False, cancel_futures=True)

  def map_chunks(self, call: Callable[[object, int], object], count: int) -> list:
    """[call(context, i) for i in range(count)] spread over the live workers, with failover."""
    if threading.current_thread() is threading.main_thread():
      self.revive()  # Local workers restart from the main thread only (PR_SET_PDEATHSIG).
    pending = collections.deque(range(count))
    results: dict[int, object] = {}
    running: dict[concurrent.futures.Future, tuple[_Worker, int, float]] = {}
    while pending or running:
      busy = {id(w) for w, _, _ in running.values()}
      for worker in self.live:
        if pending and id(worker) not in busy:
          index = pending.popleft()
          future = worker.thread.submit(call, worker.context, index)
          running[future] = (worker, index, time.monotonic())
      if not running:
        lost = "; ".join(f"{w.name}: {w.lost}" for w in self.workers if w.lost)
        raise WorkersLostError(f"no TFF worker left to finish the round (lost {lost})")
      done, _ = concurrent.futures.wait(
        running, timeout=_POLL_S, return_when=concurrent.futures.FIRST_COMPLETED
      )
      now = time.monotonic()
      for future in done:
        worker, index, _ = running.pop(future)
        try:
          results[index] = future.result()
          worker.warm = True
        except Exception as e:  # pylint: disable=broad-except
          self._lose(worker, _describe(e))
          pending.appendleft(index)
      for future, (worker, index, started) in list(running.items()):
        if worker.is_ready:
          worker.unreachable_since = None
        elif worker.unreachable_since is None:
          worker.unreachable_since = now
        limit = self.timeout_s if worker.warm else self.timeout_s * WARMUP_FACTOR
        if now - started > limit:
          reason = (
            f"no answer within worker_timeout_s = {self.timeout_s:g} s"
            if worker.warm
            else f"its first call (compilation and tracing) took over {WARMUP_FACTOR:g} x "
            f"worker_timeout_s = {limit:g} s"
          )
        elif (
          worker.unreachable_since is not None
          and now - worker.unreachable_since > self.unreachable_grace_s
        ):
          reason = f"unreachable for {self.unreachable_grace_s:g} s"
        else:
          continue
        running.pop(future)
        self._lose(worker, reason)
        pending.appendleft(index)
    return [results[i] for i in range(count)]

  def close(self) -> None:
    for worker in self.workers:
      context_lib.close_executors(worker.context)
      worker.thread.shutdown(wait=False, cancel_futures=True)
      worker.source.close()
    _LIVE.discard(self)

  def __enter__(self) -> "WorkerPool":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


_LIVE: "set[WorkerPool]" = set()


def close_all() -> None:
  for pool in list(_LIVE):
    pool.close()


atexit.register(close_all)


def _describe(error: Exception) -> str:
  """One line for a failed call: a gRPC status and its details, or the exception's first line."""
  code = getattr(error, "code", None)
  if callable(code):
    try:
      return f"{code().name}: {' '.join(str(error.details()).split())}"
    except Exception:  # pylint: disable=broad-except
      pass
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"


class PoolRunner(RoundRunner):
  """`RoundRunner` whose chunks run on the workers of a pool, summed on the host in chunk order."""

  def __init__(
    self,
    client_round: Callable,
    shapes: Sequence[tuple[int, ...]],
    clients_per_call: Optional[int],
    pool: WorkerPool,
  ):
    super().__init__(client_round, shapes, clients_per_call)
    self.pool = pool

  def run(
    self, weights: Sequence[np.ndarray], datasets: list, clip: Optional[float] = None
  ) -> RoundResult:
    result = RoundResult(clipped_sum=[np.zeros(s, np.float32) for s in self.shapes])
    if not datasets:
      return result
    chunks = self.chunks(datasets)
    model_weights = self._model_weights(weights)
    # An adaptive clip's round takes ζ_t as a third argument (fedmf.tff.rounds).
    extra = [] if clip is None else [("clip", np.float64(clip))]

    def call(ctx, index: int):
      arg = tff.structure.Struct([("weights", model_weights), ("data", chunks[index]), *extra])
      return ctx.invoke(self.client_round, arg)

    for out in self.pool.map_chunks(call, len(chunks)):  # Chunk order, whoever ran them.
      add_chunk_result(result, out)
    result.finish()
    return result
