"""Secure summation under the DP aggregator: TFF's own SecureSumFactory as a user passes it.

A 10-round `build_unweighted_fed_avg` trains with it; each round the plain aggregator is run from
the same state on the same clients, so the two sums differ only by the secure sum's quantization,
within the bound docs/aggregators.md states, and the BLT noise (the stream state) is bit for bit
the same.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.errors import FedmfUserError
from fedmf.privacy.adaptive_clip import AdaptiveClip
from fedmf.tff import build_dp_aggregator
from tests.tff.test_adaptive_clip import VALUE_TYPE, _values
from tests.tff.test_aggregators import BLT, _client_data, _model_fn

CLIP, SIGMA, CLIENTS = 0.05, 0.5, 4


def _bound(clients, clip, entries, lower, upper):
  """docs/aggregators.md, *Secure summation*: per coordinate of the sum of n records,
  |secure - plain| <= n·ζ·(m + Δ/(2B)), m = √d·Δ/B + 2⁻²⁰, Δ = (hi - lo)/(2³² - 1),
  B = min(hi, -lo), the bounds in the values' dtype."""
  lower, upper = float(np.float32(lower)), float(np.float32(upper))  # TFF casts them to float32
  step = (upper - lower) / (2**32 - 1)
  bound = min(upper, -lower)
  margin = math.sqrt(entries) * step / bound + 2.0**-20
  return clients * clip * (margin + 0.5 * step / bound)


def _fed_avg(record_factory=None):
  aggregator = build_dp_aggregator(
    BLT,
    noise_multiplier=SIGMA,
    clip_norm=CLIP,
    clients_per_round=CLIENTS,
    noise_seed=9,
    record_aggregation_factory=record_factory,
  )
  return tff.learning.algorithms.build_unweighted_fed_avg(
    _model_fn,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),  # w ← w − mean
    model_aggregator=aggregator,
  )


def _weights(process, state):
  return [np.asarray(w, np.float64) for w in process.get_model_weights(state).trainable]


def test_fed_avg_trains_on_secure_summation_with_the_plain_sums_and_noise(tff_context):
  secure_factory = tff.aggregators.SecureSumFactory(
    upper_bound_threshold=CLIP, lower_bound_threshold=-CLIP
  )
  secure, plain = _fed_avg(secure_factory), _fed_avg()
  data = [_client_data(i) for i in range(CLIENTS)]
  state = secure.initialize()
  entries = sum(w.size for w in _weights(secure, state))
  bound = _bound(CLIENTS, CLIP, entries, -CLIP, CLIP) / CLIENTS  # on the mean
  losses, clipped = [], 0
  for _ in range(10):
    out = secure.next(state, data)
    # The plain aggregator from the same model and noise state, on the same clients.
    twin = plain.next(state._replace(aggregator=state.aggregator["dp"]), data)
    # The noise is the stream's: its state is the same bits on both paths.
    for a, b in zip(
      tf.nest.flatten(out.state.aggregator["dp"]), tf.nest.flatten(twin.state.aggregator)
    ):
      np.testing.assert_array_equal(a, b)
    # Server SGD at rate 1: w_secure - w_plain = -(mean_secure - mean_plain), i.e. the sums'
    # difference over B, plus float32 rounding of the two updates.
    for a, b in zip(_weights(secure, out.state), _weights(plain, twin.state)):
      slack = 4 * 2.0**-24 * (np.abs(a) + np.abs(b) + 1e-30)
      assert np.all(np.abs(a - b) <= bound + slack)
    measured = out.metrics["aggregator"]
    assert measured["dp"]["clipped_count"] == twin.metrics["aggregator"]["clipped_count"]
    assert measured["record_aggregation"]["secure_upper_threshold"] == np.float32(CLIP)
    clipped += measured["dp"]["clipped_count"]
    losses.append(out.metrics["client_work"]["train"]["loss"])
    state = out.state
  assert clipped > 0  # the clip binds, so the margin is exercised
  assert np.mean(losses[-3:]) < losses[0]  # it trains


def test_adaptive_clip_on_secure_summation_keeps_the_plain_trajectory(tff_context):
  """Scaled records (ζ_t ≠ B): the ζ trajectory (its counts summed securely) is the plain one, and
  with σ = 0 the sums agree within the bound at each round's ζ."""
  clip = AdaptiveClip(initial=0.4, learning_rate=0.5, count_noise_multiplier=2.0)
  common = dict(noise_multiplier=0.0, clip_norm=clip, clients_per_round=4, noise_seed=3)
  secure = build_dp_aggregator(
    BLT,
    **common,
    record_aggregation_factory=tff.aggregators.SecureSumFactory(
      upper_bound_threshold=2.0, lower_bound_threshold=-2.0
    ),
  ).create(VALUE_TYPE)
  plain = build_dp_aggregator(BLT, **common).create(VALUE_TYPE)
  values = _values([0.1, 0.3, 0.9, 2.5], seed=4)
  s_state, p_state = secure.initialize(), plain.initialize()
  for _ in range(5):
    s_out, p_out = secure.next(s_state, values), plain.next(p_state, values)
    zeta = p_out.measurements["clip_norm"]
    assert s_out.measurements["dp"]["clip_norm"] == zeta
    bound = _bound(4, zeta, 10, -2.0, 2.0)
    for a, b in zip(s_out.result, p_out.result):
      total_a, total_b = np.asarray(a, np.float64) * 4, np.asarray(b, np.float64) * 4
      assert np.all(np.abs(total_a - total_b) <= bound + 8 * 2.0**-24 * 4 * zeta)
    s_state, p_state = s_out.state, p_out.state


@pytest.mark.parametrize(
  "factory, message",
  [
    (lambda: tff.aggregators.SecureSumFactory(upper_bound_threshold=1, lower_bound_threshold=-1), "constant float"),
    (lambda: tff.aggregators.SecureSumFactory(upper_bound_threshold=2.0, lower_bound_threshold=0.5), "contain 0"),
    (lambda: tff.aggregators.MeanFactory(), "SumFactory"),
    (lambda: tff.aggregators.EncodedSumFactory.quantize_above_threshold(8), "SumFactory"),
  ],
)  # fmt: skip
def test_factories_whose_sum_is_not_vouched_for_are_refused(factory, message):
  with pytest.raises(FedmfUserError, match=message):
    build_dp_aggregator(
      BLT,
      noise_multiplier=1.0,
      clip_norm=1.0,
      clients_per_round=4,
      record_aggregation_factory=factory(),
    )
