"""Reading a YAML config file into a mapping, with one-line errors (both config loaders use it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_mapping(path: str | os.PathLike, error: type[Exception]) -> dict[str, Any]:
  """The mapping a YAML file holds ({} for an empty file); a missing, unreadable or malformed file,
  or one holding something other than a mapping, raises `error` with one line naming the file."""
  import yaml  # pylint: disable=g-import-not-at-top  (only the config loaders need PyYAML)

  path = Path(path)
  if not path.is_file():
    raise error(f"config file not found: {path}")
  try:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
  except (yaml.YAMLError, UnicodeDecodeError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise error(f"config file {path} is not valid YAML: {first}") from None
  except OSError as e:
    raise error(f"config file {path} cannot be read: {e.strerror or e}") from None
  if obj is None:
    return {}
  if not isinstance(obj, dict):
    raise error(f"config file {path} must hold a mapping of keys, got {type(obj).__name__}")
  return obj
