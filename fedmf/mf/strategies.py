"""Strategy objects and THE strategy loader shared by every fedmf tool.

One concept: what a strategy file means. A strategy is a frozen dataclass naming a correlated-noise
mechanism and its parameters; `load_strategy` turns a dict, a JSON file or an object into one,
validating every field with a one-line error that names it. The CLI, the accountant, the auditor
and the TFF aggregator all read strategies through `load_strategy`, and all obtain the matrix C
through `strategy_matrix` / `banded_theta`, so the noise and the sensitivity always come from the
same normalized C.

Notation follows docs/architecture.md: n rounds, C the strategy, b̂ = `bands`,
θ = `buf_decay`, ω = `output_scale`.

JSON schema (issue 5; extra keys are kept in `metadata`):
  {"mechanism": "dpsgd"}
  {"mechanism": "tree", "variant": "vanilla" | "online-honaker" | "full-honaker"}
  {"mechanism": "bandmf", "n": N, "bands": BH, "columns": [[...], ...]}
      columns[j] = column j of C from the diagonal down, min(bands, n-j) entries, possibly
      unnormalized; C is used column-normalized (002 §3.1). A file built for n serves any n' <= n
      through its leading n'×n' block, normalized at n'.
  {"mechanism": "band-toeplitz", "coefficients": [...], "column_normalized": bool}
      C = LtToep(coefficients) with len(coefficients) bands; `column_normalized` means columns are
      normalized at the evaluation n (then C is no longer Toeplitz).
  {"mechanism": "blt", "buf_decay": [...], "output_scale": [...]}
      C = LtToep(c), c_0 = 1, c_i = Σ_j ω_j θ_j^{i-1} (001 §2), θ distinct in (0, 1), ω >= 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar, Mapping, Union

import numpy as np

from fedmf.errors import FedmfUserError

MECHANISMS = ("dpsgd", "tree", "bandmf", "band-toeplitz", "blt")
TREE_VARIANTS = ("vanilla", "online-honaker", "full-honaker")


class StrategyError(FedmfUserError):
  """A strategy that does not validate. The message is one line naming the field."""


def _readonly(values: Any, dtype=np.float64) -> np.ndarray:
  array = np.array(values, dtype=dtype)
  array.setflags(write=False)
  return array


@dataclasses.dataclass(frozen=True, eq=False)
class DpSgd:
  """DP-SGD / DP-FedAvg: C = I, independent noise every round."""

  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "dpsgd"


@dataclasses.dataclass(frozen=True, eq=False)
class Tree:
  """Binary-tree aggregation; `variant` names the decoder (mechanisms.md, TreeAgg)."""

  variant: str = "online-honaker"
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "tree"


@dataclasses.dataclass(frozen=True, eq=False)
class BandMF:
  """Column-normalized b̂-banded C over `n` rounds; `theta[r, j]` = raw C[j+r, j] (zero off range)."""

  n: int
  bands: int
  theta: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "bandmf"

  @property
  def columns(self) -> list[list[float]]:
    return [self.theta[: min(self.bands, self.n - j), j].tolist() for j in range(self.n)]


@dataclasses.dataclass(frozen=True, eq=False)
class BandToeplitz:
  """C = LtToep(coefficients), banded to len(coefficients), optionally column-normalized at n."""

  coefficients: np.ndarray
  column_normalized: bool = False
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "band-toeplitz"

  @property
  def bands(self) -> int:
    return len(self.coefficients)


@dataclasses.dataclass(frozen=True, eq=False)
class Blt:
  """Buffered linear Toeplitz C with buffer decays θ and output scales ω (001 §2)."""

  buf_decay: np.ndarray
  output_scale: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "blt"

  @property
  def num_buffers(self) -> int:
    return len(self.buf_decay)


Strategy = Union[DpSgd, Tree, BandMF, BandToeplitz, Blt]
STRATEGY_TYPES = (DpSgd, Tree, BandMF, BandToeplitz, Blt)


# ---------------------------------------------------------------------------------------------
# Validation helpers: each raises StrategyError naming the field.


def _float_vector(obj: Mapping[str, Any], key: str, *, min_len: int = 1) -> np.ndarray:
  if key not in obj:
    raise StrategyError(f"strategy field '{key}' is missing")
  value = obj[key]
  if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
    raise StrategyError(f"strategy field '{key}' must be a list of numbers")
  try:
    array = np.asarray(value, dtype=np.float64)
  except (TypeError, ValueError):
    raise StrategyError(f"strategy field '{key}' must be a list of numbers") from None
  if array.ndim != 1:
    raise StrategyError(f"strategy field '{key}' must be a flat list of numbers, got shape {array.shape}")
  if len(array) < min_len:
    raise StrategyError(f"strategy field '{key}' needs at least {min_len} entries, got {len(array)}")
  bad = np.flatnonzero(~np.isfinite(array))
  if bad.size:
    raise StrategyError(f"strategy field '{key}' has a non-finite value at index {bad[0]}")
  return array


def _positive_int(obj: Mapping[str, Any], key: str) -> int:
  if key not in obj:
    raise StrategyError(f"strategy field '{key}' is missing")
  value = obj[key]
  if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
    raise StrategyError(f"strategy field '{key}' must be a positive integer, got {value!r}")
  return int(value)


def _validate_blt(buf_decay: np.ndarray, output_scale: np.ndarray) -> None:
  if len(buf_decay) != len(output_scale):
    raise StrategyError(
        f"strategy fields 'buf_decay' and 'output_scale' must have equal length, got "
        f"{len(buf_decay)} and {len(output_scale)}")
  outside = np.flatnonzero((buf_decay <= 0) | (buf_decay >= 1))
  if outside.size:
    i = outside[0]
    raise StrategyError(f"strategy field 'buf_decay' must lie in (0, 1), got {buf_decay[i]!r} at index {i}")
  if len(np.unique(buf_decay)) != len(buf_decay):
    raise StrategyError("strategy field 'buf_decay' must have distinct values")
  negative = np.flatnonzero(output_scale < 0)
  if negative.size:
    i = negative[0]
    raise StrategyError(f"strategy field 'output_scale' must be >= 0, got {output_scale[i]!r} at index {i}")


def _metadata(obj: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
  return {k: v for k, v in obj.items() if k not in known and k != "mechanism"}


def strategy_from_dict(obj: Mapping[str, Any]) -> Strategy:
  """Builds a validated strategy from a dict in the JSON schema of this module's docstring."""
  if not isinstance(obj, Mapping):
    raise StrategyError(f"a strategy must be a JSON object, got {type(obj).__name__}")
  mechanism = obj.get("mechanism")
  if mechanism is None:
    raise StrategyError("strategy field 'mechanism' is missing")
  if mechanism not in MECHANISMS:
    raise StrategyError(f"strategy field 'mechanism': unknown mechanism {mechanism!r}; expected one of {', '.join(MECHANISMS)}")

  if mechanism == "dpsgd":
    return DpSgd(metadata=_metadata(obj, ()))

  if mechanism == "tree":
    variant = obj.get("variant", "online-honaker")
    if variant not in TREE_VARIANTS:
      raise StrategyError(f"strategy field 'variant': unknown tree variant {variant!r}; expected one of {', '.join(TREE_VARIANTS)}")
    return Tree(variant=variant, metadata=_metadata(obj, ("variant",)))

  if mechanism == "blt":
    buf_decay = _float_vector(obj, "buf_decay")
    output_scale = _float_vector(obj, "output_scale")
    _validate_blt(buf_decay, output_scale)
    return Blt(_readonly(buf_decay), _readonly(output_scale), metadata=_metadata(obj, ("buf_decay", "output_scale")))

  if mechanism == "band-toeplitz":
    coefficients = _float_vector(obj, "coefficients")
    if coefficients[0] == 0:
      raise StrategyError("strategy field 'coefficients': the diagonal coefficient coefficients[0] must be non-zero")
    normalized = obj.get("column_normalized", False)
    if not isinstance(normalized, bool):
      raise StrategyError(f"strategy field 'column_normalized' must be true or false, got {normalized!r}")
    return BandToeplitz(_readonly(coefficients), normalized,
                        metadata=_metadata(obj, ("coefficients", "column_normalized")))

  # bandmf
  n = _positive_int(obj, "n")
  bands = _positive_int(obj, "bands")
  if bands > n:
    raise StrategyError(f"strategy field 'bands' ({bands}) must not exceed 'n' ({n})")
  columns = obj.get("columns")
  if columns is None:
    raise StrategyError("strategy field 'columns' is missing")
  if isinstance(columns, np.ndarray):
    columns = list(columns)
  if not isinstance(columns, (list, tuple)) or len(columns) != n:
    got = len(columns) if isinstance(columns, (list, tuple)) else type(columns).__name__
    raise StrategyError(f"strategy field 'columns' must be a list of n={n} columns, got {got}")
  theta = np.zeros((bands, n))
  for j, column in enumerate(columns):
    expected = min(bands, n - j)
    try:
      values = np.asarray(column, dtype=np.float64)
    except (TypeError, ValueError):
      raise StrategyError(f"strategy field 'columns[{j}]' must be a list of numbers") from None
    if values.ndim != 1 or len(values) != expected:
      raise StrategyError(f"strategy field 'columns[{j}]' must have min(bands, n-j) = {expected} entries, got {values.size}")
    if not np.all(np.isfinite(values)):
      raise StrategyError(f"strategy field 'columns[{j}]' has a non-finite value")
    if values[0] == 0:
      raise StrategyError(f"strategy field 'columns[{j}]': the diagonal entry must be non-zero")
    theta[:expected, j] = values
  return BandMF(n, bands, _readonly(theta), metadata=_metadata(obj, ("n", "bands", "columns")))


