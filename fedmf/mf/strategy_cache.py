"""The on-disk cache of optimized strategies, keyed by mechanism, schema and options.

The training program (fedmf/program/plan.py) and the band choice of `fedmf strategy optimize
--bands auto` share it, so a strategy optimized by one is found by the other for the same (n, b, k)
and options. A cache that cannot
be read or written is skipped (with a log line), never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.mf import strategies
from fedmf.mf.schema import ParticipationSchema
from fedmf.mf.strategy import OptimizeOptions, Strategy

logger = logging.getLogger(__name__)

# Bump when an optimizer changes what it returns, so stale cached strategies are not reused.
CACHE_VERSION = 1


def cache_dir() -> Path:
  """Where optimized strategies are cached: $FEDMF_CACHE_DIR, else ~/.cache/fedmf/strategies."""
  base = os.environ.get("FEDMF_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fedmf"
  )
  return Path(base) / "strategies"


def cache_path(
  mechanism: str, schema: ParticipationSchema, options: OptimizeOptions, cache: Path
) -> Path:
  key = {
    "version": CACHE_VERSION,
    "mechanism": mechanism,
    **schema.to_dict(),
    "bands": options.bands,
    "buffers": options.buffers,
    "seed": options.seed,
  }
  if options.max_iter is not None:  # A reduced budget must not be served for the default one.
    key["max_iter"] = options.max_iter
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
  return cache / f"{mechanism}-n{schema.n}-b{schema.min_sep}-{digest}.json"


def optimize_cached(
  mechanism: str,
  schema: ParticipationSchema,
  options: OptimizeOptions,
  cache: Optional[Path],
) -> Strategy:
  """The cached strategy for (mechanism, schema, options), else optimized now and cached."""
  path = None if cache is None else cache_path(mechanism, schema, options, cache)
  if path is not None and path.is_file():
    try:
      strategy = strategies.load_strategy(path)
      logger.info("using the cached %s strategy %s", strategy.describe(), path)
      return strategy
    except FedmfUserError:
      logger.warning("ignoring the unreadable cached strategy %s", path)
  cls = strategies.mechanism_class(mechanism)
  action = f"optimizing {mechanism} for {schema}"
  resources.check(cls.optimize_cost(schema, options), action)
  with resources.time_limit(action):  # The optimizer's iterations check the clock.
    strategy, _ = cls.optimize(schema, options)
  if path is not None:
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      strategies.save_strategy(
        strategy,
        path,
        optimized_for={
          "n": schema.n,
          "min_sep": schema.min_sep,
          "max_participations": schema.max_participations,
          "workload": "prefix",
        },
      )
    except (OSError, FedmfUserError) as e:  # A read-only cache is not a reason to fail.
      logger.warning("could not cache the strategy in %s: %s", path, e)
  return strategy
