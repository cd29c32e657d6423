"""FedAvg process builders wired to the fedmf DP aggregator.

Layer 3 of docs/architecture.md. Thin helpers around
`tff.learning.algorithms.build_unweighted_fed_avg` / `build_weighted_fed_avg`
with `model_aggregator=build_dp_aggregator(...)` (weighted: wrapped in
`tff.aggregators.as_weighted_aggregator`; DP needs the unweighted mean, so the
weights are ignored by the DP part).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from fedmf.tff.aggregators import build_dp_aggregator

__all__ = ['build_dp_fed_avg']


def build_dp_fed_avg(
  model_fn: Callable[[], Any],
  strategy: Any,
  *,
  noise_multiplier: float,
  clip_norm: float,
  clients_per_round: int,
  client_optimizer_fn: Any,
  server_optimizer_fn: Any,
  noise_seed: Optional[int] = None,
  num_rounds: Optional[int] = None,
  weighted: bool = False,
) -> tff.learning.templates.LearningProcess:
  """FedAvg whose model update mean is the fedmf DP mean for `strategy`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`
      (or a functional model, as TFF accepts).
    strategy: strategy object, dict or JSON path (see `build_dp_aggregator`).
    noise_multiplier: σ applied to C as loaded.
    clip_norm: L2 clip of each client's model delta.
    clients_per_round: fixed denominator of the DP mean.
    client_optimizer_fn: e.g. `tff.learning.optimizers.build_sgdm(0.1)`.
    server_optimizer_fn: e.g. `tff.learning.optimizers.build_sgdm(1.0, 0.9)`.
    noise_seed: None draws one from OS randomness at `initialize()`.
    num_rounds: horizon for banded strategies.
    weighted: use `build_weighted_fed_avg` with `as_weighted_aggregator`.

  Returns:
    A `tff.learning.templates.LearningProcess`.
  """
  aggregator = build_dp_aggregator(
    strategy,
    noise_multiplier=noise_multiplier,
    clip_norm=clip_norm,
    clients_per_round=clients_per_round,
    noise_seed=noise_seed,
    num_rounds=num_rounds,
  )
  if weighted:
    return tff.learning.algorithms.build_weighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer_fn,
      server_optimizer_fn=server_optimizer_fn,
      model_aggregator=tff.aggregators.as_weighted_aggregator(aggregator),
    )
  return tff.learning.algorithms.build_unweighted_fed_avg(
    model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    model_aggregator=aggregator,
  )