def load_strategy(source: Union[Strategy, Mapping[str, Any], str, os.PathLike]) -> Strategy:
  """THE loader: a strategy object, a dict in the JSON schema, or a path to a JSON file."""
  if isinstance(source, STRATEGY_TYPES):
    return source
  if isinstance(source, Mapping):
    return strategy_from_dict(source)
  if isinstance(source, (str, os.PathLike)):
    path = Path(source)
    if not path.is_file():
      raise StrategyError(f"strategy file not found: {path}")
    try:
      obj = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise StrategyError(f"strategy file {path} is not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError:
      raise StrategyError(f"strategy file {path} is not UTF-8 text") from None
    try:
      return strategy_from_dict(obj)
    except StrategyError as e:
      raise StrategyError(f"{path}: {e}") from None
  raise StrategyError(f"cannot load a strategy from {type(source).__name__}")


def strategy_to_dict(strategy: Strategy) -> dict[str, Any]:
  """The JSON form of a strategy (round-trips through `load_strategy`), metadata included."""
  out: dict[str, Any] = {"mechanism": strategy.mechanism}
  if isinstance(strategy, Tree):
    out["variant"] = strategy.variant
  elif isinstance(strategy, Blt):
    out["buf_decay"] = strategy.buf_decay.tolist()
    out["output_scale"] = strategy.output_scale.tolist()
  elif isinstance(strategy, BandToeplitz):
    out["coefficients"] = strategy.coefficients.tolist()
    out["column_normalized"] = strategy.column_normalized
  elif isinstance(strategy, BandMF):
    out["n"] = strategy.n
    out["bands"] = strategy.bands
    out["columns"] = strategy.columns
  for key, value in strategy.metadata.items():
    out.setdefault(key, value)
  return out


def save_strategy(strategy: Strategy, path: Union[str, os.PathLike], **metadata: Any) -> None:
  """Writes the strategy JSON atomically (temp file + rename), adding `metadata` keys."""
  obj = strategy_to_dict(strategy)
  obj.update(metadata)
  path = Path(path)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(obj, indent=1) + "\n")
  os.replace(tmp, path)


