"""The config of `fedmf public-features`: a flat YAML mapping and `--set KEY=VALUE` overrides, read
by fedmf's one config parser (`fedmf.config_parse`: the same `--set` rules and `ConfigError` as
`fedmf simulate`), every value checked, with the key's name, before any work or heavy import
(simulations/configs/public-features-*.yaml; docs/public-features.md lists the keys).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Sequence

from fedmf import config_parse
from fedmf import yaml_files
from fedmf.config_parse import ConfigError
from fedmf.config_parse import shown

DATA = ("synthetic", "movielens-100k", "movielens-1m", "movielens-10m", "movielens-20m")
ALGORITHMS = ("am-ssp", "am-dpsgd", "dp-als", "dp-cmf", "dp-bias")
DUPLICATES = ("refuse", "mean")
WEIGHTS = ("counts", "uniform")
DPSGD_OPTIMIZERS = ("sgd", "adam")
MAX_SEED = 2**63  # seeds enter 64-bit integer hashes (statistics.count_contributions)
MAX_SIZE = 10**9  # no count of users, items, steps or dimensions beyond this is a real run
MAX_REG = 1e12
MAX_CLIP = 1e6
MAX_OFFSET = 1e6
MIN_POSITIVE = 1e-9


@dataclass(frozen=True)
class PublicFeaturesConfig:
  # The contract keys.
  data: str = "synthetic"
  algorithm: str = "am-ssp"
  epsilon: float = 5.0  # inf: the non-private reference (no noise, no guarantee)
  delta: float = 1e-5
  dim: int = 8
  seed: int = 0  # initialization and noise of the first run
  federated: bool = False  # True: the statistics are released by TFF clients (Algorithm 8)
  clients_per_call: int = 256  # federated: users per TFF call (a release takes several calls)
  # Protocol.
  seeds: int = 1  # runs with seeds seed, seed+1, ...: test metrics as mean and std
  tune: bool = False  # choose hyper-parameters on validation over the method's grid (tuning.py)
  baselines: bool = True  # global mean, per-item mean and the DP bias model, same split
  # Data.
  data_dir: str = ""  # MovieLens directory (or --data-dir)
  duplicates: str = "refuse"  # a user's repeated rating of an item: refuse, or mean (counted once)
  split_seed: int = 0  # data generation (synthetic) and the splits
  num_users: int = 10000  # synthetic
  num_items: int = 100  # synthetic
  num_people: int = 5000  # synthetic: vocabulary of the wide 'people' feature
  mean_ratings_per_user: float = 20.0  # synthetic
  validation_fraction: float = 0.1  # random split (synthetic, ML-100K, ML-1M, ML-10M)
  test_fraction: float = 0.1
  heldout_users: float = 0.1  # held-out users for test, as many for validation (ML-20M)
  rating_offset: float | None = None  # a public constant subtracted from ratings; null: 0 / 3.5
  # Model.
  biases: bool = True  # user biases (local), item biases and a global offset (through statistics)
  bias_scale: float = 1.0  # β: the user side is [Clip(u, Γ_u), β] for the item biases
  cmf_weight: float = 1.0  # α of DP-CMF: the weight of the public features' pseudo-users
  item_id: bool = False  # an item-id feature beside year and genres (the paper's Fig. 2 id variant)
  # Training (algorithms.Hyperparameters).
  outer_steps: int = 3
  item_steps: int = 50
  reg_user: float = 1.0
  reg_user_bias: float = 1.0
  reg_item: float = 10.0
  reg_noise: float = 3.0
  reg_params: float = 10.0
  clip_user: float = 1.0
  clip_label: float = 2.0
  weights: str = "counts"  # the App. E.1 budget allocation (DP counts), or uniform (no counts)
  count_fraction: float = 0.1
  last_step_weight: float = (
    1.0  # ω: the last outer step's share of the budget over an earlier one's
  )
  max_items_per_user: int = 50
  dpsgd_steps: int = 20
  dpsgd_sampling: float = 0.05
  dpsgd_clip: float = 1.0
  dpsgd_learning_rate: float = 0.5
  dpsgd_weight_decay: float = 1e-3
  dpsgd_optimizer: str = "sgd"  # AM-DPSGD's step on the noised gradient: sgd or adam

  def validate(self) -> PublicFeaturesConfig:
    """Every value against its range (one line naming the key), then the combinations."""
    _choice("data", self.data, DATA)
    _choice("algorithm", self.algorithm, ALGORITHMS)
    _choice("duplicates", self.duplicates, DUPLICATES)
    _choice("weights", self.weights, WEIGHTS)
    _choice("dpsgd_optimizer", self.dpsgd_optimizer, DPSGD_OPTIMIZERS)
    if not self.epsilon > 0:  # inf is the non-private reference
      raise ConfigError(f"epsilon must be a number > 0 (or inf), got {shown(self.epsilon)}")
    _open_interval("delta", self.delta)
    for key in ("seed", "split_seed"):
      _integer(key, getattr(self, key), 0, MAX_SEED - 1)
    _integer("seeds", self.seeds, 1, 100)
    if self.seed + self.seeds > MAX_SEED:
      raise ConfigError(f"seed + seeds must stay below 2^63, got {self.seed} + {self.seeds}")
    _integer("dim", self.dim, 0 if self.algorithm == "dp-bias" else 1, 4096)
    for key in ("outer_steps", "item_steps", "dpsgd_steps", "num_users", "num_items", "num_people"):
      _integer(key, getattr(self, key), 1, MAX_SIZE)
    _integer("max_items_per_user", self.max_items_per_user, 1, MAX_SIZE)
    _integer("clients_per_call", self.clients_per_call, 1, 10**6)
    for key in ("validation_fraction", "test_fraction", "heldout_users", "count_fraction"):
      _open_interval(key, getattr(self, key))
    if self.validation_fraction + self.test_fraction >= 1:
      raise ConfigError(
        "validation_fraction + test_fraction must be < 1 (the rest is the training split), got "
        f"{self.validation_fraction:g} + {self.test_fraction:g}"
      )
    if 2 * self.heldout_users >= 1:
      raise ConfigError(
        "heldout_users must be < 0.5 (as many users are held out for validation as for test), "
        f"got {self.heldout_users:g}"
      )
    if not 0 < self.dpsgd_sampling <= 1:
      raise ConfigError(f"dpsgd_sampling must be in (0, 1], got {shown(self.dpsgd_sampling)}")
    for key in ("reg_user", "reg_user_bias", "reg_item", "dpsgd_learning_rate"):
      _bounded(key, getattr(self, key), MAX_REG, positive=True)
    for key in ("reg_noise", "reg_params", "dpsgd_weight_decay", "cmf_weight"):
      _bounded(key, getattr(self, key), MAX_REG, positive=False)
    for key in ("clip_user", "clip_label", "dpsgd_clip", "bias_scale", "last_step_weight"):
      _bounded(key, getattr(self, key), MAX_CLIP, positive=True)
    _bounded("mean_ratings_per_user", self.mean_ratings_per_user, MAX_SIZE, positive=True)
    if self.rating_offset is not None and not abs(self.rating_offset) <= MAX_OFFSET:
      raise ConfigError(
        f"rating_offset must be a number in [-1e6, 1e6] (or null), got {shown(self.rating_offset)}"
      )
    if self.federated and self.algorithm == "am-dpsgd":
      raise ConfigError(
        "federated runs am-ssp, dp-als, dp-cmf or dp-bias (Algorithm 8 releases statistics), not "
        "am-dpsgd"
      )
    if self.algorithm == "dp-bias" and not self.biases:
      raise ConfigError("algorithm dp-bias is the bias model: it needs biases: true")
    if self.data != "synthetic" and not self.data_dir:
      raise ConfigError(f"data {self.data} needs a data directory (--data-dir or data_dir)")
    return self

  @property
  def offset(self) -> float:
    """The public constant subtracted from ratings (0 for synthetic data, 3.5 for MovieLens)."""
    if self.rating_offset is not None:
      return self.rating_offset
    return 0.0 if self.data == "synthetic" else 3.5

  @property
  def private(self) -> bool:
    """False for the non-private reference (epsilon inf)."""
    return math.isfinite(self.epsilon)


def _choice(key: str, value: Any, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ConfigError(f"{key} must be one of {', '.join(choices)}; got {shown(value)}")


def _integer(key: str, value: int, low: int, high: int) -> None:
  if not low <= value <= high:
    most = "2^63 - 1" if high == MAX_SEED - 1 else f"{high:g}" if high >= 10**6 else str(high)
    raise ConfigError(f"{key} must be an integer from {low} to {most}, got {shown(value)}")


def _open_interval(key: str, value: float) -> None:
  if not 0 < value < 1:
    raise ConfigError(f"{key} must be in (0, 1), got {shown(value)}")


def _bounded(key: str, value: float, high: float, positive: bool) -> None:
  """`value` in [MIN_POSITIVE, high] (`positive`) or [0, high]: a positive key's tiny values (a
  subnormal 1e-320) are as much a mistake as its huge ones."""
  low = MIN_POSITIVE if positive else 0.0
  if not low <= value <= high:
    raise ConfigError(f"{key} must be a number from {low:g} to {high:g}, got {shown(value)}")


def _kinds() -> dict[str, tuple[type, bool]]:
  """{key: (scalar type, whether null is allowed)}."""
  hints = typing.get_type_hints(PublicFeaturesConfig)
  out = {}
  for f in dataclasses.fields(PublicFeaturesConfig):
    kind = hints[f.name]
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    out[f.name] = (args[0], True) if args else (kind, False)
  return out


KINDS = _kinds()


def from_mapping(raw: dict[str, Any]) -> PublicFeaturesConfig:
  """A validated config from a flat mapping of raw (YAML) values."""
  unknown = sorted(set(raw) - set(KINDS), key=str)
  if unknown:
    import difflib  # pylint: disable=g-import-not-at-top

    close = difflib.get_close_matches(str(unknown[0]), list(KINDS), n=1)
    hint = f"did you mean '{close[0]}'?" if close else "known keys: " + ", ".join(KINDS)
    raise ConfigError(f"unknown config key {str(unknown[0])!r}; {hint}")
  values = {}
  for key, value in raw.items():
    kind, nullable = KINDS[key]
    if value is None and nullable:
      values[key] = None
    else:
      values[key] = config_parse.coerce(key, value, kind, infinite=key == "epsilon")
  return PublicFeaturesConfig(**values).validate()


def load(
  path: str | None, overrides: Sequence[str] = (), data_dir: str | None = None, tune: bool = False
) -> PublicFeaturesConfig:
  """The validated config of a YAML file with `KEY=VALUE` overrides, --data-dir and --tune."""
  raw: dict[str, Any] = {}
  if path is not None:
    raw.update(yaml_files.read_mapping(path, ConfigError))
  for _, written_path, value in config_parse.parse_overrides(overrides):
    if len(written_path) != 1:
      raise ConfigError(
        f"unknown config key {'.'.join(written_path)!r}: fedmf public-features keys are flat"
      )
    raw[written_path[0]] = value
  if data_dir is not None:
    raw["data_dir"] = str(data_dir)
  if tune:
    raw["tune"] = True
  return from_mapping(raw)


def as_dict(cfg: PublicFeaturesConfig) -> dict[str, Any]:
  """The resolved config (config.json), every key in declaration order."""
  return dataclasses.asdict(cfg)
