"""A training run, built once, and one round of it: what `fedmf simulate` and `fedmf train` share.

(Not the loop over the rounds: that is `fedmf.program.logic.run_rounds`.) One concept: a run of
DP FedAvg (`TrainingRun`, made by `build_run`) and its round (the papers' FedSGDM; BandMF App. I,
BLT Alg. 1):

  1. the participation model draws the cohort (device timer, schedule or sampling);
  2. TFF runs the federated part: broadcast, one local epoch of client SGD, clipping to ζ, the sum
     (`fedmf.tff.rounds`, in chunks by `fedmf.tff.runner`);
  3. the server adds ζ·σ·[C⁻¹ z]_t from the strategy's stream (computed in a background thread
     during step 2), divides by the clients per round and applies SGD with momentum under the
     learning-rate schedule (`fedmf.program.server`);
  4. with `clip_norm: adaptive`, the server releases the noisy count of clients within ζ_t and
     moves ζ toward the target quantile for the next round (`fedmf.tff.adaptive_clip`; Andrew et
     al. 2021): round t clips to and scales its noise by ζ_t (`TrainingRun.clip_norm`);
  5. the privacy meter records who took part.

`build_run(config)` makes everything a run needs, once (the participation data source, the
strategy and plan, the TFF computation, the server state and the seeded noise stream);
`train_round(run, cohort)` does steps 2-4 for a drawn cohort. The program logic
(`fedmf.program.logic`), shared by `fedmf simulate` and `fedmf train`, loops over the rounds.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fedmf import display
from fedmf import participation as participation_lib
from fedmf.mf import resources
from fedmf.participation import Cohort
from fedmf.program import plan as plan_lib
from fedmf.program import platform
from fedmf.program import preflight
from fedmf.program import server as server_lib
from fedmf.config_parse import ConfigError
from fedmf.program.config import TrainingConfig
from fedmf.program.meter import PrivacyMeter
from fedmf.tasks import model_sizes
from fedmf.tff import dp_mean
from fedmf.tff import host_noise
from fedmf.errors import FedmfUserError

logger = logging.getLogger("fedmf.train")


@dataclasses.dataclass
class RoundRecord:
  """What one round did (a row of metrics.csv)."""

  round: int
  clients: int
  loss: float
  round_seconds: float
  learning_rate: float
  noise_stddev: float
  checked_in: int = 0
  refused_checkins: int = 0
  early_admitted: int = 0
  clipped: int = 0
  zeroed: int = 0
  # ζ_t, the clip norm of this round (fixed or adaptive), and with adaptive clipping the noisy
  # fraction of clients within it that moved ζ (b̃_t; metrics.csv of adaptive runs only).
  clip_norm: Optional[float] = None
  unclipped_fraction: Optional[float] = None
  accuracy: Optional[float] = None
  test_loss: Optional[float] = None
  epsilon: Optional[float] = None
  # The round's noisy mean (what the release journal hashes); not a metric.
  noisy_mean: Optional[list] = dataclasses.field(default=None, repr=False, compare=False)
  # The log ids of the canaries inserted this round (`canaries:`); not a metric.
  canary_ids: list = dataclasses.field(default_factory=list, repr=False, compare=False)

  def to_dict(self) -> dict[str, Any]:
    return {
      f.name: getattr(self, f.name)
      for f in dataclasses.fields(self)
      if f.name not in ("noisy_mean", "canary_ids")
    }


# metrics.csv columns that are counts (released as floats by the program logic, written as ints).
INT_METRICS = frozenset(f.name for f in dataclasses.fields(RoundRecord) if f.type in ("int", int))


@dataclasses.dataclass
class TrainingRun:
  """Everything a run holds (secrets included: the noise seed and buffers).

  `data_iterator` is the run's participation data source iterator
  (`fedmf.program.data_source.ParticipationIterator`): it draws the cohorts and is checkpointed
  with the program state; `participation` is its participation model.
  """

  config: TrainingConfig
  task: Any
  data_iterator: Any
  plan: plan_lib.PrivacyPlan
  runner: Any
  noise: Optional[host_noise.HostNoise]
  server: server_lib.ServerState
  meter: PrivacyMeter
  shapes: list[tuple[int, ...]]
  noise_seed: int = 0
  # The strategy's stream when the run trains with noise (None without DP), and whether its
  # rounds are computed while TFF trains the clients; `noise` is its state, from `start_noise`.
  noise_stream: Any = None
  noise_overlap: bool = True
  # With `clip_norm: adaptive`: ζ on the host (`fedmf.tff.adaptive_clip.HostAdaptiveClip`), started
  # with the noise (its count noise is keyed by the noise seed); None for a fixed clip.
  clip: Any = None
  # The run's canary clients (`fedmf.program.canaries.RunCanaries`), None without `canaries:`.
  canaries: Any = None

  @property
  def participation(self) -> participation_lib.ParticipationModel:
    return self.data_iterator.model

  @property
  def adaptive(self) -> bool:
    return self.config.recipe.adaptive

  @property
  def clip_norm(self) -> float:
    """ζ of the next round to train: the fixed clip norm, or the adaptive clip's ζ_t (what round
    t clips to and scales its noise by; `RoundRecord.clip_norm` records it per round)."""
    if not self.adaptive:
      return self.config.recipe.clip_norm
    if self.clip is None:
      raise RuntimeError("start_noise(run) before training: the adaptive clip starts with it")
    return float(self.clip.value)

  @property
  def noise_scale(self) -> float:
    """ζ·σ on the sum of the next round (σ as used in training)."""
    return self.clip_norm * self.plan.training_noise_multiplier


class TrainingDiverged(FedmfUserError):
  """A round whose loss or model is not finite: the run stops before releasing it (one line)."""


def check_finite(run: TrainingRun, round_index: int, result) -> None:
  """Stops the run at the first non-finite training loss or model weight (issue 26, A.3).

  A loss of nan or inf means some client's local training diverged (its update may have been
  zeroed, but the recipe is broken); a non-finite weight would poison every later round. Zeroed
  updates alone do not stop a run: they are counted (metrics.csv `zeroed`, summary.json).
  """
  what = None
  if result.clients and not math.isfinite(result.loss):  # (TFF counts no examples then)
    what = f"the training loss is {result.loss}"
  elif not all(np.all(np.isfinite(w)) for w in run.server.weights):
    what = "the model has non-finite weights"
  if what is not None:
    raise TrainingDiverged(
      f"round {round_index}: training diverged ({what}); stopped before releasing the round: "
      "lower client_learning_rate or server_learning_rate"
    )


# The client round of each model and recipe built in this process. Building it traces the model
# through TFF (6-12 s, the largest fixed cost of a small run); a process that runs several
# simulations (the test suite, a notebook, simulations/compare_mechanisms.py) builds it once. The
# computation is a function of the key alone: the model's architecture and input spec, and the
# recipe's constants; weights, data and noise are its arguments or the host's.
_CLIENT_ROUNDS: dict[tuple, Any] = {}


def _client_round_key(config: TrainingConfig, functional: Any, recipe: dict) -> Optional[tuple]:
  """What the client round of a config's own task depends on, or None (not a FunctionalModel)."""
  if functional is None:
    return None
  task = config.task
  return (
    task.name,
    task.model,
    task.vocab_size,
    task.sequence_length,
    task.batch_size,
    repr(functional.input_spec),
    tuple(sorted(recipe.items())),
  )


