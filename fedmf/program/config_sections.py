"""The sections of a run's config, one concern each: task, privacy, recipe, program, platform.

A `TrainingConfig` (fedmf.program.config) is these sections and the participation section
(`fedmf.participation.ParticipationConfig`). Each section checks its own values; checks across
sections live in `TrainingConfig.validate`. Lower packages get the section they use, not the whole
config: the task builder the task section, the planner the privacy section with the rounds.

Every key also has a flat name, the one the docs and `--set` use (`clip_norm`, not
`recipe.clip_norm`); error messages name keys by it. The task section's `name` is the flat `task`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Optional, Sequence

from fedmf.config_parse import ConfigError
from fedmf.config_parse import shown
from fedmf.errors import FedmfUserError
from fedmf.privacy.adaptive_clip import AdaptiveClip

TASKS = ("synthetic", "stackoverflow")
MODELS = ("lstm-small", "lstm-paper")
MECHANISMS = ("dpsgd", "tree", "bandmf", "blt")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """`task:` what is learned and from which data (docs/simulation.md, *Config keys*).

  name: synthetic | stackoverflow (the flat key `task`). num_clients: the synthetic population
  (StackOverflow: the training clients in the file). model: lstm-small | lstm-paper. vocab_size:
  words in the vocabulary (without pad/bos/eos/OOV). sequence_length, max_sentences_per_client,
  batch_size: preprocessing (StackOverflow: 20, 256, 16 in the papers). test_sentences: the
  held-out sample. data_dir: the directory holding stackoverflow.sqlite.
  """

  name: str = "synthetic"
  num_clients: int = 2000
  model: str = "lstm-small"
  vocab_size: int = 1000
  sequence_length: int = 20
  max_sentences_per_client: int = 256
  batch_size: int = 16
  test_sentences: int = 2000
  data_dir: Optional[str] = None

  def validate(self) -> None:
    choice("task", self.name, TASKS)
    choice("model", self.model, MODELS)
    for key in (
      "num_clients",
      "vocab_size",
      "sequence_length",
      "max_sentences_per_client",
      "batch_size",
      "test_sentences",
    ):
      at_least(key, getattr(self, key), 1)


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
  """`budget:` the training program stops cleanly before ε would exceed `epsilon` (None: no guard)."""

  epsilon: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class ProgramConfig:
  """`program:` the rounds and what the program does around them.

  rounds, clients_per_round: n and B. eval_every: the evaluation period (rounds). seed: data,
  model initialization and cohorts. checkpoint_every (rounds) and budget.epsilon: the training
  program's checkpoints and privacy budget guard.
  """

  rounds: int = 200
  clients_per_round: int = 20
  eval_every: int = 10
  seed: int = 0
  checkpoint_every: int = 10
  budget: BudgetConfig = BudgetConfig()

  def is_eval_round(self, round_index: int) -> bool:
    """Whether the model is evaluated after 0-based round `round_index`: every eval_every rounds
    and after the last."""
    return (round_index + 1) % self.eval_every == 0 or round_index + 1 == self.rounds

  def validate(self) -> None:
    for key in ("rounds", "clients_per_round", "eval_every", "checkpoint_every"):
      at_least(key, getattr(self, key), 1)
    seed_in_range("seed", self.seed)
    if self.budget.epsilon is not None:
      positive("budget.epsilon", self.budget.epsilon)


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
  """`privacy:` the mechanism and its noise.

  mechanism: dpsgd | tree | bandmf | blt, optimized for the run's own schema and cached (bands:
  BandMF b̂, default the min-sep; buffers: BLT buffers), or strategy: a strategy file (replaces
  mechanism; refused if it was optimized for another (n, b) unless force_strategy).
  target_epsilon, or noise_multiplier (σ, applied to C as loaded; 0 = no DP, for comparison),
  which takes precedence when both are set. delta. reference_clients_per_round: the papers'
  cheap-simulation trick (BandMF App. I): train on clients_per_round but scale σ as for this
  many; accounting is for the reference run. noise_seed: the DP noise (None: OS randomness).
  """

  mechanism: str = "blt"
  bands: Optional[int] = None
  buffers: Optional[int] = None
  strategy: Optional[str] = None
  force_strategy: bool = False
  target_epsilon: Optional[float] = None
  noise_multiplier: Optional[float] = None
  delta: float = 1e-6
  reference_clients_per_round: Optional[int] = None
  noise_seed: Optional[int] = None

  def validate(self) -> None:
    choice("mechanism", self.mechanism, MECHANISMS)
    for key in ("bands", "buffers", "reference_clients_per_round"):
      if getattr(self, key) is not None:
        at_least(key, getattr(self, key), 1)
    if self.target_epsilon is None and self.noise_multiplier is None:
      raise ConfigError(
        "give target_epsilon or noise_multiplier (noise_multiplier: 0 trains "
        "without DP, for comparison)"
      )
    if self.target_epsilon is not None:
      positive("target_epsilon", self.target_epsilon)
    if self.noise_multiplier is not None and not (
      math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0
    ):
      raise ConfigError(
        f"noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}"
      )
    if not 0 < self.delta < 1:
      raise ConfigError(f"delta must lie in (0, 1), got {self.delta!r}")
    seed_in_range("noise_seed", self.noise_seed)


# `clip_norm`: a fixed ζ, or ADAPTIVE (quantile-based adaptive clipping, section `adaptive_clip`).
ADAPTIVE = "adaptive"
ClipValue = typing.Union[float, str]


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
  """`recipe:` the papers' training recipe (BandMF App. I; BLT §5).

  clip_norm ζ, or `adaptive`: ζ follows a quantile of the update norms (Andrew et al. 2021; the
  section adaptive_clip: target_quantile, initial, learning_rate, count_noise_multiplier or
  count_budget_fraction; `fedmf.privacy.adaptive_clip`). client_learning_rate,
  server_learning_rate, server_momentum, warmup_fraction, cooldown_fraction, cooldown_factor,
  zeroing_linf (updates whose largest |entry| exceeds it are zeroed; None disables).
  """

  clip_norm: ClipValue = 1.0
  client_learning_rate: float = 1.0
  server_learning_rate: float = 1.0
  server_momentum: float = 0.95
  warmup_fraction: float = 0.15
  cooldown_fraction: float = 0.25
  cooldown_factor: float = 0.05
  zeroing_linf: Optional[float] = 100.0
  adaptive_clip: AdaptiveClip = AdaptiveClip()

  @property
  def adaptive(self) -> bool:
    """ζ is adaptive (`clip_norm: adaptive`)."""
    return self.clip_norm == ADAPTIVE

  @property
  def initial_clip_norm(self) -> float:
    """ζ of round 0: the fixed clip norm, or adaptive_clip.initial."""
    return float(self.adaptive_clip.initial if self.adaptive else self.clip_norm)

  def validate(self) -> None:
    if self.adaptive:
      try:
        self.adaptive_clip.validate()
      except FedmfUserError as e:
        raise ConfigError(str(e)) from None
    else:
      if isinstance(self.clip_norm, str):
        raise ConfigError(
          f"clip_norm must be a number > 0 or {ADAPTIVE}, got {shown(self.clip_norm)}"
        )
      positive("clip_norm", self.clip_norm)
      if self.adaptive_clip != AdaptiveClip():
        raise ConfigError(
          f"adaptive_clip has no effect here (clip_norm is {self.clip_norm:g}, not {ADAPTIVE}): "
          "remove it, or set clip_norm: adaptive"
        )
    for key in ("client_learning_rate", "server_learning_rate", "cooldown_factor"):
      positive(key, getattr(self, key))
    if self.zeroing_linf is not None:
      positive("zeroing_linf", self.zeroing_linf)
    if not 0 <= self.server_momentum < 1:
      raise ConfigError(f"server_momentum must lie in [0, 1), got {self.server_momentum!r}")
    for key in ("warmup_fraction", "cooldown_fraction"):
      if not 0 <= getattr(self, key) <= 1:
        raise ConfigError(f"{key} must lie in [0, 1], got {getattr(self, key)!r}")
    if self.warmup_fraction + self.cooldown_fraction > 1:
      raise ConfigError("warmup_fraction + cooldown_fraction must not exceed 1")


CANARY_PATTERNS = ("participation", "worst-case")


@dataclasses.dataclass(frozen=True)
class CanariesConfig:
  """`canaries:` canary clients that measure the privacy the run really has (issue 33;
  docs/empirical-privacy.md). Its keys keep their section: `canaries.count`.

  count: canaries inserted (0: off), on average (2·min(count, held_out) of them on fair coins).
  held_out: canaries drawn but never inserted (the null), on average. seed: their directions,
  coins and rounds (None: drawn from OS randomness, kept in the checkpoint and canaries.npz).
  pattern: participation (they join rounds like devices of the run's participation model) or
  worst-case (every canary joins the rounds attaining the strategy's sensitivity under the
  declared (b, k)).
  """

  count: int = 0
  held_out: int = 0
  seed: Optional[int] = None
  pattern: str = "participation"

  def validate(self) -> None:
    at_least("canaries.count", self.count, 0)
    at_least("canaries.held_out", self.held_out, 0)
    seed_in_range("canaries.seed", self.seed)
    choice("canaries.pattern", self.pattern, CANARY_PATTERNS)
    if self.count == 0:
      default = CanariesConfig()
      for key in ("held_out", "seed", "pattern"):
        if getattr(self, key) != getattr(default, key):
          raise ConfigError(
            f"canaries.{key} has no effect here (canaries.count is 0: no canaries): remove it, "
            "or set canaries.count"
          )
      return
    if self.held_out < 2:
      raise ConfigError(
        f"canaries.held_out must be an integer >= 2 with canaries (the null the inserted "
        f"canaries are compared with), got {shown(self.held_out)}"
      )

  @property
  def enabled(self) -> bool:
    return self.count > 0


@dataclasses.dataclass(frozen=True)
class WorkerTLSConfig:
  """`worker_tls:` PEM files for mutual TLS with remote workers (see deploy/README.md)."""

  ca: str = ""  # the CA that signed the workers' certificates
  cert: str = ""  # the coordinator's client certificate
  key: str = ""  # its private key


# `workers`: a count of local workers, or the "host:port" / "unix:PATH" addresses of `fedmf worker`
# services.
WorkersValue = typing.Union[int, tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class PlatformConfig:
  """`platform:` where the clients are trained; the model is bit-identical whatever it says.

  workers (0: one local TFF worker; W: W local workers; a list of "host:port" or "unix:PATH":
  `fedmf worker` services), worker_tls ({ca, cert, key}: mutual TLS with them, required for every
  TCP address, loopback included), worker_timeout_s (a chunk of clients not finished by then goes
  to another worker; measured per call after a worker's first call, which may take 10 times
  as long), worker_isolation (namespace: local workers run in a network namespace of their
  own, refusing to start where none can be made; none: accept TFF's open port there).
  clients_per_call: clients per TFF call (the chunks whose sums are added in order; default per
  model), which fixes the float sums.
  """

  workers: WorkersValue = 0
  worker_tls: Optional[WorkerTLSConfig] = None
  worker_timeout_s: float = 600.0
  worker_isolation: str = "namespace"
  clients_per_call: Optional[int] = None

  def validate(self) -> None:
    from fedmf.tff import channels, sandbox  # pylint: disable=g-import-not-at-top  (no TF import)

    if self.clients_per_call is not None:
      at_least("clients_per_call", self.clients_per_call, 1)
    positive("worker_timeout_s", self.worker_timeout_s)
    choice("worker_isolation", self.worker_isolation, sandbox.ISOLATION_POLICIES)
    tls = None
    if self.worker_tls is not None:
      try:
        tls = self.tls_files
      except FedmfUserError as e:
        raise ConfigError(str(e)) from None
    if isinstance(self.workers, int):
      at_least("workers", self.workers, 0)
      return
    if not self.workers:
      raise ConfigError(
        "workers must be a count >= 0 or a non-empty list of 'host:port' or 'unix:PATH'"
      )
    try:
      channels.check_remote_workers(self.workers, tls)
      if tls is not None:
        tls.read()  # Unreadable or non-PEM files are refused now, before any work.
    except FedmfUserError as e:
      raise ConfigError(f"workers: {e}") from None

  @property
  def tls_files(self):
    """`worker_tls` as `fedmf.tff.channels.TLSFiles` (None without it)."""
    if self.worker_tls is None:
      return None
    from fedmf.tff import channels  # pylint: disable=g-import-not-at-top

    return channels.TLSFiles.from_mapping(dataclasses.asdict(self.worker_tls))


# ---------------------------------------------------------------------------------------------
# Checks shared by the sections: one-line errors that show the value as the user wrote it.


def choice(key: str, value: Any, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {shown(value)}")


def at_least(key: str, value: int, minimum: int) -> None:
  if value < minimum:
    raise ConfigError(f"{key} must be an integer >= {minimum}, got {shown(value)}")


def positive(key: str, value: float) -> None:
  if not (math.isfinite(value) and value > 0):
    raise ConfigError(f"{key} must be a finite number > 0, got {shown(value)}")


def seed_in_range(key: str, value: Optional[int]) -> None:
  if value is not None and not 0 <= value < 2**64:
    raise ConfigError(f"{key} must be an integer in [0, 2^64), got {value!r}")
