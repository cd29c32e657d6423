"""Canary clients for users' own TFF loops: a `tff.aggregators` factory wrapping a DP aggregator.

One concept: measure the privacy of any `tff.learning` process whose model aggregator is a DP mean
(`fedmf.tff.build_dp_aggregator`, or another) the way `fedmf simulate` does (docs/empirical-privacy.md):

    factory = fedmf.tff.canary_factory(
      build_dp_aggregator('blt.json', noise_multiplier=σ, clip_norm=ζ, clients_per_round=B),
      count=500, held_out=500, seed=1, pattern='worst-case',
      strategy='blt.json', num_rounds=n, min_sep=b, max_participations=k)
    process = tff.learning.algorithms.build_unweighted_fed_avg(model_fn, ..., model_aggregator=factory)
    ... each round: projections.append(output.metrics['aggregator']['canaries']['projections'])
    result = factory.estimate(projections, strategy='blt.json', noise_multiplier=σ, delta=δ,
                              initial_weights=w0, final_weights=w_final)

Round t (counted in the state) runs the inner aggregator, then adds Σ_c ζ·u_c / B over the canaries
inserted in round t to its noised mean, and measures p[t, c] = B·⟨mean, u_c⟩/ζ for every canary.
The release is the same as if the canaries were clients of the sum, (Σ clipped + Σ canaries +
noise)/B, because the noise does not depend on the sum; the canaries test the inner aggregator's
noise (scale, correlation, seed) and denominator, not its clipping (they never pass through it).
The directions are `fedmf.privacy.canary_directions` (one fast Walsh–Hadamard transform in
TensorFlow inserts or projects them all); only their seed-derived signs (N bytes) and columns are
constants of the computation.

Measurements: OrderedDict(dp=the inner's measurements, canaries=OrderedDict(round, projections)).
"""

from __future__ import annotations

import collections
import math
from typing import Any, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.types import type_conversions

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies
from fedmf.mf import worst_pattern
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import canary_design
from fedmf.privacy import canary_directions
from fedmf.privacy import empirical

__all__ = ['CanaryFactory', 'canary_factory']


def fwht_tf(x: tf.Tensor, size: int) -> tf.Tensor:
  """H x for a length-`size` vector (size a power of two), unnormalized: the butterflies of
  `fedmf.privacy.canary_directions.fwht`."""
  h = 1
  while h < size:
    pairs = tf.reshape(x, [-1, 2, h])
    lo, hi = pairs[:, 0, :], pairs[:, 1, :]
    x = tf.reshape(tf.stack([lo + hi, lo - hi], axis=1), [size])
    h *= 2
  return x


