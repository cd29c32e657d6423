"""The client timer enforces the gap convention and the participation cap, and restores exactly."""

import numpy as np
import pytest

from fedmf.simulation.client_timer import ClientTimer


@pytest.mark.parametrize("availability", [1.0, 0.6])
def test_realized_schedule_respects_min_sep_and_cap(availability):
  timer = ClientTimer(
    num_clients=40,
    min_sep=5,
    clients_per_round=7,
    max_participations=3,
    availability=availability,
    seed=3,
  )
  history = {}
  for r in range(60):
    for c in timer.sample(r):
      history.setdefault(int(c), []).append(r)
  assert history, "nobody participated"
  gaps = [b - a for rounds in history.values() for a, b in zip(rounds, rounds[1:])]
  assert min(gaps) >= 5
  assert max(len(r) for r in history.values()) <= 3
  if availability == 1.0:
    # With everyone online, the timer lets a client rejoin exactly b rounds later: gap == b occurs.
    assert 5 in gaps


def test_full_cohorts_when_enough_clients_are_eligible():
  timer = ClientTimer(num_clients=50, min_sep=5, clients_per_round=10, seed=0)
  sizes = [timer.sample(r).size for r in range(20)]
  assert sizes == [10] * 20


def test_restore_reproduces_the_same_cohorts():
  a = ClientTimer(num_clients=30, min_sep=3, clients_per_round=4, availability=0.8, seed=9)
  for r in range(10):
    a.sample(r)
  saved = a.state()
  rest_a = [a.sample(r).tolist() for r in range(10, 20)]
  b = ClientTimer(num_clients=30, min_sep=3, clients_per_round=4, availability=0.8, seed=9)
  b.restore(saved)
  assert [b.sample(r).tolist() for r in range(10, 20)] == rest_a


def test_bad_arguments():
  with pytest.raises(ValueError):
    ClientTimer(num_clients=3, min_sep=0, clients_per_round=1)
  with pytest.raises(ValueError):
    ClientTimer(num_clients=3, min_sep=1, clients_per_round=1, availability=0.0)
