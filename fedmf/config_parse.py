"""THE config parser of every fedmf command: `--set KEY=VALUE` overrides, scalar values, one error.

One concept: turning what a user typed (a YAML file's values, `--set` overrides) into typed values,
or one line naming the key. Both config systems use it: `fedmf simulate` / `fedmf train`
(`fedmf.program.config`, keys in sections) and `fedmf public-features`
(`fedmf.public_features.config`, flat keys).

Semantics, the same everywhere:

* `--set KEY=VALUE`: VALUE is one YAML scalar (`--set epsilon=1e-8`, `--set federated=true`,
  `--set noise_seed=null`); a mapping or a list is refused (except keys that take a list).
* `--set KEY=` (nothing after `=`) sets KEY to null, as `KEY:` with no value in a YAML file: a key
  that may be unset (a noise seed, a noise multiplier to be calibrated) is unset, any other key
  refuses null naming itself.
* A key given twice on the command line is refused, also when written once by its flat name and
  once by its section (`--set delta=1e-8 --set privacy.delta=1e-7`), as a YAML file refuses a key
  given twice (`fedmf.yaml_files`).
* `--set rounds 10` (the `=` forgotten) is refused at parse time: `--set` takes KEY=VALUE
  (`override_argument`, the argparse `type` of every `--set`).
* Numbers: YAML 1.1 reads `1e-8` (no dot) as a string; a float key takes it as the number. An
  integer key takes an integral float (`1e3`). Non-finite floats are refused unless the key
  allows infinity (`fedmf public-features`' `epsilon: inf`, the non-private reference).

Layer 0: the standard library, and PyYAML imported inside the functions that parse.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Collection, Sequence
from typing import Any

from fedmf.errors import FedmfUserError


class ConfigError(FedmfUserError):
  """A configuration that does not validate (one line naming the key)."""


def shown(value: Any) -> str:
  """A config value as the user wrote it in YAML: null, true, [1, 2] (never Python's None)."""
  if value is None or isinstance(value, (bool, list, tuple, dict)):
    try:
      text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
      text = repr(value)
  else:
    text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def override_argument(text: str) -> str:
  """The argparse `type` of `--set`: refuses a value without `=` when the command line is parsed,
  so `--set rounds 10` says what `--set` takes instead of "unrecognized arguments: 10"."""
  if "=" not in text:
    key = text.strip() or "KEY"
    raise argparse.ArgumentTypeError(
      f"takes KEY=VALUE, got {text[:40]!r}: write --set {key[:40]}=VALUE"
    )
  return text


def give_way(base: Sequence[str], overrides: Sequence[str]) -> list[str]:
  """`--set` items: `base` without the keys that `overrides` sets, then `overrides` (keys compared
  as written). For a script's or a test's own settings under the user's, since the command line
  refuses a key given twice."""
  given = {item.partition("=")[0].strip() for item in overrides}
  return [item for item in base if item.partition("=")[0].strip() not in given] + list(overrides)


def parse_override(text: str, list_keys: Collection[str] = ()) -> tuple[list[str], Any]:
  """'participation.min_sep=20' -> (['participation', 'min_sep'], 20); the value is a YAML scalar,
  null when nothing follows `=`. A list is taken only for a key in `list_keys`."""
  import yaml  # pylint: disable=g-import-not-at-top

  key, sep, raw = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"--set expects KEY=VALUE, got {text!r}")
  try:
    value = yaml.safe_load(raw) if raw.strip() else None
  except yaml.YAMLError:
    value = raw
  if isinstance(value, dict) or isinstance(value, list) and key.strip() not in list_keys:
    raise ConfigError(f"--set {key}: expected a single value, got {raw!r}")
  return key.strip().split("."), value


def parse_overrides(
  texts: Sequence[str],
  canonical: Callable[[list[str]], Sequence[str]] = tuple,
  list_keys: Collection[str] = (),
) -> list[tuple[list[str], list[str], Any]]:
  """Every `--set` as (path as written, canonical path, value), in order; a key given twice (the
  same canonical path, however written) is refused, naming both spellings."""
  seen: dict[tuple[str, ...], str] = {}
  out = []
  for text in texts:
    written, value = parse_override(text, list_keys)
    path = list(canonical(written))
    name = ".".join(written)
    if tuple(path) in seen:
      first = seen[tuple(path)]
      also = "" if first == name else f" (also as --set {first})"
      raise ConfigError(f"--set {name} is given twice{also}: give each key once")
    seen[tuple(path)] = name
    out.append((written, path, value))
  return out


def coerce(key: str, value: Any, kind: type, *, infinite: bool = False) -> Any:
  """`value` as `kind` (bool, int, float or str), or a ConfigError naming `key`. `infinite`: a
  float key that takes ±inf (NaN never)."""
  if kind is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"{key} must be true or false, got {shown(value)}")
  if kind is int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be an integer, got {shown(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
      raise ConfigError(f"{key} must be an integer, got {shown(value)}")
    return int(value)
  if kind is float:
    if isinstance(value, str):  # YAML 1.1 reads '1e-8' (no dot) as a string.
      try:
        value = float(value)
      except ValueError:
        raise ConfigError(f"{key} must be a number, got {shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be a number, got {shown(value)}")
    try:
      value = float(value)
    except OverflowError:  # an integer beyond float range (10**400)
      raise ConfigError(f"{key} must be finite, got {shown(value)}") from None
    if math.isnan(value) or (math.isinf(value) and not infinite):
      raise ConfigError(f"{key} must be finite, got {shown(value)}")
    return value
  if kind is str:
    if not isinstance(value, str):
      raise ConfigError(f"{key} must be a string, got {shown(value)}")
    return value
  raise TypeError(f"unsupported config type {kind!r} for {key}")
