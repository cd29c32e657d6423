"""The live budget meter (`fedmf.program.meter.PrivacyMeter`) counts what the auditor counts.

The meter keeps its own per-device counters (they are checkpointed with the run and asked "what if
this cohort joined" before each release), while the auditor counts the participation log with its
engines (`fedmf.privacy.log_statistics`). Both must give the same realized (b, k) after every round,
or the budget guard and the audit would disagree on ε. Checked on the cohorts of every
participation model, against both of the auditor's engines (the scan for rows in round order, the
sort for rows in any order)."""

import numpy as np
import pytest

from fedmf.mf.schema import ParticipationSchema
from fedmf.participation import ParticipationConfig, build
from fedmf.privacy import log_sort, log_statistics
from fedmf.program.meter import PrivacyMeter

MODELS = {
  "timer-rounds": ParticipationConfig(model="timer", min_sep=5),
  "timer-rounds-early-checkins-unguarded": ParticipationConfig(
    model="timer", min_sep=5, early_checkin_rate=0.4, server_guard=False
  ),
  "timer-hours": ParticipationConfig(
    model="timer",
    timer_unit="hours",
    timer_hours=2.0,
    round_minutes=10,
    round_jitter=0.5,
    night_availability=0.9,
    day_availability=0.3,
  ),
  "epoch-shuffle": ParticipationConfig(model="epoch_shuffle", min_sep=4),
  "uniform-poisson": ParticipationConfig(model="uniform"),
  "cyclic-poisson": ParticipationConfig(
    model="cyclic-poisson", partitions=3, sampling_probability=0.2
  ),
}
CLIENTS, PER_ROUND, ROUNDS = 120, 8, 80


def _as_tuple(schema):
  return None if schema is None else (schema.n, schema.min_sep, schema.max_participations)


def _auditor_schema(r, b, k):
  """The schema the auditor accounts for the first r rounds (as `audit._audit` builds its claim)."""
  return ParticipationSchema(r, b if k > 1 else None, k) if k > 0 else None


@pytest.mark.parametrize("name", sorted(MODELS))
def test_meter_equals_the_auditor_after_every_round(name):
  model = build(MODELS[name], CLIENTS, PER_ROUND, seed=7)
  cohorts = [model.sample(r) for r in range(ROUNDS)]
  meter = PrivacyMeter({"mechanism": "dpsgd"}, 1.0, 1e-6, CLIENTS)
  by_meter = []
  for c in cohorts:
    meter.record(c.round, c.clients)
    by_meter.append(_as_tuple(meter.schema(c.round + 1)))
  rounds = np.concatenate([np.full(c.clients.size, c.round, np.int64) for c in cohorts])
  codes = np.concatenate([np.asarray(c.clients, np.int64) for c in cohorts])
  assert rounds.size > ROUNDS  # cohorts are not empty
  scan, _ = log_statistics.statistics_of_arrays(rounds, codes, CLIENTS)
  shuffled = np.random.default_rng(0).permutation(rounds.size)
  sort, _ = log_sort.sorted_statistics(rounds[shuffled], codes[shuffled], CLIENTS, None, None, None)
  for stats in (scan, sort):
    assert stats.prefix_min_sep.shape == (ROUNDS,)
    by_auditor = [
      _as_tuple(_auditor_schema(r + 1, b, k))
      for r, (b, k) in enumerate(
        zip(stats.prefix_min_sep.tolist(), stats.prefix_max_participations.tolist())
      )
    ]
    assert by_meter == by_auditor
  # The whole run's realized claim, where some device joined more than once.
  assert scan.observed_max_participations > 1
  assert (meter.min_gap, meter.max_participations) == (
    scan.observed_min_sep,
    scan.observed_max_participations,
  )


def test_meter_what_if_leaves_no_trace():
  """`epsilon_if` (the budget guard's question) asks with the cohort and leaves the counts as they were."""
  model = build(MODELS["uniform-poisson"], CLIENTS, PER_ROUND, seed=3)
  meter = PrivacyMeter({"mechanism": "dpsgd"}, 1.0, 1e-6, CLIENTS)
  for r in range(10):
    meter.record(r, model.sample(r).clients)
  before = meter.state()
  meter.epsilon_if(10, model.sample(10).clients)
  after = meter.state()
  assert all(np.array_equal(before[k], after[k]) for k in before)
