"""Shared checks of the strategy modules: the error type and the field validation of `from_dict`.

Every strategy module, the noise streams and the loader raise `StrategyError` (a FedmfUserError:
one line naming the field, exit 2 in the CLI), so it lives below all of them.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, Mapping

import numpy as np

from fedmf.errors import FedmfUserError


class StrategyError(FedmfUserError):
  """A strategy that does not validate or cannot do what was asked (one line naming the field)."""


# ---------------------------------------------------------------------------------------------
# Field validation for `from_dict`: each check raises StrategyError naming the field.


# The largest round count a strategy field may hold: rounds are counted in int64 (TF state).
MAX_ROUNDS = 2**63 - 1


def short_repr(value: Any, limit: int = 40) -> str:
  """A value as the user wrote it, in one short line: JSON's null/true/false and lists as in the
  file (never Python's None), shortened for huge integers and long containers."""
  if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
    return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
  text = repr(value)
  if value is None or isinstance(value, (bool, list, tuple, dict)):
    try:
      text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):  # not JSON (a set, a deep list): as Python
      pass
  text = " ".join(text.split())  # one line
  return text if len(text) <= limit else text[: limit - 3] + "..."


def readonly(values: Any, dtype=np.float64) -> np.ndarray:
  array = np.array(values, dtype=dtype)
  array.setflags(write=False)
  return array


def float_array(value: Any, what: str, ndim: int) -> np.ndarray:
  """`value` as a finite float64 array of `ndim` dimensions; StrategyError naming `what` otherwise.

  Huge JSON integers (np.asarray raises OverflowError) and 1e400 (json reads it as inf) are refused
  here, with the index of the first bad entry.
  """
  kind = "a list of numbers" if ndim == 1 else "a list of lists of numbers"
  if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
    raise StrategyError(f"{what} must be {kind}, got {short_repr(value)}")
  try:
    array = np.asarray(value, dtype=np.float64)
  except OverflowError:
    raise StrategyError(f"{what} has a number too large for float64") from None
  except (TypeError, ValueError, RecursionError):
    raise StrategyError(f"{what} must be {kind}") from None
  if array.ndim != ndim:
    flat = "a flat list of numbers" if ndim == 1 else "a square list of lists of numbers"
    raise StrategyError(f"{what} must be {flat}, got shape {array.shape}")
  bad = np.argwhere(~np.isfinite(array))
  if bad.size:
    index = ", ".join(str(int(i)) for i in bad[0])
    raise StrategyError(
      f"{what} has a non-finite value {array[tuple(bad[0])]} at index {index} "
      f"(numbers beyond ±1.8e308, such as 1e400, read as infinite)"
    )
  return array


def float_vector(obj: Mapping[str, Any], key: str, *, min_len: int = 1) -> np.ndarray:
  if key not in obj:
    raise StrategyError(f"strategy field '{key}' is missing")
  array = float_array(obj[key], f"strategy field '{key}'", 1)
  if len(array) < min_len:
    raise StrategyError(
      f"strategy field '{key}' needs at least {min_len} entries, got {len(array)}"
    )
  return array


def positive_int(obj: Mapping[str, Any], key: str) -> int:
  if key not in obj:
    raise StrategyError(f"strategy field '{key}' is missing")
  value = obj[key]
  whole = None
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    whole = int(value)
  elif isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
    whole = int(value)
  if whole is None or not 1 <= whole <= MAX_ROUNDS:
    raise StrategyError(
      f"strategy field '{key}' must be an integer in [1, 2^63 - 1], got {short_repr(value)}"
    )
  return whole


# Keys a strategy file may hold besides its mechanism's fields: what fedmf writes about how it was
# made (`fedmf strategy optimize`, the plan cache), and a free-text note.
METADATA_FIELDS = ("optimized_for", "loss", "optimizer_seconds", "band_choice", "note")


def extra_fields(obj: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
  """The metadata keys of `obj` (kept and written back); any other unknown key is refused, as a
  config file refuses one: a misspelt field would otherwise be ignored silently."""
  extra = {k: v for k, v in obj.items() if k not in known and k != "mechanism"}
  unknown = [k for k in extra if k not in METADATA_FIELDS]
  if unknown:
    import difflib  # pylint: disable=g-import-not-at-top

    close = difflib.get_close_matches(str(unknown[0]), list(known) + list(METADATA_FIELDS), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise StrategyError(
      f"unknown strategy field {short_repr(unknown[0])}{hint} for mechanism "
      f"{short_repr(obj.get('mechanism'))}; its fields: {', '.join(known) or 'none'}; metadata: "
      f"{', '.join(METADATA_FIELDS)}"
    )
  return extra


def check_lower_triangular(c: np.ndarray, what: str) -> None:
  """A streamable C is lower triangular with a non-zero diagonal (C⁻¹ exists)."""
  if np.any(np.triu(c, 1) != 0.0):
    raise StrategyError(f"{what} must be lower triangular")
  zero = np.flatnonzero(np.diag(c) == 0.0)
  if zero.size:
    raise StrategyError(f"{what} has a zero diagonal entry at index {zero[0]}")