class CanaryFactory(tff.aggregators.UnweightedAggregationFactory):
  """The wrapper of the module docstring (build it with `canary_factory`)."""

  def __init__(
    self,
    inner: tff.aggregators.UnweightedAggregationFactory,
    *,
    design: canary_design.CanaryDesign,
    seed: int,
    rounds: tuple[int, ...],
    num_rounds: int,
    clip_norm: float,
    clients_per_round: float,
    pattern_description: str,
  ):
    self._inner = inner
    self.design = design
    self.seed = int(seed)
    self.rounds = tuple(int(r) for r in rounds)
    self.num_rounds = int(num_rounds)
    self.clip_norm = float(clip_norm)
    self.clients_per_round = float(clients_per_round)
    self.pattern_description = pattern_description
    self.directions: Optional[canary_directions.HadamardDirections] = None

  def patterns(self, rounds: int) -> np.ndarray:
    """(rounds, M) bool: the rounds each canary joined (or would have, if held out)."""
    out = np.zeros((rounds, self.design.canaries), bool)
    out[[r for r in self.rounds if r < rounds], :] = True
    return out

  def create(self, value_type) -> tff.templates.AggregationProcess:
    if not tff.types.is_structure_of_floats(value_type):
      raise TypeError(f'value_type must be a structure of floats, got {value_type}')
    inner = self._inner.create(value_type)
    specs_struct = type_conversions.type_to_tf_tensor_specs(value_type)
    specs = tf.nest.flatten(specs_struct)
    shapes = [tuple(int(d) for d in s.shape) for s in specs]
    directions = canary_directions.HadamardDirections(shapes, self.design.canaries, self.seed)
    self.directions = directions
    size, dim, m = directions.size, directions.dim, self.design.canaries
    sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
    # Each round's canary coefficients on the mean: ζ/B for the inserted canaries of that round.
    table = np.zeros((self.num_rounds + 1, m), np.float64)
    for r in self.rounds:
      if r < self.num_rounds:
        table[r, self.design.inserted] = self.clip_norm / self.clients_per_round
    signs = directions.signs.astype(np.float64)
    columns = directions.columns
    step, offset = directions.step, directions.offset
    scale = 1.0 / math.sqrt(size)
    project_scale = self.clients_per_round / self.clip_norm
    last = self.num_rounds

    @tff.tensorflow.computation
    def init_round():
      return tf.constant(0, tf.int32)

    mean_type = inner.next.type_signature.result.result.member

    @tff.tensorflow.computation(tf.int32, mean_type)
    def canaries_tf(round_index, mean):
      flat = tf.concat([tf.reshape(tf.cast(t, tf.float64), [-1]) for t in tf.nest.flatten(mean)], 0)
      coords = (tf.range(size, dtype=tf.int64) * step + offset) % dim
      row = tf.gather(tf.constant(table), tf.minimum(round_index, last))
      v = tf.tensor_scatter_nd_update(tf.zeros([size], tf.float64), columns[:, None], row)
      v = fwht_tf(v, size) * signs * scale
      flat = tf.tensor_scatter_nd_add(flat, coords[:, None], v)
      x = fwht_tf(tf.gather(flat, coords) * signs, size)
      projections = tf.gather(x, columns) * (scale * project_scale)
      parts = tf.split(flat, sizes)
      new = [tf.cast(tf.reshape(p, s.shape), s.dtype) for p, s in zip(parts, specs)]
      return (
        round_index + 1,
        tf.nest.pack_sequence_as(specs_struct, new),
        collections.OrderedDict(round=round_index, projections=tf.cast(projections, tf.float32)),
      )

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(
        collections.OrderedDict(
          dp=inner.initialize(), round=tff.federated_eval(init_round, tff.SERVER)
        )
      )

    @tff.federated_computation(
      init_fn.type_signature.result, tff.FederatedType(value_type, tff.CLIENTS)
    )
    def next_fn(state, value):
      out = inner.next(state.dp, value)
      new_round, mean, measured = tff.federated_map(canaries_tf, (state.round, out.result))
      return tff.templates.MeasuredProcessOutput(
        state=tff.federated_zip(collections.OrderedDict(dp=out.state, round=new_round)),
        result=mean,
        measurements=tff.federated_zip(
          collections.OrderedDict(dp=out.measurements, canaries=measured)
        ),
      )

    return tff.templates.AggregationProcess(init_fn, next_fn)

  def record(
    self,
    projections: Sequence[np.ndarray],
    initial_weights: Optional[Sequence[np.ndarray]] = None,
    final_weights: Optional[Sequence[np.ndarray]] = None,
  ) -> empirical.CanaryRecord:
    """The `fedmf.privacy.empirical.CanaryRecord` of the rounds run: `projections` one (M,) array
    per round (measurements['canaries']['projections']); the final model's change from the
    weights (the aggregated tensors' structure, e.g. `model_weights.trainable`), if given."""
    p = np.stack([np.asarray(x, np.float64).reshape(-1) for x in projections])
    if p.ndim != 2 or p.shape[1] != self.design.canaries:
      raise ValueError(f'expected one array of {self.design.canaries} projections per round')
    final = norm = None
    if initial_weights is not None and final_weights is not None:
      if self.directions is None:
        raise ValueError('the factory has not created its process yet: no directions')
      delta = [
        np.asarray(a, np.float64) - np.asarray(b, np.float64)
        for a, b in zip(initial_weights, final_weights)
      ]
      final = self.directions.project(delta)
      norm = math.sqrt(sum(float(np.sum(d * d)) for d in delta))
    return empirical.CanaryRecord(
      self.design.inserted, self.design.coins, self.patterns(p.shape[0]), p, final, norm
    )

  def estimate(
    self,
    projections: Sequence[np.ndarray],
    *,
    strategy: Any,
    noise_multiplier: float,
    delta: float,
    initial_weights: Optional[Sequence[np.ndarray]] = None,
    final_weights: Optional[Sequence[np.ndarray]] = None,
  ) -> empirical.EmpiricalPrivacy:
    """Both threat models' estimates (`fedmf.privacy.empirical.estimate`) of the rounds run,
    compared with the canaries' pattern's analytic ε: ‖C 1_π‖/σ over the rounds run."""
    strategy = strategies.load_strategy(strategy)
    record = self.record(projections, initial_weights, final_weights)
    c = strategy.matrix(record.rounds)
    u = self.patterns(record.rounds)[:, 0].astype(np.float64)
    value = float(np.linalg.norm(c @ u))
    return empirical.estimate(
      record,
      strategy,
      noise_multiplier,
      delta,
      analytic_mu=value / noise_multiplier,
      claim=f"the canaries' pattern (sensitivity {value:.6g}) over the noise multiplier "
      f"{noise_multiplier:.6g}",
      pattern='worst-case' if self.pattern_description.startswith('worst') else 'explicit',
      pattern_description=self.pattern_description,
    )


