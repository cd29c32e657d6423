"""The training configuration: one YAML file, `--set KEY=VALUE` overrides, strict validation.

One concept: what a run is. `fedmf simulate` and `fedmf train` read the same `TrainingConfig` (the
training program adds `checkpoint_every`, `budget.epsilon` and `workers`). A config file is a YAML
mapping whose keys are the fields below (nested sections for `participation` and `budget`); dotted
`--set participation.min_sep=20` overrides a value; an unknown key, a wrong type or a value out of
range is a one-line `ConfigError` naming the key (exit 2) before any work starts.

The training recipe follows the papers' StackOverflow runs (BandMF App. I; BLT §5): client SGD with
learning rate 1 for one local epoch, each update clipped to ζ, the noisy sum divided by the clients
per round, server SGD with momentum 0.95, a linear learning-rate warm-up over the first 15% of the
rounds and a cool-down to 0.05× over the last 25%, and zeroing of updates with a huge ℓ∞ norm.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from fedmf.errors import FedmfUserError
from fedmf.participation import ParticipationConfig

TASKS = ("synthetic", "stackoverflow")
MODELS = ("lstm-small", "lstm-paper")
MECHANISMS = ("dpsgd", "tree", "bandmf", "blt")


class ConfigError(FedmfUserError):
  """A configuration that does not validate (one line naming the key)."""


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
  """`budget:` the training program stops cleanly before ε would exceed `epsilon` (None: no guard)."""

  epsilon: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class WorkerTLSConfig:
  """`worker_tls:` PEM files for mutual TLS with remote workers (see deploy/README.md)."""

  ca: str = ""  # the CA that signed the workers' certificates
  cert: str = ""  # the coordinator's client certificate
  key: str = ""  # its private key


# `workers`: a count of local workers, or the "host:port" addresses of `fedmf worker` services.
WorkersValue = typing.Union[int, tuple[str, ...]]
# Keys that say where a run executes, not what it computes (the model is bit-identical whatever
# they are): a resumed run may change them.
PLATFORM_KEYS = ("workers", "worker_tls", "worker_timeout_s", "worker_isolation")


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """A simulation or training run (see docs/simulation.md for every key).

  Task and model:
    task: synthetic | stackoverflow. num_clients: the synthetic population (StackOverflow: the
    training clients in the file). model: lstm-small | lstm-paper. vocab_size: words in the
    vocabulary (without pad/bos/eos/OOV). sequence_length, max_sentences_per_client, batch_size:
    preprocessing (StackOverflow: 20, 256, 16 in the papers). test_sentences: the held-out sample
    evaluated every `eval_every` rounds. data_dir: the directory holding stackoverflow.sqlite.
  Rounds and privacy:
    rounds, clients_per_round. mechanism: dpsgd | tree | bandmf | blt, optimized for the run's own
    schema and cached (bands: BandMF b̂, default the min-sep; buffers: BLT buffers), or strategy: a
    strategy file (replaces mechanism; refused if it was optimized for another (n, b) unless
    force_strategy). target_epsilon, or noise_multiplier (σ, applied to C as loaded; 0 = no DP, for
    comparison), which takes precedence over target_epsilon when both are set. delta. reference_clients_per_round: the papers' cheap-simulation trick (BandMF
    App. I): train on clients_per_round but scale σ as for this many, so the noise on the mean
    matches the reference cohort; accounting is for the reference run.
  Recipe: clip_norm ζ, client_learning_rate, server_learning_rate, server_momentum,
    warmup_fraction, cooldown_fraction, cooldown_factor, zeroing_linf (updates whose largest
    |entry| exceeds it are zeroed; None disables).
  Randomness: seed (data, model initialization and cohorts); noise_seed (None: OS randomness).
  Program: checkpoint_every (rounds), budget.epsilon.
  Platform (the model is bit-identical whatever they are): workers (0: one local TFF worker;
    W: W local workers; a list of "host:port": `fedmf worker` services on other hosts), worker_tls
    ({ca, cert, key}: mutual TLS with them, required for non-loopback addresses), worker_timeout_s
    (a chunk of clients not finished by then goes to another worker), worker_isolation
    (namespace: local workers run in a network namespace of their own, refusing to start where
    none can be made; none: accept TFF's open port there). clients_per_call: clients per TFF call
    (the chunks whose sums are added in order; default per model), which fixes the float sums.
  """

  task: str = "synthetic"
  num_clients: int = 2000
  model: str = "lstm-small"
  vocab_size: int = 1000
  sequence_length: int = 20
  max_sentences_per_client: int = 256
  batch_size: int = 16
  test_sentences: int = 2000
  data_dir: Optional[str] = None
  rounds: int = 200
  clients_per_round: int = 20
  mechanism: str = "blt"
  bands: Optional[int] = None
  buffers: Optional[int] = None
  strategy: Optional[str] = None
  force_strategy: bool = False
  target_epsilon: Optional[float] = None
  noise_multiplier: Optional[float] = None
  delta: float = 1e-6
  reference_clients_per_round: Optional[int] = None
  clip_norm: float = 1.0
  client_learning_rate: float = 1.0
  server_learning_rate: float = 1.0
  server_momentum: float = 0.95
  warmup_fraction: float = 0.15
  cooldown_fraction: float = 0.25
  cooldown_factor: float = 0.05
  zeroing_linf: Optional[float] = 100.0
  eval_every: int = 10
  seed: int = 0
  noise_seed: Optional[int] = None
  participation: ParticipationConfig = ParticipationConfig()
  checkpoint_every: int = 10
  budget: BudgetConfig = BudgetConfig()
  workers: WorkersValue = 0
  worker_tls: Optional[WorkerTLSConfig] = None
  worker_timeout_s: float = 600.0
  worker_isolation: str = "namespace"
  clients_per_call: Optional[int] = None

  # --- derived ------------------------------------------------------------------------------

  @property
  def noise_scale_factor(self) -> float:
    """σ used in training / σ accounted: clients_per_round / reference (1 without the trick)."""
    if self.reference_clients_per_round is None:
      return 1.0
    return self.clients_per_round / self.reference_clients_per_round

  def validate(self) -> "TrainingConfig":
    """Checks ranges and combinations; returns self. Raises ConfigError naming the key."""
    _choice("task", self.task, TASKS)
    _choice("model", self.model, MODELS)
    _choice("mechanism", self.mechanism, MECHANISMS)
    for key in (
      "num_clients",
      "vocab_size",
      "sequence_length",
      "max_sentences_per_client",
      "batch_size",
      "test_sentences",
      "rounds",
      "clients_per_round",
      "eval_every",
      "checkpoint_every",
    ):
      _at_least(key, getattr(self, key), 1)
    for key in ("bands", "buffers", "reference_clients_per_round"):
      if getattr(self, key) is not None:
        _at_least(key, getattr(self, key), 1)
    self._check_platform()
    if self.clients_per_round > self.num_clients:
      raise ConfigError(
        f"clients_per_round ({self.clients_per_round}) exceeds num_clients ({self.num_clients})"
      )
    if self.target_epsilon is None and self.noise_multiplier is None:
      raise ConfigError(
        "give target_epsilon or noise_multiplier (noise_multiplier: 0 trains "
        "without DP, for comparison)"
      )
    if self.target_epsilon is not None:
      _positive("target_epsilon", self.target_epsilon)
    if self.noise_multiplier is not None and not (
      math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0
    ):
      raise ConfigError(
        f"noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}"
      )
    if self.noise_multiplier is not None and self.noise_multiplier * self.clip_norm > 1e30:
      # The training noise is float32 (max 3.4e38, before the strategy's own gain): refused here,
      # not after TensorFlow started and round 0 overflowed.
      raise ConfigError(
        f"noise_multiplier × clip_norm = {self.noise_multiplier * self.clip_norm:.3g} would "
        "overflow the float32 training noise; no useful run has noise beyond 1e30"
      )
    if not 0 < self.delta < 1:
      raise ConfigError(f"delta must lie in (0, 1), got {self.delta!r}")
    for key in ("clip_norm", "client_learning_rate", "server_learning_rate", "cooldown_factor"):
      _positive(key, getattr(self, key))
    if self.zeroing_linf is not None:
      _positive("zeroing_linf", self.zeroing_linf)
    if not 0 <= self.server_momentum < 1:
      raise ConfigError(f"server_momentum must lie in [0, 1), got {self.server_momentum!r}")
    for key in ("warmup_fraction", "cooldown_fraction"):
      if not 0 <= getattr(self, key) <= 1:
        raise ConfigError(f"{key} must lie in [0, 1], got {getattr(self, key)!r}")
    if self.warmup_fraction + self.cooldown_fraction > 1:
      raise ConfigError("warmup_fraction + cooldown_fraction must not exceed 1")
    if self.task == "stackoverflow" and self.data_dir is None:
      raise ConfigError(
        "task stackoverflow needs stackoverflow.sqlite: not in TFF's cache "
        f"({os.path.join(tff_cache_dir(), 'stackoverflow.sqlite')}) and no --data-dir DIR given; "
        "tff.simulation.datasets.stackoverflow.load_data() fills TFF's cache"
      )
    for key in ("seed", "noise_seed"):
      value = getattr(self, key)
      if value is not None and not 0 <= value < 2**64:
        raise ConfigError(f"{key} must be an integer in [0, 2^64), got {value!r}")
    if self.budget.epsilon is not None:
      _positive("budget.epsilon", self.budget.epsilon)
    try:
      self.participation.validate()
    except FedmfUserError as e:
      raise ConfigError(str(e)) from None
    self._check_effective()
    if self.strategy is not None:
      self._check_strategy_file()
    return self

  def _check_platform(self) -> None:
    from fedmf.tff import channels, sandbox  # pylint: disable=g-import-not-at-top  (no TF import)

    if self.clients_per_call is not None:
      _at_least("clients_per_call", self.clients_per_call, 1)
    _positive("worker_timeout_s", self.worker_timeout_s)
    _choice("worker_isolation", self.worker_isolation, sandbox.ISOLATION_POLICIES)
    tls = None
    if self.worker_tls is not None:
      try:
        tls = channels.TLSFiles.from_mapping(dataclasses.asdict(self.worker_tls))
      except FedmfUserError as e:
        raise ConfigError(str(e)) from None
    if isinstance(self.workers, int):
      _at_least("workers", self.workers, 0)
      return
    if not self.workers:
      raise ConfigError("workers must be a count >= 0 or a non-empty list of 'host:port'")
    try:
      channels.check_remote_workers(self.workers, tls)
      if tls is not None:
        tls.read()  # Unreadable or non-PEM files are refused now, before any work.
    except FedmfUserError as e:
      raise ConfigError(f"workers: {e}") from None

  @property
  def worker_tls_files(self):
    """`worker_tls` as `fedmf.tff.channels.TLSFiles` (None without it)."""
    if self.worker_tls is None:
      return None
    from fedmf.tff import channels  # pylint: disable=g-import-not-at-top

    return channels.TLSFiles.from_mapping(dataclasses.asdict(self.worker_tls))

  def _check_effective(self) -> None:
    """Refuses a value the chosen settings ignore (issue 26, C.9): a key that has no effect is a
    mistake the user would otherwise never see (it is even stored in config.json)."""
    p, default = self.participation, ParticipationConfig()
    if p.min_sep is not None:
      _at_least("participation.min_sep", p.min_sep, 1)
    if p.max_participations is not None:
      _at_least("participation.max_participations", p.max_participations, 1)
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
    if self.strategy is None:
      # Which optimizer reads which option is the strategy's own answer (no mechanism names here).
      from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

      for key in ("bands", "buffers"):
        if getattr(self, key) is not None:
          if key not in strategies.mechanism_class(self.mechanism).optimizer_options:
            takers = [
              m for m in MECHANISMS if key in strategies.mechanism_class(m).optimizer_options
            ]
            ignored.append((key, f"mechanism is {self.mechanism}, not {' or '.join(takers)}"))
    else:
      for key in ("bands", "buffers"):
        if getattr(self, key) is not None:
          ignored.append((key, "a strategy file is given"))
    if self.force_strategy and self.strategy is None:
      ignored.append(("force_strategy", "no strategy file is given"))
    if ignored:
      key, why = ignored[0]
      raise ConfigError(f"{key} has no effect here ({why}): remove it, or change the setting")

  def _check_strategy_file(self) -> None:
    """Loads the strategy file now, before any work: a file that does not load, a strategy that
    cannot stream its noise into training (the full-Honaker tree) or a BandMF built for fewer
    rounds is a one-line ConfigError."""
    from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

    try:
      strategy = strategies.load_strategy(self.strategy)
      strategy.check_streamable()
      strategy.check_horizon(self.rounds)
    except FedmfUserError as e:
      raise ConfigError(f"strategy: {e}") from None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _shown(value: Any) -> str:
  """A config value as the user wrote it in YAML: null, true, [1, 2] (never Python's None)."""
  if value is None or isinstance(value, (bool, list, tuple, dict)):
    try:
      text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
      text = repr(value)
  else:
    text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _choice(key: str, value: Any, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {_shown(value)}")


def _at_least(key: str, value: int, minimum: int) -> None:
  if value < minimum:
    raise ConfigError(f"{key} must be an integer >= {minimum}, got {_shown(value)}")


def _positive(key: str, value: float) -> None:
  if not (math.isfinite(value) and value > 0):
    raise ConfigError(f"{key} must be a finite number > 0, got {_shown(value)}")


# ---------------------------------------------------------------------------------------------
# From YAML + overrides to a typed, validated config.


def _coerce(key: str, value: Any, annotation: Any) -> Any:
  """`value` as the field type `annotation` (ints, floats, strings, bools, Optional, sections)."""
  if annotation == WorkersValue:
    if isinstance(value, (list, tuple)):
      if not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must list 'host:port' strings, got {_shown(value)}")
      return tuple(value)
    return _coerce(key, value, int)
  origin = typing.get_origin(annotation)
  if origin in (typing.Union, types.UnionType):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if value is None:
      return None
    return _coerce(key, value, args[0])
  if dataclasses.is_dataclass(annotation):
    if not isinstance(value, Mapping):
      raise ConfigError(f"{key} must be a section of keys, got {_shown(value)}")
    return _build(annotation, value, prefix=f"{key}.")
  if annotation is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"{key} must be true or false, got {_shown(value)}")
  if annotation is int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
      raise ConfigError(f"{key} must be an integer, got {_shown(value)}")
    return int(value)
  if annotation is float:
    if isinstance(value, str):  # YAML 1.1 reads '1e-8' (no dot) as a string.
      try:
        value = float(value)
      except ValueError:
        raise ConfigError(f"{key} must be a number, got {_shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError(f"{key} must be a number, got {_shown(value)}")
    value = float(value)
    if not math.isfinite(value):
      raise ConfigError(f"{key} must be finite, got {_shown(value)}")
    return value
  if annotation is str:
    if not isinstance(value, str):
      raise ConfigError(f"{key} must be a string, got {_shown(value)}")
    return value
  raise TypeError(f"unsupported config type {annotation!r} for {key}")


def _build(cls, obj: Mapping[str, Any], prefix: str = ""):
  hints = typing.get_type_hints(cls)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(obj) - fields)
  if unknown:
    close = difflib.get_close_matches(str(unknown[0]), sorted(fields), n=1)
    hint = (
      f"did you mean '{prefix}{close[0]}'?"
      if close
      else "known keys: " + ", ".join(prefix + f for f in sorted(fields))
    )
    raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'; {hint}")
  return cls(**{k: _coerce(prefix + k, v, hints[k]) for k, v in obj.items()})


def parse_override(text: str) -> tuple[list[str], Any]:
  """'participation.min_sep=20' -> (['participation', 'min_sep'], 20); values are YAML scalars."""
  import yaml  # pylint: disable=g-import-not-at-top

  key, sep, raw = text.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"--set expects KEY=VALUE, got {text!r}")
  try:
    value = yaml.safe_load(raw) if raw.strip() else None
  except yaml.YAMLError:
    value = raw
  if isinstance(value, dict) or isinstance(value, list) and key.strip() != "workers":
    raise ConfigError(f"--set {key}: expected a single value, got {raw!r}")
  return key.strip().split("."), value


def apply_overrides(obj: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
  """A copy of the raw config dict with every dotted `KEY=VALUE` override applied."""
  out = json.loads(json.dumps(obj))
  for text in overrides:
    path, value = parse_override(text)
    node = out
    for part in path[:-1]:
      child = node.get(part)
      if child is None:
        child = node[part] = {}
      if not isinstance(child, dict):
        raise ConfigError(f"--set {'.'.join(path)}: '{part}' is not a section")
      node = child
    node[path[-1]] = value
  return out


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
  """The raw mapping of a YAML config file (one-line errors for missing or malformed files)."""
  import yaml  # pylint: disable=g-import-not-at-top

  path = Path(path)
  if not path.is_file():
    raise ConfigError(f"config file not found: {path}")
  try:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
  except (yaml.YAMLError, UnicodeDecodeError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ConfigError(f"config file {path} is not valid YAML: {first}") from None
  if obj is None:
    return {}
  if not isinstance(obj, dict):
    raise ConfigError(f"config file {path} must hold a mapping of keys, got {type(obj).__name__}")
  return obj


def tff_cache_dir() -> str:
  """Where TFF's dataset loaders keep their files (`download.get_compressed_file`: ~/.tff)."""
  return os.path.join(os.path.expanduser("~"), ".tff")


def load_config(
  path: Optional[str | os.PathLike], overrides: Sequence[str] = (), data_dir: Optional[str] = None
) -> TrainingConfig:
  """The validated config of a YAML file (or the defaults) with overrides and --data-dir."""
  raw = read_yaml(path) if path is not None else {}
  raw = apply_overrides(raw, overrides)
  if data_dir is not None:
    raw["data_dir"] = str(data_dir)
  elif raw.get("task") == "stackoverflow" and not raw.get("data_dir"):
    # Where tff.simulation.datasets.stackoverflow.load_data() leaves the file (issue 26, B.7).
    if os.path.isfile(os.path.join(tff_cache_dir(), "stackoverflow.sqlite")):
      raw["data_dir"] = tff_cache_dir()
  try:
    return _build(TrainingConfig, raw).validate()
  except RecursionError:
    raise ConfigError("config is nested too deeply") from None


def config_from_dict(obj: Mapping[str, Any]) -> TrainingConfig:
  """A validated config from a plain dict (e.g. a run's config.json, whose run_id is not a key)."""
  obj = {k: v for k, v in obj.items() if k != "run_id"}
  return _build(TrainingConfig, obj).validate()