def build_run(
  config: TrainingConfig,
  *,
  cache: Optional[Path] = None,
  noise_seed: Optional[int] = None,
  task: Any = None,
  overlap: bool = True,
  noise: bool = True,
  pool: Any = None,
) -> TrainingRun:
  """Task, participation data source, strategy, privacy plan, TFF computation, server state and
  noise stream: everything a run needs, built once.

  `task` replaces the config's task with your own `fedmf.tasks.Task` (your data and model).
  `noise_seed` (default: the config's, else drawn from OS randomness) seeds the noise; `overlap`
  computes each round's noise while TFF trains the clients (the same noise either way).
  `noise=False` leaves the noise stream's buffers unallocated until `start_noise(run, seed)`: a
  resumed program learns its seed from the checkpoint (`fedmf.program.train`). `pool` (the
  `WorkerPool` that `platform.execution` yields, None for one local worker) trains the rounds'
  chunks of clients (`platform.round_runner`).
  Needs an installed TFF execution context for the computations it builds to run later.
  """
  from fedmf import tasks  # pylint: disable=g-import-not-at-top
  from fedmf.program.data_source import ParticipationIterator  # pylint: disable=g-import-not-at-top
  from fedmf.tff.rounds import build_client_round  # pylint: disable=g-import-not-at-top
  from fedmf.tff.runner import RoundRunner  # pylint: disable=g-import-not-at-top

  built_from_config = task is None
  if task is None:
    preflight.check(config)  # What the CLI checked before TensorFlow, for library callers.
    if config.canaries.enabled:
      from fedmf.program import canaries as canaries_lib  # pylint: disable=g-import-not-at-top
      from fedmf.tasks import models  # pylint: disable=g-import-not-at-top

      canaries_lib.check_fits(
        config.canaries, models.count_params(config.task.model, config.task.vocab_size)
      )
    task = tasks.build_task(
      tasks.TaskSpec(
        task=config.task.name,
        num_clients=config.task.num_clients,
        vocab_size=config.task.vocab_size,
        preset=config.task.model,
        sequence_length=config.task.sequence_length,
        batch_size=config.task.batch_size,
        max_sentences=config.task.max_sentences_per_client,
        test_sentences=config.task.test_sentences,
        seed=config.program.seed,
        data_dir=config.task.data_dir,
      )
    )
  if config.program.clients_per_round > task.num_clients:
    raise ConfigError(
      f"clients_per_round ({config.program.clients_per_round}) exceeds the task's "
      f"{task.num_clients} training clients"
    )
  # Devices' timers, counts and the privacy meter: about 64 bytes per device.
  resources.check(
    resources.Cost.of(f"the state of {task.num_clients} devices", 64.0 * task.num_clients),
    f"simulating a population of {task.num_clients} devices",
  )
  poisson_groups = config.poisson_groups  # (the run's devices' and its canaries')
  iterator = ParticipationIterator.create(
    config.participation,
    task.num_clients,
    config.program.clients_per_round,
    config.program.seed,
    poisson_groups,
    client_id=task.client_id,
  )
  model = iterator.model
  schema = model.declared_schema(config.program.rounds)
  plan = plan_lib.plan_run(config, model, schema, cache)
  strategy = plan.strategy
  weights = task.initial_weights(config.program.seed)
  shapes = [tuple(w.shape) for w in weights]
  # A task may give its model as a FunctionalModel (cheaper per client in the worker).
  functional = getattr(task, "functional_model", lambda: None)()
  learning_model = task.model_fn() if functional is None else functional
  recipe = dict(
    client_learning_rate=config.recipe.client_learning_rate,
    # None: the round takes the adaptive clip's ζ_t as an argument.
    clip_norm=None if config.recipe.adaptive else config.recipe.clip_norm,
    zeroing_linf=config.recipe.zeroing_linf,
  )
  key = _client_round_key(config, functional, recipe) if built_from_config else None
  client_round = _CLIENT_ROUNDS.get(key) if key is not None else None
  if client_round is None:
    client_round, _ = build_client_round(learning_model, **recipe)
    if key is not None:
      _CLIENT_ROUNDS[key] = client_round
  # The chunks fix the order of the float sums: the same whatever the platform (workers).
  clients_per_call = config.platform.clients_per_call or model_sizes.CLIENTS_PER_CALL.get(
    getattr(task, "preset", None)
  )
  runner = platform.round_runner(
    RoundRunner(client_round, shapes, clients_per_call), config.program.clients_per_round, pool
  )
  stream = strategy.noise_stream(config.program.rounds)
  model_bytes = 4.0 * sum(int(np.prod(s)) for s in shapes)
  buffers = stream.model_buffers(config.program.rounds)
  resources.check(
    resources.Cost.of(
      f"{buffers} model-sized noise buffers of {model_bytes / 2**20:.3g} MiB",
      (buffers + 3) * model_bytes,
    ),
    f"the {strategy.describe()} noise stream",
  )
  if noise_seed is None:
    noise_seed = (
      config.privacy.noise_seed
      if config.privacy.noise_seed is not None
      else dp_mean.draw_noise_seed()
    )
  run_canaries = None
  if config.canaries.enabled:
    from fedmf.program import canaries as canaries_lib  # pylint: disable=g-import-not-at-top

    run_canaries = canaries_lib.build(
      config.canaries,
      config.participation,
      clients_per_round=config.program.clients_per_round,
      rounds=config.program.rounds,
      shapes=shapes,
      schema=schema,
      strategy=strategy,
      num_clients=task.num_clients,
      poisson_groups=poisson_groups,
    )
  run = TrainingRun(
    config=config,
    task=task,
    data_iterator=iterator,
    plan=plan,
    runner=runner,
    noise=None,
    server=server_lib.initial_server_state(weights),
    meter=PrivacyMeter(
      strategy,
      plan.noise_multiplier,
      config.privacy.delta,
      task.num_clients,
      count_noise_multiplier=plan.count_noise_multiplier,
    ),
    shapes=shapes,
    noise_seed=noise_seed,
    noise_stream=stream if plan.training_noise_multiplier > 0 else None,
    noise_overlap=overlap,
    canaries=run_canaries,
  )
  if noise:
    start_noise(run)
  return run


