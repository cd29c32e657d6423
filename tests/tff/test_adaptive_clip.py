"""Adaptive clipping in TFF: the update rule, its count draw, tracking a quantile, the factory's ζ
against the host's bit for bit, and FedAvg with the clip as its `clip_norm` argument."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from fedmf.errors import FedmfUserError
from fedmf.privacy.adaptive_clip import AdaptiveClip
from fedmf.tff import adaptive_clip
from fedmf.tff import dp_mean
from fedmf.tff import build_dp_aggregator
from fedmf.tff import host_noise
from fedmf.tff import learning
from fedmf.tff import noise as noise_lib
from tests.tff.test_aggregators import BLT, _client_data, _model_fn

VALUE_TYPE = tff.StructWithPythonType(
  [tff.TensorType(np.float32, [6]), tff.TensorType(np.float32, [2, 2])], list
)


def _values(norms, seed=0):
  """Client values (VALUE_TYPE) with the given L2 norms, in random directions."""
  rng = np.random.default_rng(seed)
  out = []
  for norm in norms:
    v = rng.normal(size=10)
    v *= norm / np.linalg.norm(v)
    out.append([v[:6].astype(np.float32), v[6:].reshape(2, 2).astype(np.float32)])
  return out


def test_next_clip_is_andrew_et_al_geometric_update():
  rng = np.random.default_rng(3)
  for _ in range(20):
    clip, clients = rng.uniform(0.01, 10), int(rng.integers(1, 50))
    within, draw = int(rng.integers(0, clients + 1)), rng.normal()
    gamma, eta, std = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 5)
    fraction, new = adaptive_clip.next_clip(
      tf.constant(clip, tf.float64),
      tf.constant(within),
      tf.constant(clients),
      tf.constant(draw, tf.float64),
      target_quantile=gamma,
      learning_rate=eta,
      count_stddev=std,
    )
    # b̃ = clip01((W + s ξ)/n), ζ' = ζ exp(-η (b̃ - γ)) (Andrew et al.; tensorflow_privacy clamps).
    expected_fraction = min(1.0, max(0.0, (within + std * draw) / clients))
    assert float(fraction) == pytest.approx(expected_fraction, rel=1e-14, abs=1e-15)
    assert float(new) == pytest.approx(
      clip * math.exp(-eta * (expected_fraction - gamma)), rel=1e-14
    )
  # A round without clients leaves ζ as it is and releases no fraction.
  fraction, new = adaptive_clip.next_clip(
    tf.constant(0.5, tf.float64), tf.constant(0), tf.constant(0), tf.constant(1.0, tf.float64),
    target_quantile=0.5, learning_rate=0.2, count_stddev=1.0,
  )  # fmt: skip
  assert float(new) == 0.5 and math.isnan(float(fraction))


def test_count_draw_is_a_function_of_seed_and_round_keyed_apart_from_the_model_noise():
  seed = tf.constant(dp_mean.seed_key(7), tf.int64)
  draws = [float(noise_lib.count_draw(seed, tf.constant(t, tf.int64))) for t in range(50)]
  again = [float(noise_lib.count_draw(seed, tf.constant(t, tf.int64))) for t in range(50)]
  assert draws == again and len(set(draws)) == 50
  other = float(noise_lib.count_draw(tf.constant(dp_mean.seed_key(8), tf.int64), 0))
  assert other != draws[0]
  # The model noise of the same seed and rounds (a scalar spec) is other numbers.
  spec = [tf.TensorSpec([], tf.float64)]
  model = [
    float(noise_lib.round_draws(seed, tf.constant(t, tf.int64), spec)(0)[0]) for t in range(50)
  ]
  assert not set(model) & set(draws)
  assert abs(np.mean(draws)) < 0.5 and 0.6 < np.std(draws) < 1.4


@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.8])
def test_the_clip_tracks_the_target_quantile_of_the_norms(gamma):
  """Known norms (lognormal, 200 clients a round): ζ settles at their γ-quantile, and the fraction
  within ζ_t over the last half of the rounds is γ (Andrew et al. §3's claim)."""
  rng = np.random.default_rng(1)
  clients = 200
  clip = adaptive_clip.HostAdaptiveClip(
    AdaptiveClip(target_quantile=gamma, initial=0.01, learning_rate=0.2),
    dp_mean.seed_key(5),
    adaptive_clip.count_stddev(clients / 10),  # Andrew et al.'s σ_b = m/20
  )
  fractions, clips = [], []
  for t in range(300):
    norms = rng.lognormal(0.0, 1.0, clients)
    within = int(np.sum(norms <= clip.value))
    fractions.append(within / clients)
    clips.append(clip.value)
    clip.update(t, within, clients)
  assert np.mean(fractions[150:]) == pytest.approx(gamma, abs=0.03)
  truth = math.exp(float(tf.math.ndtri(tf.constant(gamma, tf.float64))))  # lognormal quantile
  assert np.median(clips[150:]) == pytest.approx(truth, rel=0.1)


def _adaptive_factory(**kw):
  return build_dp_aggregator(
    BLT,
    noise_multiplier=0.8,
    clip_norm=AdaptiveClip(initial=0.6, learning_rate=0.3, count_noise_multiplier=3.0),
    clients_per_round=4,
    noise_seed=21,
    **kw,
  )


def test_clipped_counts_the_clients_above_that_rounds_clip_and_zeta_moves(tff_context):
  norms = [0.2, 0.5, 1.0, 3.0]
  process = _adaptive_factory().create(VALUE_TYPE)
  state = process.initialize()
  values = _values(norms)
  seen = []
  for _ in range(6):
    out = process.next(state, values)
    m = out.measurements
    seen.append(m["clip_norm"])
    assert m["clipped_count"] == sum(n > m["clip_norm"] for n in norms)
    assert m["clients"] == 4 and m["zeroed_count"] == 0
    state = out.state
  assert seen[0] == 0.6 and len(set(seen)) == 6
  # The host's clip, fed the factory's counts, follows the same ζ bit for bit.
  host = adaptive_clip.HostAdaptiveClip(
    AdaptiveClip(initial=0.6, learning_rate=0.3, count_noise_multiplier=3.0),
    dp_mean.seed_key(21),
    adaptive_clip.count_stddev(3.0),
  )
  for t, clip in enumerate(seen):
    assert host.value == clip
    host.update(t, sum(n <= clip for n in norms), 4)


def test_round_noise_is_scaled_by_that_rounds_clip(tff_context):
  """Zero updates: the mean is exactly ζ_t·σ·[C⁻¹ z]_t × float32(1/B), the stream noise of the
  fixed clip (HostNoise of the same seed) scaled by the round's ζ."""
  process = _adaptive_factory().create(VALUE_TYPE)
  state = process.initialize()
  stream = noise_lib.make_noise_stream(BLT)
  noise = host_noise.HostNoise(stream, [(6,), (2, 2)], 21)
  zeros = [[np.zeros(6, np.float32), np.zeros((2, 2), np.float32)] for _ in range(4)]
  for _ in range(4):
    out = process.next(state, zeros)
    zeta = out.measurements["clip_norm"]
    unit = noise.next()
    for got, z in zip(out.result, unit):
      expected = (np.float32(zeta * 0.8) * z) * np.float32(1.0 / 4)
      np.testing.assert_array_equal(np.asarray(got), expected)
    state = out.state


def test_fed_avg_takes_the_adaptive_clip_on_the_factory_and_on_the_host(tff_context):
  common = dict(
    noise_multiplier=0.7,
    clip_norm=AdaptiveClip(initial=0.05, count_noise_multiplier=2.0),
    clients_per_round=2,
    noise_seed=11,
    num_rounds=4,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
    server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, 0.9),
  )
  factory = learning.build_dp_fed_avg(_model_fn, BLT, **common)
  host = learning.build_dp_fed_avg(_model_fn, BLT, noise_on_host=True, **common)
  data = [_client_data(0), _client_data(1)]
  f_state, h_state = factory.initialize(), host.initialize()
  clips = []
  try:
    for _ in range(4):
      f_out, h_out = factory.next(f_state, data), host.next(h_state, data)
      f_state, h_state = f_out.state, h_out.state
      for a, b in zip(
        factory.get_model_weights(f_state).trainable,
        host.process.get_model_weights(h_state).trainable,
      ):
        np.testing.assert_array_equal(a, b)
      clips.append(f_out.metrics["aggregator"]["clip_norm"])
      assert h_out.metrics["aggregator"]["clip_norm"] == clips[-1]
    assert host.clip.value == f_state.aggregator["clip"]
    assert clips[0] == 0.05 and clips[-1] != 0.05
  finally:
    host.close()


@pytest.mark.parametrize(
  "clip, message",
  [
    ("adaptiv", "clip_norm must be"),
    (AdaptiveClip(count_budget_fraction=0.1), "count_budget_fraction"),
    (AdaptiveClip(target_quantile=2.0), "target_quantile"),
  ],
)
def test_bad_clip_arguments_are_refused(clip, message):
  with pytest.raises(FedmfUserError, match=message):
    build_dp_aggregator(BLT, noise_multiplier=1.0, clip_norm=clip, clients_per_round=4)


def test_adaptive_by_name_uses_andrew_et_al_defaults():
  factory = build_dp_aggregator(
    BLT, noise_multiplier=1.0, clip_norm="adaptive", clients_per_round=50
  )
  assert factory.adaptive_clip == AdaptiveClip(count_noise_multiplier=5.0)
