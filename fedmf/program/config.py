"""The training configuration: one YAML file, `--set KEY=VALUE` overrides, strict validation.

One concept: what a run is. `fedmf simulate` and `fedmf train` read the same `TrainingConfig`, made
of sections by concern (fedmf.program.config_sections): `task`, `participation`, `privacy`,
`recipe`, `program` and `platform`. A config file may write a key inside its section
(`privacy: {mechanism: blt}`) or by its flat name (`mechanism: blt`), the form of the shipped
configs and of config.json; both forms can be mixed, a key given twice is refused. Dotted
`--set participation.min_sep=20` (or `--set privacy.delta=1e-8`, or `--set delta=1e-8`) overrides a
value; an unknown key, a wrong type or a value out of range is a one-line `ConfigError` naming the
key (exit 2) before any work starts.

The training recipe follows the papers' StackOverflow runs (BandMF App. I; BLT §5): client SGD with
learning rate 1 for one local epoch, each update clipped to ζ, the noisy sum divided by the clients
per round, server SGD with momentum 0.95, a linear learning-rate warm-up over the first 15% of the
rounds and a cool-down to 0.05× over the last 25%, and zeroing of updates with a huge ℓ∞ norm.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import types
import typing
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from fedmf import config_parse
from fedmf import yaml_files
from fedmf.config_parse import ConfigError
from fedmf.config_parse import shown
from fedmf.errors import FedmfUserError
from fedmf.participation import ParticipationConfig
from fedmf.tasks import model_sizes
from fedmf.program.config_sections import (
  ADAPTIVE,
  MECHANISMS,
  CanariesConfig,
  ClipValue,
  PlatformConfig,
  PrivacyConfig,
  ProgramConfig,
  RecipeConfig,
  TaskConfig,
  WorkersValue,
  at_least,
)

if TYPE_CHECKING:
  from fedmf.mf.strategy import OptimizeOptions

__all__ = ["TrainingConfig", "config_from_dict", "load_config"]

# Keys that say where a run executes, not what it computes (the model is bit-identical whatever
# they are): a resumed run may change them. (clients_per_call fixes the float sums: it may not.)
PLATFORM_KEYS = ("workers", "worker_tls", "worker_timeout_s", "worker_isolation")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """A simulation or training run, by concern (see docs/simulation.md for every key)."""

  task: TaskConfig = TaskConfig()
  participation: ParticipationConfig = ParticipationConfig()
  privacy: PrivacyConfig = PrivacyConfig()
  recipe: RecipeConfig = RecipeConfig()
  program: ProgramConfig = ProgramConfig()
  platform: PlatformConfig = PlatformConfig()
  canaries: CanariesConfig = CanariesConfig()

  @property
  def noise_scale_factor(self) -> float:
    """σ used in training / σ accounted: clients_per_round / reference (1 without the trick)."""
    if self.privacy.reference_clients_per_round is None:
      return 1.0
    return self.program.clients_per_round / self.privacy.reference_clients_per_round

  @property
  def concurrent_clients(self) -> int:
    """The clients one TFF call of a full round runs at once: the round's clients, in chunks of
    `clients_per_call` (the platform's, else the model's default)."""
    per_call = self.platform.clients_per_call or model_sizes.CLIENTS_PER_CALL.get(self.task.model)
    return min(self.program.clients_per_round, per_call or self.program.clients_per_round)

  @property
  def optimize_options(self) -> "OptimizeOptions":
    """The options the config gives the mechanism's optimizer."""
    from fedmf.mf.strategy import OptimizeOptions  # pylint: disable=g-import-not-at-top  (scipy)

    return OptimizeOptions(
      bands=self.privacy.bands, buffers=self.privacy.buffers, seed=self.program.seed
    )

  @property
  def poisson_groups(self) -> Optional[int]:
    """Cyclic Poisson groups when participation.min_sep is absent: BandMF's bands, DP-SGD's 1
    (None for another participation model or a given min_sep); a ConfigError when there is none."""
    if self.participation.model != "cyclic_poisson" or self.participation.min_sep is not None:
      return None
    if self.privacy.strategy is None:  # (a strategy file has no default: it was made for some b)
      from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top  (scipy)

      mechanism = strategies.mechanism_class(self.privacy.mechanism)
      groups = mechanism.default_poisson_groups(self.optimize_options)
      if groups is not None:
        return groups
    raise ConfigError(
      "participation.model cyclic_poisson needs participation.min_sep (the number of "
      "groups; bandmf: its bands)"
    )

  @property
  def cheap_simulation(self) -> bool:
    """The papers' cheap simulation: σ scaled for another cohort than the one trained (a reference
    equal to clients_per_round is the run itself, not a simulation of another)."""
    reference = self.privacy.reference_clients_per_round
    return reference is not None and reference != self.program.clients_per_round

  def validate(self) -> "TrainingConfig":
    """Checks each section, then the combinations; returns self. Raises ConfigError naming the key."""
    self.task.validate()
    self.program.validate()
    self.privacy.validate()
    self.platform.validate()
    self.canaries.validate()
    if self.canaries.enabled and self.privacy.noise_multiplier == 0:
      raise ConfigError(
        "canaries measure the privacy the noise gives: noise_multiplier 0 adds none (set "
        "canaries.count: 0, or a noise)"
      )
    if self.program.clients_per_round > self.task.num_clients:
      raise ConfigError(
        f"clients_per_round ({self.program.clients_per_round}) exceeds num_clients "
        f"({self.task.num_clients})"
      )
    self.recipe.validate()
    sigma, clip = self.privacy.noise_multiplier, self.recipe.initial_clip_norm
    if sigma is not None and sigma * clip > 1e30:
      # The training noise is float32 (max 3.4e38, before the strategy's own gain): refused here,
      # not after TensorFlow started and round 0 overflowed.
      raise ConfigError(
        f"noise_multiplier × clip_norm = {sigma * clip:.3g} would "
        "overflow the float32 training noise; no useful run has noise beyond 1e30"
      )
    if self.task.name == "stackoverflow" and self.task.data_dir is None:
      raise ConfigError(
        "task stackoverflow needs stackoverflow.sqlite: not in TFF's cache "
        f"({os.path.join(tff_cache_dir(), 'stackoverflow.sqlite')}) and no --data-dir DIR given; "
        "tff.simulation.datasets.stackoverflow.load_data() fills TFF's cache"
      )
    try:
      self.participation.validate()
    except FedmfUserError as e:
      raise ConfigError(str(e)) from None
    _check_effective(self.participation, self.privacy)
    if self.recipe.adaptive and self.participation.model == "cyclic_poisson":
      # The amplification theorems fedmf credits (BandMF Thm 4, DP-SGD with sampling) are not
      # stated for the count releases: refused rather than accounted without them.
      raise ConfigError(
        "clip_norm: adaptive is not accounted with participation.model cyclic_poisson (no "
        "amplification theorem here covers its count releases): use a fixed clip_norm or another "
        "participation.model"
      )
    if self.privacy.strategy is not None:
      _check_strategy_file(self.privacy.strategy, self.program.rounds)
    return self

  def to_dict(self) -> dict[str, Any]:
    """Every key by its flat name, in the order config.json has always had."""
    sections = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
    out = {}
    for flat in FLAT_ORDER:
      if flat == "adaptive_clip" and not self.recipe.adaptive:
        continue  # (unset: the config.json of a fixed clip is what it was before adaptive clipping)
      if flat == "participation":
        out[flat] = sections["participation"]
      else:
        section, field = FLAT_KEYS[flat]
        out[flat] = sections[section][field]
    if self.canaries.enabled:  # (absent otherwise: config.json of runs without canaries unchanged)
      out["canaries"] = sections["canaries"]
    return out


