"""Several local TFF workers: `worker_binary` executor services on 127.0.0.1, owned by fedmf.

One concept: scaling the federated part of a round out on TFF's own runtime. `WorkerPool(W)` starts
W `worker_binary` gRPC services (the C++ executor TFF ships) from the calling thread, each with a
`tff.framework.AsyncExecutionContext` over it. `PoolRunner` spreads a round's chunks of clients over
the workers and adds the chunk sums on the host in chunk order, so the result does not depend on
which worker finishes first (TFF's mergeable context merges in completion order, which is not
bit-reproducible beyond two workers) and equals the in-process result for the same chunks.

Every worker fedmf starts, fedmf stops: on `close()`, at interpreter exit, on the SIGTERM/SIGINT the
CLI turns into exceptions, and on SIGKILL of Python (PR_SET_PDEATHSIG, set in the child; it fires
when the forking thread ends, so workers are started from the main thread). TFF retries a call to
a dead worker forever, so a watchdog thread notices a worker that died and interrupts the program
with SIGTERM; rerunning `fedmf train` resumes from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import threading
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from fedmf.tff import context as context_lib
from fedmf.tff.runner import RoundResult, RoundRunner, add_chunk_result

logger = logging.getLogger("fedmf.workers")


class WorkerPool:
  """W owned `worker_binary` services and one async execution context per worker."""

  def __init__(
    self,
    num_workers: int,
    *,
    default_num_clients: int = 0,
    log_dir: Optional[str] = None,
    watchdog: bool = True,
  ):
    if num_workers < 1:
      raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if threading.current_thread() is not threading.main_thread():
      raise RuntimeError("start TFF workers from the main thread (PR_SET_PDEATHSIG)")
    self._services = []
    self._closing = threading.Event()
    try:
      for i in range(num_workers):
        log_path = None if log_dir is None else os.path.join(log_dir, f"worker-{i}.log")
        service = context_lib._WorkerService(-1, log_path)  # pylint: disable=protected-access
        self._services.append(service)
        service.get_stub()  # Start now, from this (main) thread.
    except BaseException:
      self.close()
      raise
    self.contexts = [
      tff.framework.AsyncExecutionContext(**context_lib.context_kwargs(s, default_num_clients))
      for s in self._services
    ]
    _LIVE.add(self)
    if watchdog:
      threading.Thread(target=self._watch, name="fedmf-worker-watchdog", daemon=True).start()

  def event_loop(self) -> asyncio.AbstractEventLoop:
    """A loop running in a daemon thread, where every call to the workers is awaited."""
    if getattr(self, "_loop", None) is None:
      self._loop = asyncio.new_event_loop()
      threading.Thread(
        target=self._loop.run_forever, name="fedmf-workers-loop", daemon=True
      ).start()
    return self._loop

  @property
  def pids(self) -> list[int]:
    return [s.pid for s in self._services if s.pid is not None]

  def _watch(self) -> None:
    while not self._closing.wait(0.5):
      for i, service in enumerate(self._services):
        proc = service._process  # pylint: disable=protected-access
        if proc is not None and proc.poll() is not None and not self._closing.is_set():
          logger.error(
            "TFF worker %d (pid %d) exited with code %s; stopping the program (rerun "
            "to resume from the last checkpoint)",
            i,
            proc.pid,
            proc.returncode,
          )
          self._closing.set()
          os.kill(os.getpid(), signal.SIGTERM)
          return

  def close(self) -> None:
    self._closing.set()
    loop = getattr(self, "_loop", None)
    if loop is not None:
      loop.call_soon_threadsafe(loop.stop)
      self._loop = None
    for ctx in getattr(self, "contexts", []):
      context_lib.close_executors(ctx)
    for service in self._services:
      service.close()
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


class PoolRunner(RoundRunner):
  """`RoundRunner` whose chunks run concurrently on the workers of a pool, summed in chunk order."""

  def __init__(
    self,
    client_round: Callable,
    shapes: Sequence[tuple[int, ...]],
    clients_per_call: Optional[int],
    pool: WorkerPool,
  ):
    super().__init__(client_round, shapes, clients_per_call)
    self.pool = pool

  async def _worker(self, ctx, weights, chunks: list[tuple[int, list]], out: dict) -> None:
    for index, chunk in chunks:  # One chunk at a time per worker bounds its memory.
      arg = tff.structure.Struct([("weights", weights), ("data", chunk)])
      out[index] = await ctx.invoke(self.client_round, arg)

  async def _run(self, weights, chunks: list[list]) -> dict:
    workers = len(self.pool.contexts)
    assigned = [[(i, c) for i, c in enumerate(chunks) if i % workers == w] for w in range(workers)]
    out: dict = {}
    await asyncio.gather(
      *(
        self._worker(ctx, weights, mine, out)
        for ctx, mine in zip(self.pool.contexts, assigned)
        if mine
      )
    )
    return out

  def run(self, weights: Sequence[np.ndarray], datasets: list) -> RoundResult:
    result = RoundResult(clipped_sum=[np.zeros(s, np.float32) for s in self.shapes])
    if not datasets:
      return result
    chunks = self.chunks(datasets)
    # The pool's own event loop in a thread: callers may themselves run inside asyncio (the
    # training program's logic is async), where asyncio.run would be refused.
    future = asyncio.run_coroutine_threadsafe(
      self._run(self._model_weights(weights), chunks), self.pool.event_loop()
    )
    outputs = future.result()
    for index in range(len(chunks)):  # Chunk order, whatever finished first.
      add_chunk_result(result, outputs[index])
    result.finish()
    return result


def default_clients_per_call(clients_per_round: int, workers: int, cap: Optional[int]) -> int:
  """Chunks small enough to give every worker work, and at most `cap` clients each."""
  size = -(-clients_per_round // max(workers, 1))
  return max(1, min(size, cap) if cap else size)
