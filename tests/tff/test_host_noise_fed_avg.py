"""Users' own FedAvg with the noise on the host: the factory's model, without its state transfer."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.tff import learning
from tests.tff.test_aggregators import ALL, _client_data, _model_fn


def _optimizers():
  return dict(
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
  )


@pytest.mark.parametrize("name", ["blt", "tree", "dpsgd"])
def test_host_noise_fed_avg_gives_the_factory_model(tff_context, name):
  common = dict(noise_multiplier=0.7, clip_norm=1.0, clients_per_round=2, noise_seed=11)
  factory = learning.build_dp_fed_avg(_model_fn, ALL[name], num_rounds=4, **common, **_optimizers())
  host = learning.build_host_noise_fed_avg(
    _model_fn, ALL[name], num_rounds=4, **common, **_optimizers()
  )
  data = [_client_data(0), _client_data(1)]
  f_state, h_state = factory.initialize(), host.initialize()
  try:
    for _ in range(4):
      f_out = factory.next(f_state, data)
      h_out = host.next(h_state, data)
      f_state, h_state = f_out.state, h_out.state
      for a, b in zip(
        factory.get_model_weights(f_state).trainable,
        host.process.get_model_weights(h_state).trainable,
      ):
        np.testing.assert_array_equal(a, b)  # the same noise, the same arithmetic
      agg = h_out.metrics["aggregator"]
      assert agg["clipped_count"] == f_out.metrics["aggregator"]["clipped_count"]
    # The state that crosses TFF's context holds this round's noise, not the stream's buffers.
    noise_state = tf.nest.flatten(h_state.aggregator)
    weights = tf.nest.flatten(host.process.get_model_weights(h_state).trainable)
    assert [np.shape(x) for x in noise_state] == [np.shape(w) for w in weights]
    assert any(np.any(np.asarray(x) != 0) for x in noise_state)
  finally:
    host.close()


def test_bad_values_are_refused(tff_context):
  with pytest.raises(ValueError, match="clip_norm"):
    learning.build_host_noise_fed_avg(
      _model_fn,
      ALL["blt"],
      noise_multiplier=1.0,
      clip_norm=float("nan"),
      clients_per_round=2,
      **_optimizers(),
    )


def test_weighted_fed_avg_with_host_noise_gives_the_factory_model(tff_context):
  common = dict(noise_multiplier=0.7, clip_norm=1.0, clients_per_round=2, noise_seed=5)
  common.update(num_rounds=2, weighted=True, **_optimizers())
  factory = learning.build_dp_fed_avg(_model_fn, ALL["blt"], **common)
  host = learning.build_dp_fed_avg(_model_fn, ALL["blt"], noise_on_host=True, **common)
  data = [_client_data(0), _client_data(1)]
  f_state, h_state = factory.initialize(), host.initialize()
  try:
    for _ in range(2):
      f_state = factory.next(f_state, data).state
      h_state = host.next(h_state, data).state
    for a, b in zip(
      factory.get_model_weights(f_state).trainable,
      host.process.get_model_weights(h_state).trainable,
    ):
      np.testing.assert_array_equal(a, b)
  finally:
    host.close()