class MootKeyError(ConfigError):
  """A key the other settings ignore (`key`, by the name the message uses, and `why`)."""

  def __init__(self, key: str, why: str, hint: str = "remove it, or change the setting"):
    super().__init__(f"{key} has no effect here ({why}): {hint}")
    self.key, self.why = key, why


def _check_effective(p: ParticipationConfig, privacy: PrivacyConfig) -> None:
  """Refuses a value the chosen settings ignore (issue 26, C.9): a key that has no effect is a
  mistake the user would otherwise never see (it is even stored in config.json)."""
  if p.min_sep is not None:
    at_least("participation.min_sep", p.min_sep, 1)
  if p.max_participations is not None:
    at_least("participation.max_participations", p.max_participations, 1)
  ignored = moot_keys(p, privacy)
  if ignored:
    raise MootKeyError(*ignored[0])


def moot_keys(p: ParticipationConfig, privacy: PrivacyConfig) -> list[tuple[str, str]]:
  """(key, why) of every set key the other settings ignore, in a fixed order."""
  default = ParticipationConfig()
  wall_clock = p.model == "timer" and p.timer_unit == "hours"
  ignored = []
  if wall_clock and p.min_sep is not None:
    ignored.append(("participation.min_sep", "the hours timer counts participation.timer_hours"))
  if p.model != "timer" and p.timer_unit != default.timer_unit:
    ignored.append(("participation.timer_unit", f"participation.model is {p.model}, not timer"))
  if not wall_clock:
    why = (
      "participation.timer_unit is not hours"
      if p.model == "timer"
      else (f"participation.model is {p.model}, not timer")
    )
    for key in (
      "timer_hours",
      "round_minutes",
      "round_jitter",
      "night_availability",
      "day_availability",
    ):
      if getattr(p, key) != getattr(default, key):
        ignored.append((f"participation.{key}", f"it sets the hours timer, and {why}"))
  if p.model != "timer":
    for key in ("max_participations", "server_guard"):
      if getattr(p, key) != getattr(default, key):
        ignored.append((f"participation.{key}", f"participation.model is {p.model}, not timer"))
  if privacy.strategy is None:
    # Which optimizer reads which option is the strategy's own answer (no mechanism names here).
    from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

    for key in ("bands", "buffers"):
      if getattr(privacy, key) is not None:
        if key not in strategies.mechanism_class(privacy.mechanism).optimizer_options:
          takers = [m for m in MECHANISMS if key in strategies.mechanism_class(m).optimizer_options]
          ignored.append((key, f"mechanism is {privacy.mechanism}, not {' or '.join(takers)}"))
  else:
    for key in ("bands", "buffers"):
      if getattr(privacy, key) is not None:
        ignored.append((key, "a strategy file is given"))
  if privacy.force_strategy and privacy.strategy is None:
    ignored.append(("force_strategy", "no strategy file is given"))
  return ignored


