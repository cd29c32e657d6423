"""How many threads each TensorFlow op of a local TFF worker may use.

One concept: the environment fedmf gives a `worker_binary` it starts. TFF's worker runs the
clients of one call concurrently, and by default every op of every client may use all cores
(TF's intra-op pool). When a call holds at least as many clients as there are cores, the clients
already keep every core busy, and splitting each op across threads only adds synchronization: on
the 2-core machine of docs/benchmarks.md §4, one intra-op thread took 0.89-0.90× the CPU time
and the wall time of TF's default for rounds of 10 `lstm-paper` clients. With fewer clients per
call than cores, one thread per op would leave cores idle, so TF's default stays.

The thread count does not change the model: TF's float32 matmuls and reductions gave bit-identical
weights with 1 and 2 intra-op threads (tests/tff/test_worker_threads.py checks a round).

A `TF_NUM_INTRAOP_THREADS` the user has set is left as it is (the worker inherits it). `fedmf
worker` services on other hosts start their own worker, with their host's environment.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

INTRA_OP = "TF_NUM_INTRAOP_THREADS"


def usable_cores() -> int:
  """The cores this process may run on (its CPU affinity, not the machine's count)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def worker_environment(
  concurrent_clients: Optional[int],
  environ: Mapping[str, str] = os.environ,
  cores: Optional[int] = None,
) -> dict[str, str]:
  """The variables to add to a local worker's environment (empty: TF's defaults).

  Args:
    concurrent_clients: the clients one TFF call runs at once (None: unknown).
    environ: the environment the worker would inherit.
    cores: the cores the worker may use (default: `usable_cores()`).
  """
  if INTRA_OP in environ or concurrent_clients is None:
    return {}
  if concurrent_clients < (cores or usable_cores()):
    return {}
  return {INTRA_OP: "1"}
