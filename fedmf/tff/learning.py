"""FedAvg process builders wired to the fedmf DP aggregator.

Layer 3 of docs/architecture.md. Thin helpers around
`tff.learning.algorithms.build_unweighted_fed_avg` / `build_weighted_fed_avg`
with `model_aggregator=build_dp_aggregator(...)` (weighted: wrapped in
`tff.aggregators.as_weighted_aggregator`; DP needs the unweighted mean, so the
weights are ignored by the DP part). With `noise_on_host=True` the aggregator
takes each round's noise from the host instead (`fedmf.tff.host_noise`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import tensorflow_federated as tff

from fedmf.tff import host_noise
from fedmf.tff import noise as noise_lib
from fedmf.tff.aggregators import build_dp_aggregator

__all__ = ['build_dp_fed_avg', 'build_host_noise_fed_avg']


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
  noise_on_host: bool = False,
  record_aggregation_factory: Any = None,
  **fed_avg_kwargs: Any,
):
  """FedAvg whose model update mean is the fedmf DP mean for `strategy`.

  Args:
    model_fn: no-arg callable returning a `tff.learning.models.VariableModel`
      (or a functional model, as TFF accepts).
    strategy: strategy object, dict or JSON path (see `build_dp_aggregator`).
    noise_multiplier: σ applied to C as loaded.
    clip_norm: L2 clip of each client's model delta; or adaptive clipping, as
      `build_dp_aggregator` takes it (an `AdaptiveClip`, or 'adaptive').
    clients_per_round: fixed denominator of the DP mean.
    client_optimizer_fn: e.g. `tff.learning.optimizers.build_sgdm(0.1)`.
    server_optimizer_fn: e.g. `tff.learning.optimizers.build_sgdm(1.0, 0.9)`.
    noise_seed: None draws one from OS randomness (at `initialize()` for the
      factory; once, on the host, with `noise_on_host`).
    num_rounds: horizon for banded strategies.
    weighted: use `build_weighted_fed_avg` with `as_weighted_aggregator`.
    noise_on_host: keep the noise stream's state on the host, out of TFF's
      state (docs/aggregators.md: faster in your own loop; not one pure TFF
      computation). The same noise and model as the factory for the same seed.
    record_aggregation_factory: what sums the clipped records (`SumFactory()` or
      `SecureSumFactory(upper_bound_threshold=ζ, lower_bound_threshold=-ζ)`; see
      `build_dp_aggregator`).
    **fed_avg_kwargs: passed on to TFF's FedAvg builder (e.g. `loop_implementation`).

  Returns:
    A `tff.learning.templates.LearningProcess`; with `noise_on_host`, a
    `fedmf.tff.host_noise.HostNoiseFedAvg` used the same way (`initialize`,
    `next`), which you `close()` at the end.
  """
  if noise_on_host:
    stream = noise_lib.make_noise_stream(strategy, num_rounds=num_rounds)  # as the factory does
    aggregator = factory = host_noise.HostNoiseFactory(
      noise_multiplier=noise_multiplier,
      clip_norm=clip_norm,
      clients_per_round=clients_per_round,
      record_aggregation_factory=record_aggregation_factory,
    )
  else:
    aggregator = build_dp_aggregator(
      strategy,
      noise_multiplier=noise_multiplier,
      clip_norm=clip_norm,
      clients_per_round=clients_per_round,
      noise_seed=noise_seed,
      num_rounds=num_rounds,
      record_aggregation_factory=record_aggregation_factory,
    )
  build = tff.learning.algorithms.build_unweighted_fed_avg
  if weighted:
    build = tff.learning.algorithms.build_weighted_fed_avg
    aggregator = tff.aggregators.as_weighted_aggregator(aggregator)
  process = build(
    model_fn,
    client_optimizer_fn=client_optimizer_fn,
    server_optimizer_fn=server_optimizer_fn,
    model_aggregator=aggregator,
    **fed_avg_kwargs,
  )
  if noise_on_host:
    return host_noise.host_noise_fed_avg(process, stream, noise_seed, factory)
  return process


def build_host_noise_fed_avg(model_fn: Callable[[], Any], strategy: Any, **kwargs: Any):
  """`build_dp_fed_avg(model_fn, strategy, noise_on_host=True, **kwargs)`."""
  return build_dp_fed_avg(model_fn, strategy, noise_on_host=True, **kwargs)