def _key_path(key: str) -> tuple[str, str]:
  """A key as `moot_keys` names it ('participation.min_sep', 'bands') -> (section, field)."""
  head, _, field = key.partition(".")
  return (head, field) if field else FLAT_KEYS[head]


def _moot_in(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
  """`moot_keys` of a nested raw mapping; [] when its sections do not even build (those errors
  are reported by the validation that follows)."""
  try:
    p = _section("participation", obj.get("participation", {}))
    privacy = _section("privacy", obj.get("privacy", {}))
    return moot_keys(p, privacy)
  except (FedmfUserError, TypeError):
    return []


def _give_way(raw: dict[str, Any], base: Mapping[str, Any], overrides: Sequence[str]) -> None:
  """Drops, in place, the keys of the config file that the command line's overrides made moot
  (issue 38 item 18): `--set participation.timer_unit=hours` over a file with `min_sep: 50` runs
  the hours timer, as `partitions` already replaces a file's min_sep for cyclic Poisson. A key the
  user gave on the command line, or one the file alone already made moot, is still refused."""
  if not overrides:
    return
  given = _given_paths(overrides)
  base_moot = {key for key, _ in _moot_in(nested(base))}
  for key, _ in _moot_in(raw):
    section, field = _key_path(key)
    if (section, field) not in given and key not in base_moot:
      raw.get(section, {}).pop(field, None)


def _given_paths(overrides: Sequence[str]) -> set[tuple[str, str]]:
  """The (section, field) of every key the overrides set."""
  return {
    (section, field)
    for section, fields in apply_overrides({}, overrides).items()
    if isinstance(fields, dict)
    for field in fields
  }


def _moot_hint(error: MootKeyError, path: Any, overrides: Sequence[str]) -> MootKeyError:
  """The refusal of a moot key, naming the exact way to remove it: the --set that gave it, or the
  override that clears the config file's value."""
  section, field = _key_path(error.key)
  for text in reversed(overrides):
    written, _ = config_parse.parse_override(text, list_keys=("workers",))
    if tuple(_canonical_path(written)) == (section, field):
      return MootKeyError(error.key, error.why, f"remove --set {text}, or change the setting")
  default = dataclasses.asdict(SECTIONS[section]())[field]
  shown_default = "null" if default is None else json.dumps(default)
  source = f"it comes from {path}" if path is not None else "it comes from the config"
  return MootKeyError(
    error.key,
    error.why,
    f"{source}: add --set {error.key}={shown_default}, or change the setting",
  )


def _check_strategy_file(path: str, rounds: int) -> None:
  """Loads the strategy file now, before any work: a file that does not load, a strategy that
  cannot stream its noise into training (the full-Honaker tree) or a BandMF built for fewer
  rounds is a one-line ConfigError."""
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

  try:
    strategy = strategies.load_strategy(path)
    strategy.check_streamable()
    strategy.check_horizon(rounds)
  except FedmfUserError as e:
    raise ConfigError(f"strategy: {e}") from None


# ---------------------------------------------------------------------------------------------
# Sections and flat names.

SECTIONS: dict[str, type] = {
  "task": TaskConfig,
  "participation": ParticipationConfig,
  "privacy": PrivacyConfig,
  "recipe": RecipeConfig,
  "program": ProgramConfig,
  "platform": PlatformConfig,
  "canaries": CanariesConfig,
}
# Sections whose keys keep their section's name (`participation.min_sep`, `canaries.count`).
PREFIXED = ("participation", "canaries")


def _flat_keys() -> dict[str, tuple[str, str]]:
  """{flat name: (section, field)}: a field's flat name is its own, but the task's `name` is `task`
  (participation's and canaries' keys keep their section: `participation.min_sep`)."""
  table = {}
  for section, cls in SECTIONS.items():
    if section not in PREFIXED:
      for f in dataclasses.fields(cls):
        flat = "task" if (section, f.name) == ("task", "name") else f.name
        if flat in table:  # A flat name must say which key it is.
          raise TypeError(f"config key {flat} is in sections {table[flat][0]} and {section}")
        table[flat] = (section, f.name)
  return table


FLAT_KEYS = _flat_keys()
FLAT_NAMES = {where: flat for flat, where in FLAT_KEYS.items()}
# The order config.json was written in by the flat TrainingConfig before the sections existed: a
# record of the past (tests/program/test_config_sections.py pins it), never extended. It cannot
# come from the sections, whose fields it interleaves (rounds, then privacy's keys, then eval_every).
LEGACY_ORDER = (
  *("task", "num_clients", "model", "vocab_size", "sequence_length", "max_sentences_per_client"),
  *("batch_size", "test_sentences", "data_dir", "rounds", "clients_per_round", "mechanism"),
  *("bands", "buffers", "strategy", "force_strategy", "target_epsilon", "noise_multiplier"),
  *("delta", "reference_clients_per_round", "clip_norm", "client_learning_rate"),
  *("server_learning_rate", "server_momentum", "warmup_fraction", "cooldown_fraction"),
  *("cooldown_factor", "zeroing_linf", "eval_every", "seed", "noise_seed", "participation"),
  *("checkpoint_every", "budget", "workers", "worker_tls", "worker_timeout_s"),
  *("worker_isolation", "clients_per_call"),
)


def _flat_order() -> tuple[str, ...]:
  """config.json's keys: those of LEGACY_ORDER still in the sections, in its order, then every
  key added since, in the sections' field order (a new key needs no entry here)."""
  known = [*FLAT_KEYS, "participation"]
  legacy = [key for key in LEGACY_ORDER if key in known]
  return (*legacy, *(key for key in known if key not in legacy))


FLAT_ORDER = _flat_order()


def _unknown(key: str, known: Sequence[str]) -> ConfigError:
  close = difflib.get_close_matches(str(key), sorted(known), n=1)
  hint = f"did you mean '{close[0]}'?" if close else "known keys: " + ", ".join(sorted(known))
  return ConfigError(f"unknown config key '{key}'; {hint}")


def _is_section(key: str, value: Any) -> bool:
  # `task: synthetic` is the flat name of task.name; `task: {...}` is the section.
  return key in SECTIONS and (key != "task" or isinstance(value, Mapping))


def nested(raw: Mapping[str, Any]) -> dict[str, Any]:
  """A raw config mapping (flat names, sections, or both) as {section: {field: value}}."""
  out: dict[str, Any] = {}
  written: dict[tuple[str, str], str] = {}
  for key, value in raw.items():
    if _is_section(key, value):
      if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a section of keys, got {shown(value)}")
      items = [(key, field, v, f"{key}.{field}") for field, v in value.items()]
    elif key in FLAT_KEYS:
      items = [(*FLAT_KEYS[key], value, key)]
    else:
      raise _unknown(key, [*FLAT_KEYS, *SECTIONS])
    for section, field, v, name in items:
      node = out.setdefault(section, {})
      if field in node:
        raise ConfigError(f"{name} is given twice (also as {written[section, field]})")
      node[field] = v
      written[section, field] = name
  return out


def _canonical_path(path: list[str]) -> list[str]:
  """A dotted `--set` key as a path into the nested mapping: `delta` -> privacy.delta."""
  head = path[0]
  if head in SECTIONS and (head != "task" or len(path) > 1):
    return path
  if head in FLAT_KEYS:
    return [*FLAT_KEYS[head], *path[1:]]
  raise _unknown(".".join(path), [*FLAT_KEYS, *SECTIONS])


# ---------------------------------------------------------------------------------------------
# From YAML + overrides to a typed, validated config.


def _section(section: str, obj: Any) -> Any:
  """One section from its mapping; its keys are named by their flat names in errors."""
  cls = SECTIONS[section]
  if not isinstance(obj, Mapping):
    raise ConfigError(f"{section} must be a section of keys, got {shown(obj)}")
  if section in PREFIXED:
    return _build(cls, obj, prefix=f"{section}.")
  hints = typing.get_type_hints(cls)
  fields = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(obj) - set(fields))
  if unknown:
    raise _unknown(f"{section}.{unknown[0]}", [f"{section}.{f}" for f in fields])
  return cls(**{k: _coerce(FLAT_NAMES[section, k], v, hints[k]) for k, v in obj.items()})


