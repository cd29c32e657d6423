"""The host server step: learning-rate schedule, SGD with momentum, the NaN guard, host noise."""

import numpy as np
import pytest

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from fedmf.mf import streaming
from fedmf.program import server
from fedmf.tff import host_noise


def test_learning_rate_schedule_warms_up_and_cools_down():
  rounds, base = 100, 2.0
  lrs = [server.learning_rate(r, rounds, base, 0.15, 0.25, 0.05) for r in range(rounds)]
  assert lrs[0] == pytest.approx(0.1)  # 0.05 · η
  assert lrs[14] == pytest.approx(base)  # end of the warm-up (15 rounds)
  assert lrs[15:75] == [base] * 60
  assert lrs[-1] == pytest.approx(0.1)  # cooled down to 0.05 · η
  assert all(b <= a for a, b in zip(lrs[75:], lrs[76:]))
  assert all(b >= a for a, b in zip(lrs[:15], lrs[1:15]))
  flat = [server.learning_rate(r, 10, 1.0, 0.0, 0.0, 0.05) for r in range(10)]
  assert flat == [1.0] * 10


def test_server_update_is_sgd_with_momentum():
  state = server.initial_server_state([np.zeros(3), np.ones(2)])
  total = [np.array([1.0, 2.0, 3.0], np.float32), np.array([4.0, 4.0], np.float32)]
  noise = [np.array([1.0, 0.0, -1.0], np.float32), np.zeros(2, np.float32)]
  mean = server.server_update(
    state, total, noise, noise_scale=2.0, clients_per_round=2, learning_rate_value=0.5, momentum=0.9
  )
  np.testing.assert_allclose(mean[0], [1.5, 1.0, 0.5])
  np.testing.assert_allclose(state.weights[0], [-0.75, -0.5, -0.25])
  mean = server.server_update(
    state, total, None, noise_scale=0.0, clients_per_round=2, learning_rate_value=0.5, momentum=0.9
  )
  # m = 0.9·[1.5, 1, .5] + [.5, 1, 1.5]; w -= 0.5·m
  np.testing.assert_allclose(state.momentum[0], [1.85, 1.9, 1.95], rtol=1e-6)
  np.testing.assert_allclose(state.weights[0], [-1.675, -1.45, -1.225], rtol=1e-6)
  assert state.round == 2


def test_a_non_finite_aggregate_stops_before_the_model():
  state = server.initial_server_state([np.zeros(2)])
  before = state.weights[0].copy()
  with pytest.raises(FedmfUserError, match="round 0: the noisy aggregate is not finite"):
    server.server_update(state, [np.array([np.inf, 0.0], np.float32)], None, 0.0, 1, 1.0, 0.9)
  np.testing.assert_array_equal(state.weights[0], before)


@pytest.mark.parametrize(
  "obj",
  [
    {"mechanism": "dpsgd"},
    {"mechanism": "blt", "buf_decay": [0.9, 0.4], "output_scale": [0.3, 0.1]},
    {"mechanism": "band-toeplitz", "coefficients": [1.0, 0.5, 0.25]},
    {"mechanism": "tree", "variant": "online-honaker"},
  ],
)
def test_host_noise_restores_bit_for_bit_and_whitens(obj):
  strategy = st.load_strategy(obj)
  shapes = [(400,), (20, 10)]
  a = host_noise.HostNoise(strategy.noise_stream(12), shapes, seed=7)
  first = [a.next() for _ in range(5)]
  saved = a.state()
  rest = [a.next() for _ in range(5)]
  b = host_noise.HostNoise(strategy.noise_stream(12), shapes, seed=7)
  b.restore(saved)
  again = [b.next() for _ in range(5)]
  for x, y in zip(rest, again):
    for u, v in zip(x, y):
      np.testing.assert_array_equal(u, v)
  other = host_noise.HostNoise(strategy.noise_stream(12), shapes, seed=8).next()
  assert not np.array_equal(other[0], first[0][0])
  # The per-round std is ‖row_t of C⁻¹‖ (the tree: its per-round decoder row).
  norms = strategy.noise_row_norms(10)
  for t, round_noise in enumerate(first + rest):
    flat = np.concatenate([x.ravel() for x in round_noise]).astype(np.float64)
    assert abs(flat.std() / norms[t] - 1) < 5 * np.sqrt(0.5 / flat.size)


def test_the_program_pieces_are_typed_by_role():
  """Release managers are TFF's (`tff.program.ReleaseManager`); the other roles are Protocols
  (`logic.Checkpoints`, `logic.RoundLog`, `logic.Journal`) that both commands' pieces satisfy."""
  import tensorflow_federated as tff

  from fedmf.privacy import participation_log
  from fedmf.program import logic, metrics_csv, simulate, train

  for manager in (
    logic.NoReleases,
    metrics_csv.MetricsCsv,
    simulate.TensorBoardScalars,
    train.ModelReleaseManager,
  ):
    assert issubclass(manager, tff.program.ReleaseManager), manager
  assert isinstance(logic.NoCheckpoints(), logic.Checkpoints)
  assert isinstance(logic.NoJournal(), logic.Journal)
  assert hasattr(train.FileCheckpoints, "save") and train.FileCheckpoints.resumable
  for log in (
    participation_log.ParticipationLogWriter,
    participation_log.AppendableParticipationLog,
  ):
    assert callable(getattr(log, "write_round", None)), log
  assert callable(getattr(train.ReleaseJournal, "check_and_record", None))
  hints = logic.Program.__annotations__
  assert "Any" not in " ".join(map(str, hints.values()))
