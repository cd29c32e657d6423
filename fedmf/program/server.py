"""The server step on the host: correlated noise, the DP mean and server SGD with momentum.

One concept: what the server does with a round's clipped sum. The federated part of a round (model
broadcast, local training, clipping, the sum) runs as a TFF computation (`fedmf.tff.rounds`); the
rest runs here, in the program's process, because the noise state never has to cross TFF's
execution context then: only the model goes in and the sum comes out (issue 11's finding: moving
the state through the sync context each round, not the noise arithmetic, made correlated noise
expensive).

The noise is the strategy's `NoiseStream` run in numpy on the host (its `HostKernel`: in place,
one pass over the buffers a round), with the same seeded draws as the `tff.aggregators` factory
(`fedmf.tff.noise.round_draws`), so both give the same noise for the same seed, bit for bit.
Everything the server holds is plain data: weights and momentum as float32 numpy arrays, the stream
state as numpy arrays, the round, and the seed.

  mean_t  = (Σ clipped updates + ζ·σ·[C⁻¹ z]_t) / B           (BandMF Alg. 1; BLT Alg. 1)
  m_t     = β m_{t-1} + mean_t,   w_t = w_{t-1} − η_t m_t     (server SGD with momentum)

Updates are w_initial − w_trained (TFF's model-delta convention), so the mean is a pseudo-gradient.
η_t warms up linearly from `cooldown_factor`·η over the first `warmup_fraction` of the rounds and
cools down linearly to `cooldown_factor`·η over the last `cooldown_fraction` (BandMF App. I).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.tff import dp_mean


def learning_rate(
  round_index: int,
  rounds: int,
  base: float,
  warmup_fraction: float,
  cooldown_fraction: float,
  cooldown_factor: float,
) -> float:
  """η_t: linear warm-up from cooldown_factor·η, constant, linear cool-down to cooldown_factor·η."""
  warmup = int(round(warmup_fraction * rounds))
  cooldown = int(round(cooldown_fraction * rounds))
  low = cooldown_factor * base
  if round_index < warmup:
    return low + (base - low) * round_index / max(warmup - 1, 1)
  start = rounds - cooldown
  if cooldown and round_index >= start:
    return base - (base - low) * (round_index - start + 1) / cooldown
  return base


@dataclasses.dataclass
class ServerState:
  """What the server holds between rounds (plain data; checkpointed as is)."""

  weights: list[np.ndarray]
  momentum: list[np.ndarray]
  round: int = 0


def initial_server_state(weights: Sequence[np.ndarray]) -> ServerState:
  weights = [np.array(w, dtype=np.float32) for w in weights]
  return ServerState(weights=weights, momentum=[np.zeros_like(w) for w in weights])


def server_update(
  state: ServerState,
  clipped_sum: Sequence[np.ndarray],
  noise: Optional[Sequence[np.ndarray]],
  noise_scale: float,
  clients_per_round: int,
  learning_rate_value: float,
  momentum: float,
) -> list[np.ndarray]:
  """Adds the noise, divides by B, applies SGD with momentum in place; returns the noisy mean.

  Raises FedmfUserError naming the round if the noisy mean is not finite: a NaN must never reach
  the model.
  """
  # The aggregator's operations (fedmf.tff.dp_mean), so the same bits.
  mean = dp_mean.noised_mean_numpy(clipped_sum, noise, noise_scale, clients_per_round)
  for k, m in enumerate(mean):
    if not np.all(np.isfinite(m)):
      raise FedmfUserError(
        f"round {state.round}: the noisy aggregate is not finite (tensor {k}); "
        "training stopped before it reached the model"
      )
  lr = np.float32(learning_rate_value)
  beta = np.float32(momentum)
  for w, v, g in zip(state.weights, state.momentum, mean):
    v *= beta
    v += g
    w -= lr * v
  state.round += 1
  return mean