def start_noise(run: TrainingRun, seed: Optional[int] = None) -> None:
  """Allocates the run's noise stream state (round 0) for `seed` (default: the run's), and starts
  an adaptive clip at its initial ζ (its count noise is keyed by the same seed)."""
  if run.noise is not None or run.clip is not None:
    raise RuntimeError("the run's noise stream is already started")
  if seed is not None:
    run.noise_seed = seed
  if run.noise_stream is not None:
    run.noise = host_noise.HostNoise(
      run.noise_stream, run.shapes, run.noise_seed, overlap=run.noise_overlap
    )
  if run.adaptive:
    from fedmf.tff import adaptive_clip  # pylint: disable=g-import-not-at-top  (imports TensorFlow)
    from fedmf.tff import dp_mean  # pylint: disable=g-import-not-at-top

    plan = run.plan
    run.clip = adaptive_clip.HostAdaptiveClip(
      plan.adaptive_clip,
      dp_mean.seed_key(run.noise_seed),
      adaptive_clip.count_stddev(plan.training_count_noise_multiplier),
    )


def noise_state_template(run: TrainingRun) -> list:
  """The structure of the run's noise state (flat arrays), without allocating the stream's
  buffers: views of the started stream's, or a zero-size stream's (for loading a checkpoint)."""
  if run.noise is not None:
    return run.noise.state(copy=False)
  if run.noise_stream is None:
    return []
  tiny = [(1,)] * len(run.shapes)  # The layout of a kernel's state does not depend on sizes.
  return host_noise.HostNoise(run.noise_stream, tiny, 0).state(copy=False)


