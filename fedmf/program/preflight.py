"""What `fedmf simulate` and `fedmf train` check before TensorFlow is imported or data generated.

One concept: refusals that cost a second, not a minute (issue 38 items 12-13). Everything here
reads the config alone (numpy-free arithmetic on its numbers), so the CLI calls `check(config)`
before it imports TensorFlow; `fedmf.program.training_run.build_run` repeats the same checks for
library callers that skip the CLI.

* the model: its parameters (closed form, `fedmf.tasks.model_sizes`) times the copies a run holds,
  against `--max-memory`;
* cyclic Poisson sampling: its sampling probability and expected cohort, on the synthetic task's
  population (StackOverflow's is known only from its file, and is checked when the task is built).
"""

from __future__ import annotations

from typing import Optional

from fedmf.mf import resources
from fedmf.participation import ParticipationError, schedules
from fedmf.program.config import ConfigError, TrainingConfig
from fedmf.tasks import model_sizes

# Model copies a run holds besides the TFF call: the task's Keras model, the server's weights,
# momentum, noisy mean and clipped sum, and the prefetched noise.
HOST_MODEL_COPIES = 6
# Per client in one TFF call: about 54 MB for the 4.05M-parameter LSTM (16.2 MB of weights), i.e.
# 3.3 model copies (weights, gradients, optimizer slots, the update), measured for
# `model_sizes.CLIENTS_PER_CALL`.
CLIENT_MODEL_COPIES = 3.3


def check(config: TrainingConfig) -> None:
  """Refuses, in one line, a run that cannot work, from its config alone (see the docstring)."""
  check_model_memory(config)
  check_sampling(config, config.task.num_clients if config.task.name == "synthetic" else None)


def model_state_cost(config: TrainingConfig) -> resources.Cost:
  """The model, optimizer and client-call state of the config's model, before any is allocated
  (issue 26, A.5); the noise stream's buffers are estimated once the strategy is known."""
  params = model_sizes.count_params(config.task.model, config.task.vocab_size)
  per_call = min(
    config.program.clients_per_round,
    model_sizes.CLIENTS_PER_CALL.get(config.task.model, config.program.clients_per_round),
  )
  copies = HOST_MODEL_COPIES + CLIENT_MODEL_COPIES * per_call
  return resources.Cost.of(
    f"{params:,} float32 parameters x {copies:.0f} copies (model, server optimizer, noise, "
    f"{per_call} clients per TFF call)",
    4.0 * params * copies,
  )


def check_model_memory(config: TrainingConfig) -> None:
  resources.check(
    model_state_cost(config),
    f"training {config.task.model} at vocab_size {config.task.vocab_size}",
  )


def check_sampling(config: TrainingConfig, num_clients: Optional[int]) -> None:
  """Cyclic Poisson sampling that cannot work on `num_clients` devices (None: not known yet):
  a sampling probability above 1, or an expected cohort that is not clients_per_round."""
  p = config.participation
  if p.model != "cyclic_poisson" or num_clients is None:
    return
  groups = p.min_sep if p.min_sep is not None else config.poisson_groups
  try:
    schedules.CyclicPoisson.sampling_probability_for(
      num_clients, config.program.clients_per_round, groups, p.sampling_probability
    )
  except ParticipationError as e:
    raise ConfigError(str(e)) from None
