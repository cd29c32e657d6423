"""Where a run's TFF computations execute: one local worker, W local workers, or remote workers.

One concept: the execution platform of `fedmf simulate` and `fedmf train`, from the config keys
`workers`, `worker_tls`, `worker_timeout_s` and `worker_isolation` (docs/scaling.md). Every local
`worker_binary` runs in a network namespace of its own, reached through a 0600 Unix socket
(`fedmf.tff.sandbox`); remote workers are `fedmf worker` services reached over mutual TLS. The
round's chunks of clients are the same whatever the platform (`clients_per_call`), so the model is
bit-identical on each.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

from fedmf.program.config_sections import PlatformConfig

logger = logging.getLogger("fedmf.platform")


@contextlib.contextmanager
def execution(
  platform: PlatformConfig,
  log_dir: Optional[str] = None,
  concurrent_clients: Optional[int] = None,
) -> Iterator[object]:
  """Installs the TFF execution context `platform` names; yields the `WorkerPool` (None for one
  local worker). Local workers run one intra-op thread per op when `concurrent_clients` (the
  clients of one TFF call) fill the cores (`fedmf.tff.worker_threads`)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  from fedmf.tff import context as context_lib  # pylint: disable=g-import-not-at-top
  from fedmf.tff import workers as workers_lib  # pylint: disable=g-import-not-at-top
  from fedmf.tff import worker_threads  # pylint: disable=g-import-not-at-top

  env = worker_threads.worker_environment(concurrent_clients)
  if env:
    logger.info("local TFF workers run one intra-op thread per op (%s=1)", worker_threads.INTRA_OP)
  if platform.workers == 0:
    with context_lib.local_execution_context(isolation=platform.worker_isolation, worker_env=env):
      yield None
    return
  pool = workers_lib.WorkerPool(
    platform.workers,
    tls=platform.tls_files,
    timeout_s=platform.worker_timeout_s,
    isolation=platform.worker_isolation,
    log_dir=log_dir,
    worker_env=env,
  )
  try:
    # Computations are built (not run) in a context; the first worker's serves, so that TFF's own
    # default context, which would start an exposed worker_binary, is never used.
    with tff.framework.get_context_stack().install(pool.workers[0].context):
      yield pool
  finally:
    pool.close()


def round_runner(runner, clients_per_round: int, pool):
  """The runner that trains a round's chunks of clients: `runner` (in process, one local worker)
  without a pool, else the same chunks on the pool's workers (`fedmf.tff.workers.PoolRunner`)."""
  if pool is None:
    return runner
  from fedmf.tff import workers as workers_lib  # pylint: disable=g-import-not-at-top

  chunks = -(-clients_per_round // (runner.clients_per_call or clients_per_round))
  if chunks < len(pool.workers):
    logger.warning(
      "%d chunk(s) of clients per round for %d workers: some workers stay idle; set "
      "clients_per_call <= %d to use them all (it changes the float sums, so it is part of the "
      "run, not of the platform)",
      chunks,
      len(pool.workers),
      max(1, clients_per_round // len(pool.workers)),
    )
  return workers_lib.PoolRunner(runner.client_round, runner.shapes, runner.clients_per_call, pool)