def draw_cohort(run: TrainingRun, round_index: int) -> Cohort:
  return run.participation.sample(round_index)


def train_round(run: TrainingRun, cohort: Cohort) -> RoundRecord:
  """Steps 2-4 of the module docstring for a drawn cohort; updates the run in place."""
  c = run.config
  r = cohort.round
  start = time.perf_counter()
  if run.noise is None and run.noise_stream is not None:
    raise RuntimeError("start_noise(run) before training: the run trains with noise")
  if run.noise is not None:
    run.noise.prefetch()  # The noise does not depend on the data: computed during the TFF call.
  from fedmf.tff import client_data  # pylint: disable=g-import-not-at-top  (imports TensorFlow)

  # Autotuning off for every task's datasets, a user's own too: it stalls TFF's worker.
  datasets = client_data.worker_datasets([run.task.client_dataset(int(i)) for i in cohort.clients])
  clip = run.clip_norm  # ζ_t
  noise_scale = run.noise_scale
  result = run.runner.run(run.server.weights, datasets, clip if run.adaptive else None)
  canary_ids = []
  if run.canaries is not None:  # They join the clipped sum before the noise, like a client, at ζ_t.
    canary_ids = run.canaries.insert(r, result.clipped_sum, clip)
  row_norm = run.noise.row_norm() if run.noise is not None else 0.0
  noise = run.noise.next() if run.noise is not None else None
  lr = server_lib.learning_rate(
    r,
    c.program.rounds,
    c.recipe.server_learning_rate,
    c.recipe.warmup_fraction,
    c.recipe.cooldown_fraction,
    c.recipe.cooldown_factor,
  )
  mean = server_lib.server_update(
    run.server,
    result.clipped_sum,
    noise,
    noise_scale,
    c.program.clients_per_round,
    lr,
    c.recipe.server_momentum,
  )
  check_finite(run, r, result)
  fraction = None
  if run.adaptive:  # Round t's count release: ζ_{t+1} for the next round.
    fraction = run.clip.update(r, result.within, result.clients)
  if run.canaries is not None:
    run.canaries.project(r, mean, c.program.clients_per_round)
  run.meter.record(r, cohort.clients)
  return RoundRecord(
    round=r,
    clients=int(cohort.clients.size),
    loss=result.loss,
    round_seconds=time.perf_counter() - start,
    learning_rate=lr,
    noise_stddev=noise_scale * row_norm / c.program.clients_per_round,
    checked_in=cohort.checked_in,
    refused_checkins=cohort.refused,
    early_admitted=cohort.early_admitted,
    clipped=result.clipped,
    zeroed=result.zeroed,
    clip_norm=clip,
    unclipped_fraction=fraction,
    noisy_mean=mean,
    canary_ids=canary_ids,
  )


def evaluate(run: TrainingRun, record: Optional[RoundRecord] = None) -> dict[str, float]:
  """Test accuracy and loss of the current model; fills them (and ε so far) into `record`."""
  metrics = run.task.evaluate(run.server.weights)
  if record is not None:
    record.accuracy = metrics["accuracy"]
    record.test_loss = metrics["loss"]
    record.epsilon = run.meter.epsilon(record.round + 1)
  return metrics


def format_epsilon(eps: Optional[float]) -> str:
  """ε for people: three significant digits, rounded up (`fedmf.display.epsilon`)."""
  return display.epsilon(eps)