def _build(cls, obj: Mapping[str, Any], prefix: str = ""):
  hints = typing.get_type_hints(cls)
  fields = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(obj) - set(fields))
  if unknown:
    raise _unknown(f"{prefix}{unknown[0]}", [prefix + f for f in fields])
  return cls(**{k: _coerce(prefix + k, v, hints[k]) for k, v in obj.items()})


def _from_nested(obj: Mapping[str, Any]) -> TrainingConfig:
  try:
    return TrainingConfig(**{s: _section(s, v) for s, v in obj.items()}).validate()
  except RecursionError:
    raise ConfigError("config is nested too deeply") from None


def _coerce(key: str, value: Any, annotation: Any) -> Any:
  """`value` as the field type `annotation` (ints, floats, strings, bools, Optional, sections)."""
  if annotation == WorkersValue:
    if isinstance(value, (list, tuple)):
      if not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must list 'host:port' or 'unix:PATH' strings, got {shown(value)}")
      return tuple(value)
    return _coerce(key, value, int)
  if annotation == ClipValue:
    if isinstance(value, str) and value.strip() == ADAPTIVE:
      return ADAPTIVE
    try:
      return _coerce(key, value, float)
    except ConfigError:
      raise ConfigError(f"{key} must be a number > 0 or {ADAPTIVE}, got {shown(value)}") from None
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if value is None:
      return None
    return _coerce(key, value, args[0])
  if dataclasses.is_dataclass(annotation):
    if not isinstance(value, Mapping):
      raise ConfigError(f"{key} must be a section of keys, got {shown(value)}")
    return _build(annotation, value, prefix=f"{key}.")
  if annotation in (bool, int, float, str):
    return config_parse.coerce(key, value, annotation)
  raise TypeError(f"unsupported config type {annotation!r} for {key}")


