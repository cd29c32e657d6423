"""The worst-case canary pattern against brute force over every feasible 0/1 pattern."""

import numpy as np
import pytest

from fedmf.mf import strategies as st
from fedmf.mf import worst_pattern
from fedmf.mf.schema import ParticipationSchema
from tests.mf.brute_force import brute_force_patterns
from tests.mf.random_strategies import random_bandmf

STRATEGIES = {
  "blt": {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]},
  "tree": {"mechanism": "tree", "variant": "online-honaker"},
  "tree-vanilla": {"mechanism": "tree", "variant": "vanilla"},
  "dpsgd": {"mechanism": "dpsgd"},
}


def _best_over_patterns(c, n, b, k):
  x = c.T @ c
  return max(np.sqrt(worst_pattern.pattern_value_sq(x, p)) for p in brute_force_patterns(n, b, k))


@pytest.mark.parametrize("name", [*STRATEGIES, "bandmf"])
@pytest.mark.parametrize("n,b,k", [(12, 3, 3), (12, 1, 4), (11, 4, None), (12, 5, 1)])
def test_pattern_attains_the_best_feasible_pattern(name, n, b, k):
  strategy = st.load_strategy(random_bandmf(n, 3) if name == "bandmf" else STRATEGIES[name])
  schema = ParticipationSchema(n, b, k)
  found = worst_pattern.worst_case_pattern(strategy, schema)
  c = strategy.matrix(n)
  rounds = np.asarray(found.rounds)
  assert len(rounds) <= schema.effective_max_participations
  assert np.all(np.diff(rounds) >= b) and rounds.min() >= 0 and rounds.max() < n
  u = np.zeros(n)
  u[rounds] = 1.0
  assert found.value == pytest.approx(np.linalg.norm(c @ u), rel=1e-12)
  # X ≥ 0 for all of these: the best 0/1 pattern is the sensitivity (BandMF Eq. 5 tight).
  assert np.all(c.T @ c >= -1e-12)
  assert found.value == pytest.approx(_best_over_patterns(c, n, b, k), rel=1e-9)
  assert found.value <= found.sensitivity.value * (1 + 1e-9)
  if found.sensitivity.method == "exact":
    assert found.method == "exact"


def test_exact_labels_per_mechanism():
  schema = ParticipationSchema(40, 7, 4)
  for name, method in (("blt", "exact"), ("dpsgd", "exact"), ("tree", "lower-bound")):
    found = worst_pattern.worst_case_pattern(st.load_strategy(STRATEGIES[name]), schema)
    assert found.method == method, name
  blt = worst_pattern.worst_case_pattern(st.load_strategy(STRATEGIES["blt"]), schema)
  assert blt.rounds == (0, 7, 14, 21)  # BLT Thm 3.1's π*


def test_banded_pattern_is_the_vecsens_argmax():
  strategy = st.load_strategy(random_bandmf(30, 4, seed=3))
  schema = ParticipationSchema(30, 5, 3)  # b ≥ b̂: BandMF Thm 2 exact
  found = worst_pattern.worst_case_pattern(strategy, schema)
  assert found.sensitivity.method == "exact" and found.method == "exact"
  col_sq = np.sum(strategy.matrix(30) ** 2, axis=0)
  assert np.sum(col_sq[list(found.rounds)]) == pytest.approx(found.value**2, rel=1e-12)


def test_vec_sens_argmax_matches_vec_sens():
  rng = np.random.default_rng(0)
  from fedmf.mf import sensitivity

  for _ in range(50):
    n = int(rng.integers(1, 30))
    b, k = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    v = rng.normal(size=n)
    k_eff = sensitivity.effective_max_participations(n, b, k)
    rounds = worst_pattern.vec_sens_argmax(v, b, k_eff)
    assert len(rounds) <= k_eff and np.all(np.diff(rounds) >= b)
    assert np.sum(v[list(rounds)]) == pytest.approx(sensitivity.vec_sens(v, b, k), abs=1e-12)


def test_a_pattern_above_the_sensitivity_raises():
  strategy = st.load_strategy(STRATEGIES["blt"])
  schema = ParticipationSchema(20, 4, 3)
  real = strategy.sensitivity(schema)
  # A sensitivity below what a feasible pattern shows is a defect: it must not be hidden.
  cache = strategy.__dict__["_sensitivity_cache"]
  key = next(iter(cache))
  cache[key] = type(real)(real.value * 0.9, "exact", "wrong")
  with pytest.raises(AssertionError, match="above the exact sensitivity"):
    worst_pattern.worst_case_pattern(strategy, schema)
