"""One voice on the console: keep TensorFlow, absl and matplotlib from talking (issue 26, C.8).

`fedmf` commands print only their own lines. A script of yours that imports `fedmf.tff` (or
TensorFlow) gets the same with one call, made before that import:

  import fedmf.console
  fedmf.console.quiet_tensorflow()
  import fedmf.tff

It hides TensorFlow's start-up lines (GPU probing, CPU features), TensorFlow's and absl's INFO
lines (e.g. "Assets written to ..." at every SavedModel checkpoint) and matplotlib's INFO lines;
warnings and errors still show. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import logging
import os

# Loggers whose INFO lines say nothing about a run (their warnings and errors still show).
CHATTY_LOGGERS = ("tensorflow", "absl", "matplotlib", "h5py")


def quiet_loggers(level: int = logging.WARNING) -> None:
  """Raises the third-party loggers of CHATTY_LOGGERS to `level`."""
  for name in CHATTY_LOGGERS:
    logging.getLogger(name).setLevel(level)


def quiet_tensorflow() -> None:
  """Imports TensorFlow without its start-up lines and quiets the chatty loggers (see above)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  quiet_loggers()
  from fedmf import quiet  # pylint: disable=g-import-not-at-top

  quiet.import_tensorflow_quietly()
  import absl.logging  # pylint: disable=g-import-not-at-top

  absl.logging.set_verbosity(absl.logging.WARNING)
