"""The exact (ε, δ) of one Gaussian mechanism (Balle & Wang 2018, Thm. 8), the auditor's default.

δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), μ = Δ/σ. Checked against an independent evaluation of
the theorem in 60-digit arithmetic (mpmath), against dp_accounting (its PLD accountant, which
upper-bounds the curve, and its own analytic calibration), against published values, and for the
consistency of ε(μ) with its inverse μ(ε).
"""

import json
import math

import mpmath
import pytest

from fedmf.cli import main as cli_main
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import accounting, audit, participation_log
from fedmf.privacy import gaussian_curve

mpmath.mp.dps = 60


def _delta_60_digits(epsilon, mu) -> mpmath.mpf:
  """Balle & Wang 2018, Thm. 8, in 60-digit arithmetic (no cancellation to worry about)."""
  eps, mu = mpmath.mpf(epsilon), mpmath.mpf(mu)
  return mpmath.ncdf(mu / 2 - eps / mu) - mpmath.exp(eps) * mpmath.ncdf(-mu / 2 - eps / mu)


def _epsilon_60_digits(mu: float, delta: float) -> mpmath.mpf:
  """The smallest ε with δ(ε) ≤ delta, by bisection in 60-digit arithmetic."""
  lo, hi = (
    mpmath.mpf(0),
    mpmath.mpf(mu) ** 2 / 2 + 2 * mpmath.mpf(mu) * math.sqrt(math.log(1 / delta)) + 1,
  )
  for _ in range(260):
    mid = (lo + hi) / 2
    if _delta_60_digits(mid, mu) > delta:
      lo = mid
    else:
      hi = mid
  return hi


@pytest.mark.parametrize(
  "mu,delta",
  [
    (0.05, 1e-5),
    (0.268, 1e-5),
    (1.0, 1e-5),
    (3.0, 1e-10),
    (10.0, 1e-6),
    (30.0, 1e-12),
    (100.0, 1e-6),
  ],
)
def test_epsilon_is_the_theorem_to_float64_precision(mu, delta):
  got = gaussian_curve.gaussian_epsilon(mu, delta)
  want = _epsilon_60_digits(mu, delta)
  assert abs(got - want) <= 1e-13 * want, (got, float(want))


def test_the_published_noise_for_epsilon_1_delta_1e5():
  # For Δ = 1, ε = 1, δ = 1e-5 the analytic Gaussian mechanism needs σ ≈ 3.73, where the classical
  # calibration σ = √(2 ln(1.25/δ)) / ε asks for 4.84 (Balle & Wang 2018, §1 and Fig. 1).
  sigma = 1.0 / gaussian_curve.gaussian_mu_for_epsilon(1.0, 1e-5)
  assert round(sigma, 2) == 3.73
  assert math.sqrt(2 * math.log(1.25 / 1e-5)) == pytest.approx(4.84, abs=5e-3)


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-10), (10.0, 1e-8)])
def test_calibration_agrees_with_dp_accountings_analytic_gaussian(epsilon, delta):
  from dp_accounting.pld import accountant, common

  theirs = accountant.get_smallest_gaussian_noise(
    common.DifferentialPrivacyParameters(epsilon, delta)
  )
  ours = 1.0 / gaussian_curve.gaussian_mu_for_epsilon(epsilon, delta)
  # dp_accounting stops its search at a tolerance of about 1e-8, from above.
  assert ours == pytest.approx(theirs, rel=2e-7)
  assert ours <= theirs * (1 + 1e-12)


@pytest.mark.parametrize("delta", [1e-5, 1e-10])
def test_pld_upper_bounds_the_exact_epsilon_and_is_close(delta):
  for mu in (0.02, 0.3, 1.0, 4.0):
    exact = gaussian_curve.gaussian_epsilon(mu, delta)
    pld = accounting.pld_gaussian_epsilon(mu, delta)
    assert pld >= exact - 1e-9
    assert pld - exact <= 2e-3 + 1e-4 * exact


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-12])
def test_epsilon_and_its_inverse_are_consistent(delta):
  for mu in (0.01, 0.4, 2.5, 20.0):
    eps = gaussian_curve.gaussian_epsilon(mu, delta)
    # ε is the smallest ε with δ(ε) ≤ δ, to a few ulps.
    assert float(_delta_60_digits(eps, mu)) <= delta * (1 + 1e-12)
    assert float(_delta_60_digits(eps * (1 - 1e-12), mu)) > delta
    # And the largest μ that is (ε, δ)-DP is μ itself.
    assert gaussian_curve.gaussian_mu_for_epsilon(eps, delta) == pytest.approx(mu, rel=1e-10)


BLT400 = {
  "mechanism": "blt",
  "buf_decay": [0.9999999999921251, 0.9944453083640997, 0.8985923474607591, 0.4912001418098778],
  "output_scale": [
    0.0070314825502323835,
    0.10613806907600574,
    0.1898159060327625,
    0.1966594748073734,
  ],
}


def test_strategy_accounting_is_exact_by_default_and_pld_bounds_it():
  schema = ParticipationSchema(1280, 300, 4)
  exact = accounting.account(BLT400, schema, 7.379, 1e-10)
  pld = accounting.account(BLT400, schema, 7.379, 1e-10, accountant="pld")
  assert exact.accountant == "analytic" and pld.accountant == "pld"
  assert exact.epsilon == gaussian_curve.gaussian_epsilon(exact.sensitivity / 7.379, 1e-10)
  assert exact.epsilon <= pld.epsilon <= exact.epsilon + 2e-3


def test_fedmf_audit_states_the_exact_epsilon_by_default_and_pld_on_request(tmp_path, capsys):
  log = tmp_path / "log.csv"
  participation_log.write_participation_log(
    log, [0, 0, 3, 5, 5, 9, 40], ["a", "b", "a", "b", "c", "a", "c"]
  )
  strategy = tmp_path / "blt.json"
  strategy.write_text(json.dumps(BLT400))
  base = ["audit", str(log), "--strategy", str(strategy), "--noise-multiplier", "3"]
  base += ["--delta", "1e-6", "--rounds", "50", "--json"]
  assert cli_main.main(base) == 0
  exact = json.loads(capsys.readouterr().out)
  assert exact["accountant"] == "analytic"
  mu = exact["sensitivity"] / 3
  assert exact["epsilon"] == gaussian_curve.gaussian_epsilon(mu, 1e-6)
  assert cli_main.main(base + ["--accountant", "pld"]) == 0
  pld = json.loads(capsys.readouterr().out)
  assert pld["accountant"] == "pld" and pld["sensitivity"] == exact["sensitivity"]
  assert exact["epsilon"] <= pld["epsilon"] <= exact["epsilon"] + 2e-3
  # The headline ε is the per-round curve's last point: one ε, one definition.
  result = audit.audit_log(log, BLT400, 3.0, 1e-6, rounds=50, curve=True)
  assert result.curve.epsilon[-1] == result.realized.epsilon