def apply_overrides(obj: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
  """The nested form of a raw config mapping with every dotted `KEY=VALUE` override applied (a
  key by its flat name or inside its section: `delta=1e-8` and `privacy.delta=1e-8` are one key,
  and giving it twice is refused; `fedmf.config_parse` has the rules)."""
  out = json.loads(json.dumps(nested(obj)))
  for written, path, value in config_parse.parse_overrides(
    overrides, _canonical_path, list_keys=("workers",)
  ):
    node = out
    for part in path[:-1]:
      child = node.get(part)
      if child is None:
        child = node[part] = {}
      if not isinstance(child, dict):
        raise ConfigError(f"--set {'.'.join(written)}: '{part}' is not a section")
      node = child
    node[path[-1]] = value
  return out


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
  """The raw mapping of a YAML config file (one-line errors for missing or malformed files)."""
  return yaml_files.read_mapping(path, ConfigError)


def tff_cache_dir() -> str:
  """Where TFF's dataset loaders keep their files (`download.get_compressed_file`: ~/.tff)."""
  return os.path.join(os.path.expanduser("~"), ".tff")


def load_config(
  path: Optional[str | os.PathLike], overrides: Sequence[str] = (), data_dir: Optional[str] = None
) -> TrainingConfig:
  """The validated config of a YAML file (or the defaults) with overrides and --data-dir."""
  base = read_yaml(path) if path is not None else {}
  raw = apply_overrides(base, overrides)
  _give_way(raw, base, overrides)
  task = raw.setdefault("task", {})  # a dict: nested() and the overrides only make sections
  if data_dir is not None:
    task["data_dir"] = str(data_dir)
  elif task.get("name") == "stackoverflow" and not task.get("data_dir"):
    # Where tff.simulation.datasets.stackoverflow.load_data() leaves the file (issue 26, B.7).
    if os.path.isfile(os.path.join(tff_cache_dir(), "stackoverflow.sqlite")):
      task["data_dir"] = tff_cache_dir()
  try:
    return _from_nested(raw)
  except MootKeyError as e:
    raise _moot_hint(e, path, overrides) from None


def config_from_dict(obj: Mapping[str, Any]) -> TrainingConfig:
  """A validated config from a plain dict (e.g. a run's config.json, whose run_id is not a key)."""
  return _from_nested(nested({k: v for k, v in obj.items() if k != "run_id"}))