def with_metadata(strategy: Strategy, **metadata: Any) -> Strategy:
  return dataclasses.replace(strategy, metadata={**strategy.metadata, **metadata})


# ---------------------------------------------------------------------------------------------
# The matrix C that every tool sees.


def check_horizon(strategy: Strategy, n: int) -> None:
  """BandMF files serve any n' <= n (leading block); longer horizons are refused."""
  if not isinstance(n, (int, np.integer)) or n < 1:
    raise StrategyError(f"the number of rounds n must be a positive integer, got {n!r}")
  if isinstance(strategy, BandMF) and n > strategy.n:
    raise StrategyError(f"this bandmf strategy was built for n={strategy.n} rounds and cannot be used for n={n}")


def _normalize_theta(theta: np.ndarray) -> np.ndarray:
  norms = np.linalg.norm(theta, axis=0)
  return theta / norms


def banded_theta(strategy: Strategy, n: int) -> np.ndarray:
  """(bands × n) array with theta[r, j] = C[j+r, j] of the C used at horizon n.

  For BandMF (002 §3.1) and column-normalized banded Toeplitz, columns are truncated to the
  leading n×n block first and then normalized, so that every column of C has unit norm.
  """
  check_horizon(strategy, n)
  if isinstance(strategy, BandMF):
    bands = min(strategy.bands, n)
    theta = np.array(strategy.theta[:bands, :n])
    rows = np.arange(bands)[:, None] + np.arange(n)[None, :]
    theta[rows >= n] = 0.0
    return _normalize_theta(theta)
  if isinstance(strategy, BandToeplitz):
    bands = min(strategy.bands, n)
    theta = np.repeat(strategy.coefficients[:bands, None], n, axis=1)
    rows = np.arange(bands)[:, None] + np.arange(n)[None, :]
    theta[rows >= n] = 0.0
    return _normalize_theta(theta) if strategy.column_normalized else theta
  raise StrategyError(f"{strategy.mechanism} is not a banded strategy")


