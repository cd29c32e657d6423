"""One calibrator and one typed accountant choice (issue 39 item 3, issue 38 item 4).

`accounting.calibrate_sigma` is the one bracket-and-root routine every σ search uses; each function
that takes an accountant defaults to the documented default of its use: the claim's
(`CLAIM_ACCOUNTANT`, the exact curve) or the amplified event's (`AMPLIFIED_ACCOUNTANT`, PLD)."""

import inspect
import math
import typing

import pytest

from fedmf.errors import FedmfUserError
from fedmf.privacy import (
  accounting,
  amplification,
  audit,
  partition_audit,
)
from fedmf.privacy import gaussian_curve


def _exact(mu_scale):
  """ε(σ) of one Gaussian with sensitivity `mu_scale` (the exact curve): decreasing in σ."""
  return lambda sigma: gaussian_curve.gaussian_epsilon(mu_scale / sigma, 1e-6)


@pytest.mark.parametrize("target", [0.05, 1.0, 8.0, 300.0])
@pytest.mark.parametrize("upper", [1e-2, 1.0, 1e4])
def test_calibrate_sigma_is_conservative_and_within_rtol(target, upper):
  epsilon_of = _exact(3.0)
  rtol = 1e-4
  sigma = accounting.calibrate_sigma(epsilon_of, target, upper, rtol=rtol, floor=1e-6)
  assert epsilon_of(sigma) <= target
  assert epsilon_of(sigma * math.exp(-2 * rtol)) > target  # Not much above the least σ.
  # The exact answer, by the curve's own inversion (a root in μ, not in σ).
  exact = 3.0 / gaussian_curve.gaussian_mu_for_epsilon(target, 1e-6)
  assert exact <= sigma * (1 + 1e-12) and sigma <= exact * math.exp(2 * rtol)


def test_calibrate_sigma_bounds_and_floor():
  with pytest.raises(FedmfUserError, match="no noise multiplier <= 100 reaches epsilon 0.001"):
    accounting.calibrate_sigma(_exact(3.0), 0.001, 1.0, ceiling=100.0)
  # Even the floor reaches a huge target: the least σ tried that reaches it (conservative).
  sigma = accounting.calibrate_sigma(_exact(3.0), 1e6, 1.0, floor=0.1)
  assert 0.1 <= sigma and _exact(3.0)(sigma) <= 1e6


def test_calibrate_from_exact_keeps_the_exact_root_and_raises_it_only_for_pld():
  mu = gaussian_curve.gaussian_mu_for_epsilon(2.0, 1e-6)
  exact = 1.0 / mu
  analytic = accounting.calibrate_from_exact(
    lambda s: gaussian_curve.gaussian_epsilon(1 / s, 1e-6), 2.0, exact
  )
  assert analytic == exact * (1 + 1e-12)
  pld = accounting.calibrate_from_exact(
    lambda s: accounting.pld_gaussian_epsilon(1 / s, 1e-6), 2.0, exact
  )
  assert accounting.pld_gaussian_epsilon(1 / pld, 1e-6) <= 2.0
  assert exact < pld < exact * 1.01  # PLD is pessimistic by about its discretization.


def test_the_old_calibrators_are_gone():
  assert not hasattr(accounting, "calibrate_amplified_bandmf")
  assert not hasattr(amplification, "calibrate")


def test_training_and_bands_auto_calibrate_amplified_bandmf_by_the_same_function():
  """The plan's σ for amplified BandMF is `amplification.noise_for`'s, which --bands auto uses."""
  from fedmf.mf.strategies import load_strategy
  from fedmf.mf.schema import ParticipationSchema
  from fedmf.participation import ParticipationConfig, build
  from fedmf.program import plan as plan_lib

  strategy = load_strategy(
    {"mechanism": "bandmf", "n": 12, "bands": 2, "columns": [[1.0, 0.0]] * 11 + [[1.0]]}
  )
  model = build(
    ParticipationConfig(model="cyclic-poisson", partitions=2, sampling_probability=0.25),
    400,
    50,
    seed=0,
  )

  class Privacy:
    noise_multiplier = None
    target_epsilon = 4.0
    delta = 1e-6

  class Config:
    privacy = Privacy
    noise_scale_factor = 1.0

  plan = plan_lib.make_plan(Config, model, strategy, ParticipationSchema(12, 2, 6))
  sampling = amplification.CyclicPoissonSampling.from_probability(400, 2, 0.25)
  assert plan.noise_multiplier == amplification.noise_for(4.0, 12, sampling, 1e-6)
  assert plan.accountant == "pld" and plan.epsilon <= 4.0


ACCOUNTANT_FUNCTIONS = {
  accounting.account: "analytic",
  accounting.account_sensitivity: "analytic",
  accounting.account_estimate: "analytic",
  accounting.calibrate_noise_multiplier: "analytic",
  audit._validated: "analytic",
  amplification.epsilon_for: "pld",
  amplification.noise_for: "pld",
  amplification.account_amplified: "pld",
}


def test_every_accountant_parameter_is_typed_with_the_default_of_its_use():
  modules = (accounting, amplification, audit, partition_audit)
  found = {
    fn
    for module in modules
    for _, fn in inspect.getmembers(module, inspect.isfunction)
    if fn.__module__ == module.__name__ and "accountant" in inspect.signature(fn).parameters
  }
  assert set(ACCOUNTANT_FUNCTIONS) <= found
  for fn in found:
    parameter = inspect.signature(fn).parameters["accountant"]
    hints = typing.get_type_hints(fn)
    assert hints["accountant"] == accounting.Accountant, fn.__qualname__
    if parameter.default is not inspect.Parameter.empty:
      use = ACCOUNTANT_FUNCTIONS.get(fn)
      assert parameter.default in (accounting.CLAIM_ACCOUNTANT, accounting.AMPLIFIED_ACCOUNTANT)
      if use is not None:
        assert parameter.default == use, fn.__qualname__
  assert typing.get_args(accounting.Accountant) == ("analytic", "pld")