def canary_factory(
  inner: tff.aggregators.UnweightedAggregationFactory,
  *,
  count: int,
  held_out: int,
  seed: int,
  num_rounds: int,
  pattern: Union[str, Sequence[int]] = 'worst-case',
  strategy: Any = None,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  clip_norm: Optional[float] = None,
  clients_per_round: Optional[float] = None,
) -> CanaryFactory:
  """Wraps the DP aggregator `inner` with canary clients (see the module docstring).

  Args:
    inner: an unweighted DP-mean factory (`build_dp_aggregator`, or another whose result is
      (Σ clipped + noise)/B; then give `clip_norm` and `clients_per_round`).
    count, held_out: canaries inserted and held out, on average (`fedmf.privacy.canary_design`).
    seed: their directions, coins and roles.
    num_rounds: the rounds the process will run (canaries join none beyond).
    pattern: 'worst-case' (the rounds attaining `strategy`'s sensitivity under `min_sep` and
      `max_participations`: `fedmf.mf.worst_pattern`), or the rounds every canary joins.
      (The participation of a user's loop is the user's: `participation`, as in `fedmf simulate`,
      has no meaning here.)
    strategy: the strategy of `inner`'s noise (required for 'worst-case').
    clip_norm, clients_per_round: ζ and B (default: `inner`'s, a fedmf factory's).
  """
  if getattr(inner, 'adaptive_clip', None) is not None:
    # The wrapper inserts its canaries at one ζ; an adaptive clip moves ζ inside `inner` every
    # round, so the canaries' scale would be wrong (`fedmf simulate`/`train` follow ζ_t instead).
    raise FedmfUserError(
      'canary_factory does not wrap an aggregator with an adaptive clip (its clip norm changes '
      'every round): use a fixed clip_norm, or canaries in fedmf simulate / fedmf train'
    )
  clip_norm = getattr(inner, 'clip_norm', None) if clip_norm is None else clip_norm
  clients_per_round = (
    getattr(inner, 'clients_per_round', None) if clients_per_round is None else clients_per_round
  )
  if clip_norm is None or clients_per_round is None:
    raise FedmfUserError(
      'canary_factory needs clip_norm and clients_per_round (the inner factory does not say them)'
    )
  if isinstance(pattern, str):
    if pattern != 'worst-case':
      raise FedmfUserError(
        f"canary_factory pattern must be 'worst-case' or a list of rounds, got {pattern!r}"
      )
    if strategy is None:
      raise FedmfUserError("canary_factory pattern 'worst-case' needs strategy")
    found = worst_pattern.worst_case_pattern(
      strategies.load_strategy(strategy),
      ParticipationSchema(num_rounds, min_sep, max_participations),
    )
    rounds, description = found.rounds, f'worst-case {found.describe()}'
  else:
    rounds = tuple(sorted({int(r) for r in pattern}))
    if not rounds or rounds[0] < 0 or rounds[-1] >= num_rounds:
      raise FedmfUserError(f'canary rounds must lie in [0, {num_rounds}), got {list(pattern)[:8]}')
    description = f"every canary in rounds ({', '.join(map(str, rounds[:8]))})"
  design = canary_design.draw_design(count, held_out, seed)
  return CanaryFactory(
    inner,
    design=design,
    seed=seed,
    rounds=rounds,
    num_rounds=num_rounds,
    clip_norm=float(clip_norm),
    clients_per_round=float(clients_per_round),
    pattern_description=description,
  )
