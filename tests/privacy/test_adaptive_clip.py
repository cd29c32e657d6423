"""Adaptive clipping's count releases composed with the matrix mechanism: dp_accounting's own
events as the independent reference, calibration for a target ε, the budget split, the curve."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedmf.errors import FedmfUserError
from fedmf.mf import strategies as st
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import accounting
from fedmf.privacy import adaptive_clip
from fedmf.privacy import curve as curve_lib

BLT = {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]}


def _dp_accounting_epsilon(sensitivity, sigma, count_noise, releases, delta, interval=1e-4):
  """The independent composition: the matrix mechanism as GaussianDpEvent(σ/s) (BandMF §2) and a
  device's k count releases, each a Gaussian of sensitivity ½ and std z_b/2, i.e. noise multiplier
  z_b, composed k times; PLD accountant of dp_accounting."""
  event = dp_accounting.ComposedDpEvent(
    [
      dp_accounting.GaussianDpEvent(sigma / sensitivity),
      dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(count_noise), releases),
    ]
  )
  accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
  accountant.compose(event)
  return accountant.get_epsilon(delta), event


@pytest.mark.parametrize(
  "strategy, schema, sigma, count_noise",
  [
    ({"mechanism": "dpsgd"}, ParticipationSchema(30, 10, 3), 2.0, 4.0),
    (BLT, ParticipationSchema(40, 8, 5), 1.5, 100.0),
    ({"mechanism": "tree", "variant": "online-honaker"}, ParticipationSchema(16, 4, 4), 2.5, 3.0),
  ],
)  # fmt: skip
def test_composition_equals_dp_accounting_own_events(strategy, schema, sigma, count_noise):
  delta = 1e-6
  ours = accounting.account(strategy, schema, sigma, delta, count_noise_multiplier=count_noise)
  k = schema.effective_max_participations
  assert ours.count_releases == k
  reference, event = _dp_accounting_epsilon(ours.sensitivity, sigma, count_noise, k, delta)
  # PLD is pessimistic by about its discretization: ε_pld ≥ ε and close to it.
  assert reference >= ours.epsilon - 1e-9
  assert reference == pytest.approx(ours.epsilon, rel=1e-3, abs=1e-3)
  # fedmf's PLD path (one Gaussian of μ² = (s/σ)² + k/z_b²) gives dp_accounting's number too.
  pld = accounting.account(
    strategy, schema, sigma, delta, count_noise_multiplier=count_noise, accountant="pld"
  )
  assert pld.epsilon == pytest.approx(reference, rel=2e-3, abs=2e-3)
  # RDP (another of dp_accounting's accountants) only bounds it from above.
  rdp = rdp_privacy_accountant.RdpAccountant()
  rdp.compose(event)
  assert rdp.get_epsilon(delta) >= ours.epsilon
  # ρ adds: the matrix mechanism's s²/(2σ²) and k/(2 z_b²).
  assert ours.rho == pytest.approx(
    ours.sensitivity**2 / (2 * sigma**2) + k / (2 * count_noise**2), rel=1e-12
  )


def test_counts_never_lower_epsilon_and_vanish_with_huge_count_noise():
  schema = ParticipationSchema(40, 8, 5)
  fixed = accounting.account(BLT, schema, 3.0, 1e-6)
  for z in (0.5, 3.0, 30.0, 1e4):
    adaptive = accounting.account(BLT, schema, 3.0, 1e-6, count_noise_multiplier=z)
    assert adaptive.epsilon > fixed.epsilon
  assert accounting.account(
    BLT, schema, 3.0, 1e-6, count_noise_multiplier=1e9
  ).epsilon == pytest.approx(fixed.epsilon, rel=1e-9)
  assert fixed.count_noise_multiplier is None and not fixed.adaptive


@pytest.mark.parametrize("count_noise", [20.0, 100.0])
def test_calibration_reaches_the_target_with_the_counts(count_noise):
  schema = ParticipationSchema(40, 8, 5)
  target, delta = 8.0, 1e-6
  result = accounting.calibrate_noise_multiplier(
    BLT, schema, target, delta, count_noise_multiplier=count_noise
  )
  assert result.count_noise_multiplier == count_noise and result.count_releases == 5
  assert result.epsilon <= target
  assert result.epsilon == pytest.approx(target, rel=2e-3)
  # Independently: dp_accounting's composition at the calibrated σ is the target, up to its PLD's
  # discretization (pessimistic: never below the exact curve the calibration inverts).
  reference, _ = _dp_accounting_epsilon(
    result.sensitivity, result.noise_multiplier, count_noise, 5, delta
  )
  assert result.epsilon - 1e-9 <= reference == pytest.approx(target, rel=1e-6)
  # The counts cost σ: more noise than the fixed clip's calibration.
  fixed = accounting.calibrate_noise_multiplier(BLT, schema, target, delta)
  assert result.noise_multiplier > fixed.noise_multiplier


def test_a_budget_fraction_spends_that_share_of_rho_on_the_counts():
  schema = ParticipationSchema(40, 8, 5)
  fraction = 0.1
  result = accounting.calibrate_noise_multiplier(
    BLT, schema, 4.0, 1e-6, count_budget_fraction=fraction
  )
  count_rho = 5 / (2 * result.count_noise_multiplier**2)
  assert count_rho / result.rho == pytest.approx(fraction, rel=1e-9)
  assert result.epsilon <= 4.0
  assert result.epsilon == pytest.approx(4.0, rel=2e-3)


def test_counts_that_alone_exceed_the_target_are_refused_in_one_line():
  with pytest.raises(FedmfUserError, match="count_noise_multiplier") as e:
    accounting.calibrate_noise_multiplier(
      BLT, ParticipationSchema(40, 8, 5), 1.0, 1e-6, count_noise_multiplier=0.5
    )
  assert "\n" not in str(e.value)


def test_andrew_et_al_default_split():
  # σ_b = m/20 clients of count noise (Andrew et al. §3) is z_b = std/½ = m/10.
  assert adaptive_clip.default_count_noise_multiplier(1000) == pytest.approx(100.0)
  assert adaptive_clip.count_mu(100.0, 3) == pytest.approx(math.sqrt(3) / 100)
  assert adaptive_clip.count_mu(None, 3) == 0.0 and adaptive_clip.count_mu(2.0, 0) == 0.0
  assert math.isinf(adaptive_clip.count_mu(0.0, 1))


@pytest.mark.parametrize(
  "fields, key",
  [
    ({"target_quantile": 1.5}, "target_quantile"),
    ({"initial": 0.0}, "initial"),
    ({"learning_rate": -1.0}, "learning_rate"),
    ({"count_noise_multiplier": -1.0}, "count_noise_multiplier"),
    ({"count_budget_fraction": 1.0}, "count_budget_fraction"),
    ({"count_noise_multiplier": 1.0, "count_budget_fraction": 0.5}, "not both"),
    ({"initial": float("nan")}, "initial"),
    ({"initial": "1"}, "initial"),
  ],
)
def test_adaptive_clip_validation_names_the_key(fields, key):
  with pytest.raises(FedmfUserError, match=key):
    adaptive_clip.AdaptiveClip(**fields).validate()


def test_curve_composes_the_counts_of_each_prefix():
  strategy = st.load_strategy(BLT)
  b = np.array([-1, -1, -1, 2, 2, 2, 2, 2])
  k = np.array([1, 1, 1, 2, 2, 3, 3, 4])
  curve = curve_lib.epsilon_curve(
    strategy, b, k, 2.0, 1e-6, count_noise_multiplier=5.0, max_evaluations=None, time_budget=1e9
  )
  fixed = curve_lib.epsilon_curve(strategy, b, k, 2.0, 1e-6, max_evaluations=None, time_budget=1e9)
  assert np.all(curve.epsilon > fixed.epsilon)
  # Each prefix: the accountant of its realized schema, counts included.
  for r in (1, 4, 8):
    schema = ParticipationSchema(r, None if k[r - 1] <= 1 else int(b[r - 1]), int(k[r - 1]))
    expected = accounting.account(strategy, schema, 2.0, 1e-6, count_noise_multiplier=5.0)
    assert curve.epsilon[r - 1] == pytest.approx(expected.epsilon, rel=1e-12)