def toeplitz_coefs(strategy: Strategy, n: int) -> np.ndarray:
  """First n Toeplitz coefficients of C for Toeplitz strategies (BLT, unnormalized banded Toeplitz, DP-SGD)."""
  check_horizon(strategy, n)
  if isinstance(strategy, Blt):
    from fedmf.mf import blt
    return blt.blt_coefs(strategy.buf_decay, strategy.output_scale, n)
  if isinstance(strategy, BandToeplitz) and not strategy.column_normalized:
    coefs = np.zeros(n)
    m = min(n, strategy.bands)
    coefs[:m] = strategy.coefficients[:m]
    return coefs
  if isinstance(strategy, DpSgd):
    coefs = np.zeros(n)
    coefs[0] = 1.0
    return coefs
  raise StrategyError(f"{strategy.mechanism} strategy is not Toeplitz at this horizon")


def is_toeplitz(strategy: Strategy) -> bool:
  return isinstance(strategy, (Blt, DpSgd)) or (isinstance(strategy, BandToeplitz) and not strategy.column_normalized)


def theta_to_dense(theta: np.ndarray) -> np.ndarray:
  bands, n = theta.shape
  dense = np.zeros((n, n))
  for r in range(bands):
    idx = np.arange(n - r)
    dense[idx + r, idx] = theta[r, : n - r]
  return dense


def strategy_matrix(strategy: Strategy, n: int) -> np.ndarray:
  """Dense C at horizon n, normalized exactly as noise and sensitivity use it. Tree: (2n-1)×n-ish."""
  check_horizon(strategy, n)
  if isinstance(strategy, Tree):
    from fedmf.mf import tree
    return tree.tree_matrix(n)
  if isinstance(strategy, (BandMF, BandToeplitz)) and not is_toeplitz(strategy):
    return theta_to_dense(banded_theta(strategy, n))
  coefs = toeplitz_coefs(strategy, n)
  from scipy.linalg import toeplitz
  return np.tril(toeplitz(coefs))


def describe(strategy: Strategy) -> str:
  """A short human-readable name, e.g. 'blt (4 buffers)'."""
  if isinstance(strategy, Tree):
    return f"tree ({strategy.variant})"
  if isinstance(strategy, Blt):
    return f"blt ({strategy.num_buffers} buffers)"
  if isinstance(strategy, BandMF):
    return f"bandmf (n={strategy.n}, {strategy.bands} bands)"
  if isinstance(strategy, BandToeplitz):
    norm = ", column-normalized" if strategy.column_normalized else ""
    return f"band-toeplitz ({strategy.bands} bands{norm})"
  return strategy.mechanism

