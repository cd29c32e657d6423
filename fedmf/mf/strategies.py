"""THE strategy loader shared by every fedmf tool.

One concept: what a strategy file means. A strategy file is a JSON object whose "mechanism" field
names one of the classes below; the class validates its own fields (`from_dict`, one-line
`StrategyError` naming the field) and owns its math (`fedmf.mf.strategy.Strategy`). The CLI, the
accountant, the auditor, the TFF aggregator and the training programs all read strategies through
`load_strategy`, so the noise and the sensitivity always come from the same normalized C.

  {"mechanism": "dpsgd"}
  {"mechanism": "tree", "variant": "vanilla" | "online-honaker" | "full-honaker"}
  {"mechanism": "bandmf", "n": N, "bands": BH, "columns": [[...], ...]}
  {"mechanism": "band-toeplitz", "coefficients": [...], "column_normalized": bool}
  {"mechanism": "blt", "buf_decay": [...], "output_scale": [...]}
  {"mechanism": "dense", "matrix": [[...], ...]}

Keys a mechanism does not read are kept in `metadata` and written back on save.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping, Union

from fedmf import jsonio
from fedmf.mf import resources
from fedmf.mf.banded import BandMF
from fedmf.mf.blt import Blt
from fedmf.mf.dense import Dense
from fedmf.mf.dpsgd import DpSgd
from fedmf.mf.checks import StrategyError, short_repr
from fedmf.mf.strategy import OptimizeOptions, Strategy
from fedmf.mf.toeplitz import BandToeplitz
from fedmf.mf.tree import Tree

__all__ = [
  "BandMF",
  "BandToeplitz",
  "Blt",
  "Dense",
  "DpSgd",
  "Tree",
  "Strategy",
  "StrategyError",
  "OptimizeOptions",
  "MECHANISMS",
  "OPTIMIZABLE",
  "mechanism_class",
  "strategy_from_dict",
  "load_strategy",
  "save_strategy",
  "with_metadata",
]

_CLASSES: dict[str, type[Strategy]] = {
  cls.mechanism: cls for cls in (DpSgd, Tree, BandMF, BandToeplitz, Blt, Dense)
}
MECHANISMS = tuple(_CLASSES)
# Mechanisms `fedmf strategy optimize` can build (a dense C comes from a file).
OPTIMIZABLE = ("dpsgd", "tree", "bandmf", "band-toeplitz", "blt")


def mechanism_class(mechanism: str) -> type[Strategy]:
  """The class of a mechanism name, e.g. 'blt' -> Blt."""
  if mechanism not in _CLASSES:
    raise StrategyError(
      f"strategy field 'mechanism': unknown mechanism {short_repr(mechanism)}; expected one "
      f"of {', '.join(MECHANISMS)}"
    )
  return _CLASSES[mechanism]


def strategy_from_dict(obj: Mapping[str, Any]) -> Strategy:
  """Builds a validated strategy from a dict in the JSON schema of this module's docstring."""
  if not isinstance(obj, Mapping):
    raise StrategyError(f"a strategy must be a JSON object, got {type(obj).__name__}")
  mechanism = obj.get("mechanism")
  if mechanism is None:
    raise StrategyError("strategy field 'mechanism' is missing")
  if not isinstance(mechanism, str):
    raise StrategyError(f"strategy field 'mechanism' must be a string, got {short_repr(mechanism)}")
  return mechanism_class(mechanism).from_dict(obj)


# Parsing JSON takes about 10 bytes of Python objects per byte of numbers in the file.
_JSON_BYTES_PER_FILE_BYTE = 10.0


def load_strategy(source: Union[Strategy, Mapping[str, Any], str, os.PathLike]) -> Strategy:
  """THE loader: a strategy object, a dict in the JSON schema, or a path to a JSON file.

  Every refusal is one `StrategyError` line naming the file and the field: a missing file, a
  directory, unreadable or non-UTF-8 bytes, invalid or too deeply nested JSON, a file too large
  to parse within the memory limit (`fedmf.mf.resources`), or a field that does not validate
  (types, finiteness, ranges and the conditioning of C; see `Strategy.from_dict`).
  """
  if isinstance(source, Strategy):
    return source
  if isinstance(source, Mapping):
    return strategy_from_dict(source)
  if isinstance(source, (str, os.PathLike)):
    path = Path(source)
    try:
      if path.is_dir():
        raise StrategyError(f"strategy file {path} is a directory")
      if not path.is_file():
        raise StrategyError(f"strategy file not found: {path}")
      resources.check_memory(
        _JSON_BYTES_PER_FILE_BYTE * path.stat().st_size,
        "parsing its JSON",
        f"loading strategy file {path}",
      )
      text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
      raise StrategyError(f"strategy file {path} is not UTF-8 text") from None
    except (OSError, ValueError) as e:
      if isinstance(e, StrategyError):
        raise
      raise StrategyError(
        f"cannot read strategy file {path}: {getattr(e, 'strerror', e)}"
      ) from None
    try:
      obj = json.loads(text)
    except json.JSONDecodeError as e:
      raise StrategyError(
        f"strategy file {path} is not valid JSON: {e.msg} at line {e.lineno}"
      ) from None
    except RecursionError:
      raise StrategyError(f"strategy file {path} nests its JSON too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
      raise StrategyError(f"strategy file {path} is not valid JSON: {e}") from None
    try:
      return strategy_from_dict(obj)
    except StrategyError as e:
      raise StrategyError(f"{path}: {e}") from None
    except RecursionError:
      raise StrategyError(f"{path}: a strategy field nests too deeply") from None
  raise StrategyError(f"cannot load a strategy from {type(source).__name__}")


def save_strategy(strategy: Strategy, path: Union[str, os.PathLike], **metadata: Any) -> None:
  """Writes the strategy JSON atomically (temp file + rename), adding `metadata` keys.

  On any failure, an interrupt included, the temporary file is removed and `path` is untouched.
  """
  obj = strategy.to_dict()
  obj.update(metadata)
  from fedmf import atomic_files  # pylint: disable=g-import-not-at-top

  path = Path(path)
  try:
    atomic_files.write_text(path, jsonio.json_text(obj, number_rows=True) + "\n")
  except OSError as e:
    raise StrategyError(f"cannot write strategy file {path}: {e.strerror or e}") from None


def with_metadata(strategy: Strategy, **metadata: Any) -> Strategy:
  return dataclasses.replace(strategy, metadata={**strategy.metadata, **metadata})
