"""The statistics of a participation log (``LogStatistics``, ``ViolationTable``) and the choice of
the engine that counts them: the one place that dispatches.

A log in round order (as ``ParticipationLogWriter`` writes it) takes the one-pass scan
(``fedmf.privacy.log_scan``: memory grows with the clients and rounds, not the rows); any other is
counted by one sort of (client, round) keys (``fedmf.privacy.log_sort``). Same results either way.
``statistics_of_arrays`` counts a log already in memory, ``statistics_of_file`` streams a file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.privacy import log_scan
from fedmf.privacy import log_sort
from fedmf.privacy import participation_log

logger = logging.getLogger(__name__)

DEFAULT_VIOLATION_LIMIT = 10_000
_SCAN_CHUNK_ROWS = 1 << 20


def _prefetched(items, depth: int = 3):
  """Iterates ``items`` with a background thread computing up to ``depth`` items ahead.

  Exceptions of the producer are re-raised here; leaving the loop early stops the producer.
  """
  import contextvars  # pylint: disable=g-import-not-at-top
  import queue  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  buffer: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()
  done = object()

  def produce():
    try:
      for item in items:
        while not stop.is_set():
          try:
            buffer.put((item, None), timeout=0.1)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
      buffer.put((done, None))
    except BaseException as e:  # pylint: disable=broad-except
      buffer.put((done, e))
    finally:
      if hasattr(items, "close"):
        items.close()  # Closes the log file now, not when garbage collected.

  # In the caller's context: the reader's --max-seconds clock (a context variable) goes along.
  context = contextvars.copy_context()
  worker = threading.Thread(
    target=context.run, args=(produce,), name="fedmf-log-reader", daemon=True
  )
  worker.start()
  try:
    while True:
      item, error = buffer.get()
      if item is done:
        if error is not None:
          raise error
        return
      yield item
  finally:
    stop.set()
    while worker.is_alive():  # Unblock a producer waiting on a full buffer.
      try:
        buffer.get(timeout=0.1)
      except queue.Empty:
        pass
    worker.join()


def statistics_of_arrays(
  rounds: np.ndarray,
  codes: np.ndarray,
  num_clients: int,
  declared_min_sep: Optional[int] = None,
  declared_max_participations: Optional[int] = None,
  client_ids: Any = None,
  *,
  violation_limit: Optional[int] = None,
):
  """Statistics and violations of a log given as rounds + client codes (``ParticipationArrays``).

  Rows in round order (as the log writer produces them) take the one-pass ``LogScan``; other logs
  one sort of (code, round) keys. Same results either way.

  Args:
    violation_limit: List at most this many violation entries (all when None); all are counted.

  Returns:
    (LogStatistics, ViolationTable). Violations name clients through ``client_ids[code]``
    (a pyarrow array or sequence; codes themselves when None).
  """
  rows = int(rounds.shape[0])
  if rows == 0:
    raise participation_log.ParticipationLogError("empty log (no participation rows)")

  def chunks():
    for lo in range(0, rows, _SCAN_CHUNK_ROWS):
      yield rounds[lo : lo + _SCAN_CHUNK_ROWS], codes[lo : lo + _SCAN_CHUNK_ROWS]

  scan = log_scan.LogScan(declared_min_sep, declared_max_participations, violation_limit)
  try:
    for r, c in chunks():
      scan.update(r, c)
  except log_scan.NotRoundOrdered:
    stats, table = log_sort.sorted_statistics(
      rounds, codes, num_clients, declared_min_sep, declared_max_participations, client_ids
    )
    return stats, table.limited(violation_limit)
  return scan.finish(num_clients, client_ids, reread=chunks)


def statistics_of_file(
  path: str | os.PathLike[str],
  *,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  violation_limit: Optional[int] = DEFAULT_VIOLATION_LIMIT,
  progress: bool = False,
):
  """(LogStatistics, ViolationTable) of a log file, streamed (memory: clients + rounds).

  One pass when the rows are in round order (as ``ParticipationLogWriter`` writes them), plus a
  second pass only if a listed violator's rows were not kept (``LogScan``); a log out of round order
  is read whole into arrays and sorted instead (about 16 bytes a row).
  """
  path = os.fspath(path)
  index = participation_log.ClientIndex()
  end = participation_log.LogTail()
  scan = log_scan.LogScan(min_sep, max_participations, violation_limit)
  # Reading and coding the ids (one thread) overlap the scan (this one): both are Arrow and numpy
  # kernels, which release the GIL.
  batches = _prefetched(participation_log.iter_participation_codes(path, index, progress, end))
  try:
    try:
      for rounds, codes in batches:
        scan.update(rounds, codes, len(index))
    finally:
      batches.close()  # Stops the reader thread now, not when the traceback is dropped.
    stats, table = scan.finish(
      len(index),
      index.client_ids(),
      reread=lambda: participation_log.iter_participation_codes(path, index, progress),
    )
    cut_off_row = end.cut_off_row
  except log_scan.NotRoundOrdered:
    logger.info("%s is not in round order: sorting it in memory", path)
    arrays = participation_log.read_participation_arrays(path, progress=progress)
    stats, table = log_sort.sorted_statistics(
      arrays.rounds,
      arrays.codes,
      len(arrays.client_ids),
      min_sep,
      max_participations,
      arrays.client_ids,
    )
    table = table.limited(violation_limit)
    cut_off_row = arrays.cut_off_row
  except FedmfUserError as e:
    if str(e).startswith(path):
      raise
    raise type(e)(f"{path}: {e}") from None
  if cut_off_row is not None:
    stats = dataclasses.replace(stats, cut_off_row=cut_off_row)
  return stats, table
