"""Quiet, honest output: what third-party libraries print that says nothing about the run (stdlib only;
used by the CLI and by `fedmf.console`).

* TensorFlow 2.14 prints GPU-probing lines while it is imported ("Unable to register cuDNN
  factory", ...), even with TF_CPP_MIN_LOG_LEVEL=2: `import_tensorflow_quietly` filters exactly
  those lines out of stderr and passes every other line through. Commands call it once their input
  is validated, so a bad flag is refused before the ten-second import.
* TFF 0.87 may print "Exception ignored in ... ServiceManager.__del__" at exit:
  `silence_tff_service_manager`, called by `fedmf.cli.main` when a command ends.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading

# gRPC's fork handlers print "Other threads are currently calling into gRPC, skipping fork()
# handlers" whenever fedmf starts a worker_binary from a process with gRPC threads; the children
# exec at once and never use gRPC across the fork, so the handlers have nothing to do. Read by gRPC
# when it initializes, hence set when this module (imported by the CLI first) is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# TensorFlow 2.14 prints these while it is imported, on every machine without a GPU, whatever
# TF_CPP_MIN_LOG_LEVEL says (the cuDNN/cuFFT/cuBLAS factories register twice); none says anything
# about the run. Matched line by line: any other line of the import passes through unchanged.
_TENSORFLOW_IMPORT_NOISE = re.compile(
  r"Unable to register cu(DNN|FFT|BLAS) factory"
  r"|Could not find cuda drivers on your machine"
  r"|TF-TRT Warning: Could not find TensorRT"
  r"|cpu_feature_guard\.cc"
  r"|rebuild TensorFlow with the appropriate compiler flags"
  r"|oneDNN custom operations are on"
)


def import_tensorflow_quietly() -> None:
  """Imports TensorFlow with its GPU-probing lines removed from stderr (file descriptor 2).

  The lines come from C++ static initializers, so Python's logging cannot reach them: stderr is
  pointed at a pipe for the duration of the import, and a thread passes every other line through.
  A no-op once TensorFlow is imported.
  """
  if "tensorflow" in sys.modules:
    return
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError, AttributeError):  # No usable fd 2 (embedded): import as is.
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

    return
  read_end, write_end = os.pipe()
  captured: list[bytes] = []

  def drain():
    with os.fdopen(read_end, "rb") as pipe:
      captured.append(pipe.read())

  reader = threading.Thread(target=drain, name="fedmf-stderr-filter", daemon=True)
  reader.start()
  os.dup2(write_end, 2)
  os.close(write_end)
  try:
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  finally:
    os.dup2(saved, 2)  # Closes the pipe's last write end: the reader sees EOF.
    os.close(saved)
    reader.join()
    kept = [
      line
      for line in b"".join(captured).decode("utf-8", "replace").splitlines(keepends=True)
      if not _TENSORFLOW_IMPORT_NOISE.search(line)
    ]
    if kept:
      sys.stderr.write("".join(kept))
      sys.stderr.flush()


_SERVICE_MANAGER_QUIET = False


def silence_tff_service_manager() -> None:
  """Keeps TFF 0.87's default context from printing "Exception ignored in ... ServiceManager.__del__
  ... 'NoneType' object has no attribute 'Popen'" at exit.

  `import tensorflow_federated` creates a ServiceManager whose `__del__` reads the `subprocess`
  module; when it is collected during interpreter shutdown that module is already gone. fedmf runs
  its own context (`fedmf.tff.context`), so the manager never started a process: its `__del__` is
  replaced by one that tolerates the shutdown (and still stops a process if one was started).
  """
  global _SERVICE_MANAGER_QUIET
  module = sys.modules.get("tensorflow_federated.python.core.impl.executor_stacks.executor_factory")
  if module is None or _SERVICE_MANAGER_QUIET:
    return
  _SERVICE_MANAGER_QUIET = True  # One scan per process: the manager is made once, on import.
  import gc  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  def quiet_del(self):
    process = getattr(self, "_process", None)
    if isinstance(process, subprocess.Popen):
      try:
        os.kill(process.pid, signal.SIGINT)
        process.wait()
      except (OSError, TypeError, AttributeError):
        pass

  for obj in gc.get_objects():
    cls = type(obj)
    if cls.__name__ == "ServiceManager" and cls.__module__ == module.__name__:
      cls.__del__ = quiet_del
