"""Reading a YAML config file into a mapping, with one-line errors (both config loaders use it).

A key given twice in one mapping is refused with both lines (PyYAML would keep the last value
silently), the same rule as a key given twice on the command line (`fedmf.config_parse`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class _DuplicateKey(Exception):
  def __init__(self, key: Any, first: int, again: int):
    super().__init__(f"key {key!r} is given twice (lines {first} and {again})")


def _unique_key_loader():
  """A SafeLoader whose mappings refuse a repeated key (merge keys `<<` excepted)."""
  import yaml  # pylint: disable=g-import-not-at-top

  class UniqueKeyLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    pass

  def construct_mapping(loader, node, deep=False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
      if key_node.tag == "tag:yaml.org,2002:merge":
        continue
      key = loader.construct_object(key_node, deep=True)
      line = key_node.start_mark.line + 1
      try:
        if key in seen:
          raise _DuplicateKey(key, seen[key], line)
        seen[key] = line
      except TypeError:  # an unhashable key: the base constructor refuses it
        continue
    return yaml.SafeLoader.construct_mapping(loader, node, deep)

  UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
  return UniqueKeyLoader


def read_mapping(path: str | os.PathLike, error: type[Exception]) -> dict[str, Any]:
  """The mapping a YAML file holds ({} for an empty file); a missing, unreadable or malformed file,
  one holding something other than a mapping, or a key given twice raises `error` with one line
  naming the file."""
  import yaml  # pylint: disable=g-import-not-at-top  (only the config loaders need PyYAML)

  path = Path(path)
  if not path.is_file():
    raise error(f"config file not found: {path}")
  try:
    obj = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader())  # noqa: S506
  except _DuplicateKey as e:
    raise error(f"config file {path}: {e}") from None
  except (yaml.YAMLError, UnicodeDecodeError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise error(f"config file {path} is not valid YAML: {first}") from None
  except OSError as e:
    raise error(f"config file {path} cannot be read: {e.strerror or e}") from None
  except RecursionError:
    raise error(f"config file {path} is nested too deeply") from None
  if obj is None:
    return {}
  if not isinstance(obj, dict):
    raise error(f"config file {path} must hold a mapping of keys, got {type(obj).__name__}")
  return obj
