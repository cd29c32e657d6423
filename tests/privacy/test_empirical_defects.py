"""Canaries catch a broken mechanism, and never accuse a correct one (issue 33, acceptance).

Test doubles outside the product's code paths simulate the projections a run's canaries would
show (tests/privacy/canary_simulation.py) for a BLT over n = 150 rounds, b = 50, k = 3 (the
default config's schema), 2000 canaries (1000 inserted on average, all on fair coins), the
worst-case pattern (0, 50, 100), σ calibrated to an analytic ε of 2 at δ = 1e-6. 20 seeds each.

* correct noise: `epsilon_lower` never exceeds the analytic ε; the noise check agrees;
* noise σ/4: `epsilon_lower` above the analytic ε in ≥ 19 of 20 seeds;
* a canary that joins rounds 0, 1, …, 9 while the claim allows 3 rounds ≥ 50 apart: the same;
* C⁻¹ replaced by the identity: NOT a privacy defect for this C (‖C 1_π‖ ≥ ‖1_π‖ when X ≥ 0 with a
  unit diagonal, so the identity's noise hides a canary better): `epsilon_lower` stays below the
  analytic ε, while the noise check reports that the noise is not the claimed one (it leaks less);
* C⁻¹ applied twice (noise C⁻²z, which cancels over rounds: this BLT's worst-case canary leaks
  2.1× the claimed μ, the claim-whitened statistic sees 1.3×): the noise check measures the leak
  and flags it in ≥ 19 of 20 seeds (docs/empirical-privacy.md, *What a measurement cannot show*).
"""

import numpy as np
import pytest

from fedmf.mf import strategies as st
from fedmf.mf import worst_pattern
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import accounting, canary_design, empirical
from tests.privacy.canary_simulation import pattern_matrix, simulate_record

N, B, K, M, DELTA, EPSILON = 150, 50, 3, 2000, 1e-6, 2.0
SEEDS = range(20)


@pytest.fixture(scope="module")
def setting():
  strategy = st.load_strategy(
    {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.2, 0.3]}
  )
  pattern = worst_pattern.worst_case_pattern(strategy, ParticipationSchema(N, B, K))
  assert pattern.method == "exact" and pattern.rounds == (0, 50, 100)
  sigma = pattern.value / accounting.gaussian_mu_for_epsilon(EPSILON, DELTA)
  return strategy, pattern, sigma


def _measure(setting, *, noise_scale=1.0, noise_matrix=None, inserted_rounds=None):
  strategy, pattern, sigma = setting
  p = strategy.per_round_noise_matrix(N) if noise_matrix is None else noise_matrix(strategy)
  rounds = pattern.rounds if inserted_rounds is None else inserted_rounds
  patterns = pattern_matrix(rounds, N, M)
  out = []
  for seed in SEEDS:
    design = canary_design.draw_design(M // 2, M // 2, seed)
    record = simulate_record(p, sigma * noise_scale, patterns, design, np.random.default_rng(seed))
    out.append(
      empirical.estimate(
        record, strategy, sigma, DELTA, analytic_mu=pattern.value / sigma, claim="the test's"
      )
    )
  return out


def _lower_above(results):
  return sum(r.estimates["all_releases"].lower_exceeds_analytic for r in results)


def test_correct_mechanism_is_never_accused(setting):
  results = _measure(setting)
  assert _lower_above(results) == 0
  assert all(not r.failures() for r in results)
  assert sum(bool(r.noise_check.leak_consistent) for r in results) >= 18
  estimates = [r.estimates["all_releases"].fit.epsilon for r in results]
  assert np.median(estimates) == pytest.approx(EPSILON, rel=0.1)


def test_noise_at_a_quarter_is_caught(setting):
  results = _measure(setting, noise_scale=0.25)
  assert _lower_above(results) >= 19
  assert all(r.failures() for r in results if r.estimates["all_releases"].lower_exceeds_analytic)
  assert sum(r.noise_check.scale_consistent for r in results) <= 1


def test_canary_joining_within_b_rounds_is_caught(setting):
  results = _measure(setting, inserted_rounds=range(10))
  assert _lower_above(results) >= 19


def test_identity_noise_is_reported_as_other_noise_but_leaks_less(setting):
  results = _measure(setting, noise_matrix=lambda s: np.eye(N))
  assert _lower_above(results) == 0  # it is more private than claimed: nothing to refute
  assert sum(r.noise_check.leak_consistent is False for r in results) >= 19
  assert all(r.noise_check.measured_mu < r.noise_check.claimed_mu for r in results)


def test_noise_applied_twice_is_measured_by_the_noise_check(setting):
  def twice(strategy):
    p = strategy.per_round_noise_matrix(N)
    return p @ p

  results = _measure(setting, noise_matrix=twice)
  flagged = [r for r in results if r.noise_check.measured_mu_interval[0] > r.noise_check.claimed_mu]
  assert len(flagged) >= 19
  assert all("leaks MORE" in " ".join(r.warnings) for r in flagged)
