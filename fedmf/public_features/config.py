"""The config of `fedmf public-features`: a flat YAML mapping, `--set KEY=VALUE` overrides, one-line
errors for unknown keys and bad values (simulations/configs/public-features-*.yaml)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from fedmf import yaml_files
from fedmf.errors import FedmfUserError

DATA = ("synthetic", "movielens-100k", "movielens-1m", "movielens-10m", "movielens-20m")
DUPLICATES = ("refuse", "mean")
ALGORITHMS = ("am-ssp", "am-dpsgd", "dp-als")


class ConfigError(FedmfUserError):
  """A bad config key or value."""


@dataclass(frozen=True)
class PublicFeaturesConfig:
  # The contract keys.
  data: str = "synthetic"
  algorithm: str = "am-ssp"
  epsilon: float = 5.0
  delta: float = 1e-5
  dim: int = 8
  seed: int = 0
  federated: bool = False  # True: the statistics are released by TFF clients (Algorithm 8)
  # Data.
  data_dir: str = ""  # MovieLens directory (or --data-dir)
  duplicates: str = "refuse"  # a user's repeated rating of an item: refuse, or mean (counted once)
  num_users: int = 10000  # synthetic
  num_items: int = 100  # synthetic
  num_people: int = 5000  # synthetic: vocabulary of the wide 'people' feature
  mean_ratings_per_user: float = 20.0  # synthetic
  test_fraction: float = 0.2  # random split (synthetic, ML-10M)
  heldout_users: float = 0.1  # held-out user split (ML-20M)
  rating_offset: float = -1.0  # subtracted from ratings; -1: 0 for synthetic, 3.5 for MovieLens
  # Training (algorithms.Hyperparameters).
  outer_steps: int = 3
  item_steps: int = 50
  reg_user: float = 1.0
  reg_item: float = 10.0
  reg_noise: float = 3.0
  reg_params: float = 10.0
  clip_user: float = 1.0
  clip_label: float = 2.0
  count_fraction: float = 0.1
  max_items_per_user: int = 50
  dpsgd_sampling: float = 0.02
  dpsgd_clip: float = 5.0
  dpsgd_learning_rate: float = 0.5
  dpsgd_weight_decay: float = 1e-3

  def validate(self) -> "PublicFeaturesConfig":
    if self.data not in DATA:
      raise ConfigError(f"data must be one of {', '.join(DATA)}; got {self.data!r}")
    if self.duplicates not in DUPLICATES:
      raise ConfigError(
        f"duplicates must be one of {', '.join(DUPLICATES)}; got {self.duplicates!r}"
      )
    if self.algorithm not in ALGORITHMS:
      raise ConfigError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {self.algorithm!r}")
    if not (math.isfinite(self.epsilon) and self.epsilon > 0):
      raise ConfigError(f"epsilon must be a finite number > 0, got {self.epsilon!r}")
    if not 0 < self.delta < 1:
      raise ConfigError(f"delta must be in (0, 1), got {self.delta!r}")
    for key in (
      "dim",
      "outer_steps",
      "item_steps",
      "num_users",
      "num_items",
      "num_people",
      "max_items_per_user",
    ):
      if getattr(self, key) < 1:
        raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)!r}")
    for key in ("test_fraction", "heldout_users", "count_fraction", "dpsgd_sampling"):
      if not 0 < getattr(self, key) < 1:
        raise ConfigError(f"{key} must be in (0, 1), got {getattr(self, key)!r}")
    for key in (
      "reg_user",
      "reg_item",
      "clip_user",
      "clip_label",
      "dpsgd_clip",
      "dpsgd_learning_rate",
      "mean_ratings_per_user",
    ):
      if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
        raise ConfigError(f"{key} must be a finite number > 0, got {getattr(self, key)!r}")
    for key in ("reg_noise", "reg_params", "dpsgd_weight_decay"):
      if not (math.isfinite(getattr(self, key)) and getattr(self, key) >= 0):
        raise ConfigError(f"{key} must be a finite number >= 0, got {getattr(self, key)!r}")
    if self.federated and self.algorithm == "am-dpsgd":
      raise ConfigError("federated runs am-ssp or dp-als (Algorithm 8 releases statistics)")
    if self.data != "synthetic" and not self.data_dir:
      raise ConfigError(f"data {self.data} needs a data directory (--data-dir or data_dir)")
    return self

  @property
  def offset(self) -> float:
    if self.rating_offset != -1.0:
      return self.rating_offset
    return 0.0 if self.data == "synthetic" else 3.5


def _coerce(key: str, value: Any, kind: type) -> Any:
  if kind is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"{key} must be true or false, got {value!r}")
  if kind is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError(f"{key} must be an integer, got {value!r}")
    return value
  if kind is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)
  if not isinstance(value, str):
    raise ConfigError(f"{key} must be a string, got {value!r}")
  return value


def from_mapping(raw: dict[str, Any]) -> PublicFeaturesConfig:
  kinds = {
    f.name: {"bool": bool, "int": int, "float": float}.get(f.type, str)
    for f in dataclasses.fields(PublicFeaturesConfig)
  }
  unknown = sorted(set(raw) - set(kinds))
  if unknown:
    raise ConfigError(f"unknown config key {unknown[0]!r}; known keys: {', '.join(kinds)}")
  values = {k: _coerce(k, v, kinds[k]) for k, v in raw.items()}
  return PublicFeaturesConfig(**values).validate()


def load(path: str | None, overrides: Sequence[str] = (), data_dir: str | None = None):
  """The validated config of a YAML file with `KEY=VALUE` overrides (YAML scalars) and --data-dir."""
  import yaml  # pylint: disable=g-import-not-at-top

  raw: dict[str, Any] = {}
  if path is not None:
    raw.update(yaml_files.read_mapping(path, ConfigError))
  for text in overrides:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
      raise ConfigError(f"--set expects KEY=VALUE, got {text!r}")
    try:
      raw[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
      raw[key.strip()] = value
  if data_dir is not None:
    raw["data_dir"] = str(data_dir)
  return from_mapping(raw)
