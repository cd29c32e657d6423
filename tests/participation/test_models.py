"""Participation models: the schema each guarantees, checked by brute force over the cohorts they draw."""

import copy

import numpy as np
import pytest

from fedmf.participation import ParticipationConfig, ParticipationError, build
from fedmf.participation.timers import diurnal_availability
from tests.helpers import brute_min_sep, rounds_by_client


def _run(model, rounds):
  cohorts = [model.sample(r) for r in range(rounds)]
  return cohorts


@pytest.mark.parametrize("b, availability", [(1, 1.0), (5, 1.0), (7, 0.6)])
def test_round_timer_enforces_min_sep_and_cap(b, availability):
  cfg = ParticipationConfig(
    model="timer", min_sep=b, availability=availability, max_participations=4
  )
  model = build(cfg, num_clients=60, clients_per_round=6, seed=3)
  cohorts = _run(model, 80)
  assert brute_min_sep(cohorts) >= b
  assert max(len(rs) for rs in rounds_by_client(cohorts).values()) <= 4
  assert all(np.all(np.diff(c.clients) > 0) for c in cohorts)  # sorted, distinct
  assert model.declared_schema(80).min_sep == b


def test_round_timer_fills_cohorts_when_enough_devices_are_eligible():
  model = build(ParticipationConfig(model="timer", min_sep=10), 200, 20, seed=0)
  assert all(c.clients.size == 20 for c in _run(model, 50))


def test_clock_timer_gaps_respect_the_timer_in_hours_and_the_declared_rounds():
  cfg = ParticipationConfig(
    model="timer",
    timer_unit="hours",
    timer_hours=3.0,
    round_minutes=10,
    round_jitter=0.3,
    night_availability=0.9,
    day_availability=0.2,
  )
  model = build(cfg, num_clients=400, clients_per_round=10, seed=1)
  cohorts = _run(model, 400)
  times = {c.round: c.time_hours for c in cohorts}
  for rounds in rounds_by_client(cohorts).values():
    for a, b in zip(rounds, rounds[1:]):
      assert times[b] - times[a] >= 3.0
  declared = model.declared_schema(400).min_sep
  assert declared == int(np.ceil(3.0 / (10 * 1.3 / 60)))
  assert brute_min_sep(cohorts) >= declared
  # Round durations vary within the jitter.
  durations = np.diff([times[r] for r in range(400)]) * 60
  assert durations.min() >= 7 - 1e-9 and durations.max() <= 13 + 1e-9 and durations.std() > 0.5


def test_diurnal_pattern_peaks_at_night():
  hours = np.arange(24.0)
  p = diurnal_availability(hours, night=0.5, day=0.05)
  assert p[3] == pytest.approx(0.5) and p[15] == pytest.approx(0.05)
  assert p.argmax() == 3


@pytest.mark.parametrize("unit", ["rounds", "hours"])
def test_guard_refuses_early_checkins_and_without_it_they_break_min_sep(unit):
  base = dict(
    model="timer",
    timer_unit=unit,
    min_sep=8,
    timer_hours=2.0,
    round_minutes=15,
    round_jitter=0.0,
    early_checkin_rate=0.3,
    night_availability=1.0,
    day_availability=1.0,
  )
  guarded = build(ParticipationConfig(**base, server_guard=True), 100, 10, seed=5)
  cohorts = _run(guarded, 120)
  assert sum(c.refused for c in cohorts) > 0
  assert sum(c.early_admitted for c in cohorts) == 0
  b = guarded.declared_schema(120).min_sep
  assert brute_min_sep(cohorts) >= b
  open_door = build(ParticipationConfig(**base, server_guard=False), 100, 10, seed=5)
  cohorts = _run(open_door, 120)
  assert sum(c.refused for c in cohorts) == 0
  assert sum(c.early_admitted for c in cohorts) > 0
  assert brute_min_sep(cohorts) < b


def test_epoch_shuffle_is_fixed_epoch_participation():
  model = build(ParticipationConfig(model="epoch_shuffle", min_sep=6), 50, 5, seed=2)
  cohorts = _run(model, 20)
  by_client = rounds_by_client(cohorts)
  assert len(by_client) == 30  # 6 slots × 5 devices; the other 20 never join.
  for rounds in by_client.values():
    assert np.all(np.diff(rounds) == 6)  # Same slot every epoch.
  s = model.declared_schema(20)
  assert (s.min_sep, s.max_participations) == (6, 4)
  with pytest.raises(ParticipationError, match="needs min_sep"):
    build(ParticipationConfig(model="epoch_shuffle", min_sep=11), 50, 5, seed=2)


def test_uniform_sampling_has_no_separation():
  model = build(ParticipationConfig(model="uniform"), 30, 10, seed=4)
  cohorts = _run(model, 40)
  assert all(c.clients.size == 10 for c in cohorts)
  assert brute_min_sep(cohorts) == 1
  assert model.declared_schema(40).min_sep == 1


def test_cyclic_poisson_samples_within_groups():
  model = build(ParticipationConfig(model="cyclic_poisson", min_sep=4), 400, 10, seed=6)
  cohorts = _run(model, 400)
  for rounds in rounds_by_client(cohorts).values():
    assert len({r % 4 for r in rounds}) == 1  # One group per device.
  assert brute_min_sep(cohorts) >= 4
  sizes = [c.clients.size for c in cohorts]
  assert abs(np.mean(sizes) - 10) < 5 * np.sqrt(10 / len(sizes))  # E = q·N/groups = B.
  assert model.amplification().sampling_probability == pytest.approx(4 * 10 / 400)
  dpsgd = build(ParticipationConfig(model="cyclic_poisson"), 400, 10, seed=6, poisson_groups=1)
  assert dpsgd.amplification().groups == 1


@pytest.mark.parametrize(
  "cfg",
  [
    ParticipationConfig(model="timer", min_sep=4, availability=0.7, early_checkin_rate=0.2),
    ParticipationConfig(model="timer", timer_unit="hours", timer_hours=1.0, early_checkin_rate=0.1),
    ParticipationConfig(model="epoch_shuffle", min_sep=3),
    ParticipationConfig(model="cyclic_poisson", min_sep=3),
  ],
)
def test_restored_state_draws_the_same_cohorts(cfg):
  model = build(cfg, 90, 6, seed=9)
  _run(model, 15)
  saved = copy.deepcopy(model.state())
  rest = [model.sample(r).clients.tolist() for r in range(15, 40)]
  again = build(cfg, 90, 6, seed=9)
  again.restore(saved)
  assert [again.sample(r).clients.tolist() for r in range(15, 40)] == rest


@pytest.mark.parametrize(
  "cfg, message",
  [
    (ParticipationConfig(model="poisson"), "participation.model"),
    (ParticipationConfig(model="timer", timer_unit="days", min_sep=2), "timer_unit"),
    (ParticipationConfig(model="timer"), "min_sep"),
    (ParticipationConfig(model="uniform", early_checkin_rate=0.1), "early_checkin_rate"),
    (ParticipationConfig(model="timer", min_sep=2, early_checkin_rate=1.5), "early_checkin_rate"),
    (ParticipationConfig(model="cyclic_poisson", min_sep=50), "num_clients"),
  ],
)
def test_bad_configs_name_the_key(cfg, message):
  with pytest.raises(ParticipationError, match=message):
    build(cfg, 100, 5, seed=0)


def test_rounds_must_come_in_order():
  model = build(ParticipationConfig(model="timer", min_sep=2), 20, 2, seed=0)
  model.sample(0)
  with pytest.raises(ParticipationError, match="in order"):
    model.sample(5)
