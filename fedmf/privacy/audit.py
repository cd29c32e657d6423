"""The post-hoc min-separation auditor: participation log → realized (b, k) → sensitivity → ρ, ε.

In cross-device FL a device-side timer enforces the separation, so the true min-separation b and max
participations k are known only after training (BLT §1, §5, App. C; BandMF App. K). The auditor reads
the log (``fedmf.privacy.participation_log``), computes the realized b (minimum gap between a client's consecutive
participations; None when nobody participated twice, i.e. single participation) and k, the
violations of declared limits, and the privacy claim the log supports, using
``fedmf.mf.evaluation.sensitivity`` and ``fedmf.privacy.accounting``. Notation: docs/architecture.md
(b is the gap |i-j|, never b-1).

Duplicate (round, client_id) rows are never merged silently: they are reported as ``duplicate``
violations and ``claim_covers_all_clients`` becomes false. The realized (b, k) and the claim are
computed on the distinct (round, client) pairs, so they do not cover a client whose update may have
been summed twice in one round.

The parts: ``log_statistics`` (what is counted, by the one-pass scan ``log_scan`` or the sort
``log_sort``; the types in ``log_counts``), ``audit_result`` (verdict, ``--json``, summary); this
module accounts the claims and runs the audit.

A log is streamed in one pass in round order (``LogScan``), vectorized over batches of rows, with
memory that grows with the clients and rounds, not the rows; violations are counted in full and
listed up to a limit. Logs not in round order are sorted in memory instead. Sensitivities are
evaluated once per distinct (rounds, b, k), shared by the claims and the per-round ε curve.

Each claim is a single Gaussian mechanism (μ = s/σ, no amplification), so its ε is by default the
exact analytic Gaussian curve's (Balle & Wang 2018, Thm. 8), the same as the per-round ε curve's;
dp_accounting's PLD (``accountant='pld'``) is a cross-check and is imported only then. A run with
adaptive clipping (``count_noise_multiplier`` z_b) also released one noisy count per round: a
device in k rounds of the log is in k of them, composed in as μ² = (s/σ)² + k/z_b²
(``fedmf.privacy.adaptive_clip``), in every claim and the curve.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Optional

import numpy as np

from fedmf.privacy import accounting
from fedmf.privacy import adaptive_clip
from fedmf.privacy import curve as curve_lib
from fedmf.privacy import gaussian_curve
from fedmf.privacy import participation_log
from fedmf.privacy import partition_audit
from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.mf.schema import ParticipationSchema

from fedmf.privacy import log_statistics
from fedmf.privacy.audit_result import AuditResult, DeclaredClaim
from fedmf.privacy.log_counts import LogStatistics, ViolationTable


# The per-round ε curve: its memory (b_r, k_r, sensitivities, methods, ρ, ε and the temporaries of
# the Gaussian curve), and its walk over the rounds in Python (methods, the CSV lines of the report:
# about 3 steps a round).
_CURVE_COST = resources.PerRound("the per-round epsilon curve", 160, 3 / resources.PYTHON_RATE)


def _check_curve(num_rounds: int) -> None:
  """Refuses the per-round ε curve of the report over ``num_rounds`` rounds beyond the limits."""
  _CURVE_COST.check(num_rounds, f"the report's epsilon curve over n = {num_rounds:,} rounds")


# ---------------------------------------------------------------------------------------------------
# The audit.


def _positive_int_or_none(value: Any, what: str) -> Optional[int]:
  if value is None:
    return None
  if isinstance(value, bool) or int(value) != value or value < 1:
    raise FedmfUserError(f"{what} must be an integer >= 1, got {value!r}")
  return int(value)


# PLD accounting discretizes the privacy loss of the Gaussian on a grid (dp_accounting's default
# interval 1e-4) of about 2e4 mu (10 + mu / 2) points, ~85 bytes each at peak: 0.5 GB at mu = 9,
# 1.3 GB at mu = 20, 28 GB for a log with a client in all 2000 rounds (mu ~ 180; it was killed).
# Above this many points (mu ~ 24, epsilon in the hundreds) the exact analytic Gaussian curve gives
# epsilon instead.
_PLD_MAX_POINTS = 20_000_000


def _pld_grid_points(mu: float) -> float:
  """Grid points of dp_accounting's PLD of one Gaussian with sensitivity / sigma = mu."""
  from dp_accounting.pld import privacy_loss_mechanism  # pylint: disable=g-import-not-at-top

  points = 0.0
  for adjacency in (
    privacy_loss_mechanism.AdjacencyType.REMOVE,
    privacy_loss_mechanism.AdjacencyType.ADD,
  ):
    bounds = privacy_loss_mechanism.GaussianPrivacyLoss(
      1.0 / mu, sensitivity=1.0, adjacency_type=adjacency
    ).connect_dots_bounds()
    points += (bounds.epsilon_upper - bounds.epsilon_lower) / accounting.PLD_VALUE_DISCRETIZATION
  return points


def _account(
  sens: Any,
  sigma: float,
  delta: float,
  accountant: accounting.Accountant,
  label: str,
  warnings: list[str],
  count_noise_multiplier: Optional[float] = None,
  releases: int = 0,
) -> accounting.GaussianAccounting:
  """ρ and ε of a claim with known sensitivity (and adaptive clipping's `releases` count releases
  per device when `count_noise_multiplier` is given); the analytic curve when PLD would not fit.

  σ = 0 (trained without DP) has no guarantee: ρ = ε = inf, accountant 'none'.
  """
  if sigma == 0:
    return accounting.GaussianAccounting(
      sensitivity=sens.value,
      sensitivity_method=sens.method,
      sensitivity_algorithm=sens.algorithm,
      noise_multiplier=0.0,
      rho=math.inf,
      epsilon=math.inf,
      delta=delta,
      accountant="none",
      count_noise_multiplier=count_noise_multiplier,
      count_releases=releases if count_noise_multiplier is not None else 0,
    )
  if count_noise_multiplier is not None and count_noise_multiplier == 0:
    raise FedmfUserError(
      "count noise multiplier 0 with noise multiplier > 0: adaptive clipping's counts were released "
      "without noise, so no epsilon holds"
    )
  mu = adaptive_clip.combined_mu(sens.value / sigma, count_noise_multiplier, releases)
  if accountant == "pld" and mu > 0:
    points = _pld_grid_points(mu)
    if points > _PLD_MAX_POINTS:
      warnings.append(
        f"the {label} claim's PLD accounting would need {points / 1e6:.0f}M grid points "
        f"(mu = {mu:.3g}): its epsilon is from the exact "
        "analytic Gaussian curve instead, which PLD only approximates from above"
      )
      accountant = "analytic"
  return accounting.account_estimate(
    sens, sigma, delta, accountant, count_noise_multiplier, releases
  )


def _audit(
  stats: LogStatistics, violations: ViolationTable, request: "_Request", log_name: str
) -> AuditResult:
  """The claims a log's statistics support (the accounting half of ``audit_log``)."""
  strategy, sigma, delta, method = request.strategy, request.sigma, request.delta, request.method
  rounds, min_sep, max_participations = request.rounds, request.min_sep, request.max_participations
  accountant, curve, max_epsilon = request.accountant, request.curve, request.max_epsilon
  warnings: list[str] = []
  if rounds is None:
    n = stats.max_round + 1
    source = "inferred"
    warnings.append(
      f"--rounds not given: assuming n = max round + 1 = {n}; rounds released after the last "
      "logged participation would add to the privacy cost"
    )
  else:
    n = rounds
    source = "given"
    if stats.max_round >= n:
      raise FedmfUserError(
        f"the log has a participation in round {stats.max_round}, but --rounds is {n}"
      )
  strategy.check_horizon(n)
  if curve and sigma > 0:
    _check_curve(n)
  if stats.duplicate_rows:
    warnings.append(
      f"{stats.duplicate_rows} duplicate (round, client_id) rows: those clients' updates may have "
      "been summed twice, and the claim does not cover them"
    )
  if stats.cut_off_row is not None:
    warnings.append(
      f"the log's last line (row {stats.cut_off_row}) has no line end: a writer stopped mid-line "
      "may have cut it, so its client id may be part of another client's, whose participation the "
      "claim then does not cover (the row is counted as it reads)"
    )
  if sigma == 0:
    warnings.append("noise multiplier 0: trained without DP, so no privacy guarantee holds")

  # One sensitivity evaluation per distinct (rounds, b, k), cached by the strategy: the realized
  # claim is also the ε curve's last point.
  def sensitivity(r: int, b: Optional[int], k: Optional[int]):
    return strategy.checked_sensitivity(ParticipationSchema(r, b, k), method)

  k_obs = stats.observed_max_participations
  b_obs = stats.observed_min_sep
  count = request.count_noise_multiplier
  realized = _account(
    sensitivity(n, b_obs if k_obs > 1 else None, k_obs),
    sigma,
    delta,
    accountant,
    "realized",
    warnings,
    count,
    k_obs,  # A device in k rounds is in k count releases.
  )
  declared = None
  if min_sep is not None or max_participations is not None:
    d = _account(
      sensitivity(n, min_sep, max_participations),
      sigma,
      delta,
      accountant,
      "declared",
      warnings,
      count,
      ParticipationSchema(n, min_sep, max_participations).effective_max_participations,
    )
    declared = DeclaredClaim(min_sep, max_participations, d)
    counts = violations.counts()
    if counts["min-sep"] or counts["max-participations"]:
      warnings.append(
        f"the log violates the declared limits ({counts['min-sep']} min-sep, "
        f"{counts['max-participations']} max-participations client violations): the declared "
        "claim does not hold; the realized claim does"
      )
  for acc, label in (
    (realized, "realized"),
    (declared.accounting if declared else None, "declared"),
  ):
    if acc is not None and acc.sensitivity_method == "lower-bound":
      warnings.append(f"the {label} sensitivity is a LOWER bound: the epsilon is not a guarantee")
  eps_curve = None
  if curve and sigma > 0:  # Without noise there is no ε to follow.
    b_r = np.full(n, -1, dtype=np.int64)
    k_r = np.zeros(n, dtype=np.int64)
    m = min(n, stats.prefix_min_sep.shape[0])
    b_r[:m] = stats.prefix_min_sep[:m]
    k_r[:m] = stats.prefix_max_participations[:m]
    if n > m:  # Released rounds after the last logged participation.
      b_r[m:] = b_r[m - 1]
      k_r[m:] = k_r[m - 1]
    # "every-round": each r evaluated at its own (r, b_r, k_r), as a run's meter does round by
    # round (console, metrics.csv), so the report shows the same ε (issue 26, C.10); otherwise a
    # bounded number of evaluations, the others labelled upper bounds.
    every_round = {"max_evaluations": None, "time_budget": 1e12} if curve == "every-round" else {}
    eps_curve = curve_lib.epsilon_curve(
      strategy,
      b_r,
      k_r,
      sigma,
      delta,
      method=method,
      count_noise_multiplier=count,
      **every_round,
    )
  strategy_info = {"mechanism": strategy.mechanism, "description": strategy.describe()}
  if strategy.horizon is not None:
    strategy_info["n"] = int(strategy.horizon)
  return AuditResult(
    log=log_name,
    strategy=strategy_info,
    rounds=n,
    rounds_source=source,
    stats=stats,
    violations=violations,
    realized=realized,
    declared=declared,
    warnings=tuple(warnings),
    curve=eps_curve,
    max_epsilon=max_epsilon,
    notes=tuple(request.notes),
  )


def _with_amplification(
  result: AuditResult, arrays: participation_log.ParticipationArrays, request: "_Request"
) -> AuditResult:
  """The result with the partition check and amplified ε of a declared cyclic Poisson sampling.

  Without a declaration, or without noise (no ε to amplify), the result is unchanged.
  """
  if not request.amplifies:
    return result
  amplified = partition_audit.audit_declared(
    arrays.client_ids,
    arrays.codes,
    arrays.rounds,
    request.sampling,
    strategy=request.strategy,
    n=result.rounds,
    noise_multiplier=request.sigma,
    delta=request.delta,
    accountant=request.accountant,
  )
  return dataclasses.replace(result, amplified=amplified, notes=result.notes + (amplified.note,))


def validate_audit_noise_multiplier(noise_multiplier: Any) -> float:
  """σ >= 0: 0 is a run without DP (audited for its participation, with no guarantee)."""
  if (
    isinstance(noise_multiplier, numbers.Real)
    and not isinstance(noise_multiplier, bool)
    and noise_multiplier == 0
  ):
    return 0.0
  return accounting.validate_noise_multiplier(noise_multiplier)


@dataclasses.dataclass(frozen=True)
class _Request:
  """One audit's arguments, validated: the strategy loaded, σ and δ checked (`_validated`)."""

  strategy: Any
  sigma: float
  delta: float
  rounds: Optional[int]
  min_sep: Optional[int]
  max_participations: Optional[int]
  method: str
  accountant: accounting.Accountant
  curve: bool | str
  max_epsilon: Optional[float]
  notes: tuple[str, ...]
  sampling: Optional[partition_audit.DeclaredSampling]
  count_noise_multiplier: Optional[float] = None

  @property
  def amplifies(self) -> bool:
    """A declared cyclic Poisson sampling with noise: the claim may be the amplified ε (never
    with adaptive clipping: no amplification theorem here covers its count releases)."""
    return self.sampling is not None and self.sigma > 0 and self.count_noise_multiplier is None


def _validated(
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  rounds: Optional[int] = None,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  method: str = "auto",
  accountant: accounting.Accountant = accounting.CLAIM_ACCOUNTANT,
  curve: bool | str = True,
  max_epsilon: Optional[float] = None,
  notes: tuple[str, ...] = (),
  sampling: Optional[partition_audit.DeclaredSampling] = None,
  count_noise_multiplier: Optional[float] = None,
) -> _Request:
  """The cheap arguments, validated (and the per-round work estimated) before a log is read.

  The claim's keywords of ``audit_log`` and ``audit_arrays``, listed once here:
    rounds: Rounds whose noisy aggregate was released; None infers max round + 1 (with a warning).
    min_sep: Declared b (gap), optional.
    max_participations: Declared k, optional.
    method: Sensitivity method ('auto', 'upper-bound', 'lower-bound').
    accountant: 'analytic' (default): ε from the exact Gaussian curve, solved to float64
      precision. Every claim the auditor makes is one Gaussian mechanism with sensitivity s and
      noise σ (no amplification, no composition: BandMF §5, BLT App. C), so this is its exact ε
      (Balle & Wang 2018, Thm. 8). 'pld': dp_accounting's PLD accountant, a pessimistic
      discretization of the same curve (ε_pld ≥ ε), kept as a cross-check.
    curve: Also compute the per-round ε curve (estimated first: fedmf.mf.resources); "every-round"
      evaluates the sensitivity at every round, as a training run's meter does.
    max_epsilon: The privacy budget a strict audit checks the realized ε against.
    notes: Where the inputs came from, shown in the report.
    sampling: The run's declared cyclic Poisson sampling (`participation.model: cyclic-poisson`):
      the log is checked against its partitions (a second read of the round and client columns)
      and, if it complies, the claim is the amplified ε (BandMF Thm 4); if not, the violation is
      reported and the claim stays the non-amplified one.
    count_noise_multiplier: z_b of the run's adaptive clipping (None: a fixed clip). Every claim
      and the curve compose the matrix mechanism with the count releases: a device in k rounds of
      the log is in k of them (the declared claim: its k).
  """
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top

  sigma = validate_audit_noise_multiplier(noise_multiplier)
  delta = gaussian_curve.validate_delta(delta)
  strategy = strategies.load_strategy(strategy)
  rounds = _positive_int_or_none(rounds, "--rounds")
  min_sep = _positive_int_or_none(min_sep, "--min-sep")
  max_participations = _positive_int_or_none(max_participations, "--max-participations")
  if max_epsilon is not None and not (
    isinstance(max_epsilon, numbers.Real) and math.isfinite(max_epsilon) and max_epsilon > 0
  ):
    raise FedmfUserError(f"--max-epsilon must be a finite number > 0, got {max_epsilon!r}")
  if count_noise_multiplier is not None:
    if (
      isinstance(count_noise_multiplier, bool)
      or not isinstance(count_noise_multiplier, numbers.Real)
      or not math.isfinite(count_noise_multiplier)
      or count_noise_multiplier < 0
    ):
      raise FedmfUserError(
        f"--count-noise-multiplier must be a finite number >= 0, got {count_noise_multiplier!r}"
      )
    count_noise_multiplier = float(count_noise_multiplier)
  if rounds is not None:
    strategy.check_horizon(rounds)
    if curve and sigma > 0:
      _check_curve(rounds)
    if min_sep is not None or max_participations is not None:
      # The declared claim's sensitivity is known before the log is read: refuse it now if too big.
      schema = ParticipationSchema(rounds, min_sep, max_participations)
      resources.check(
        strategy.sensitivity_cost(schema, method),
        f"the sensitivity of {strategy.describe()} at n={rounds}",
      )
  return _Request(
    strategy, sigma, delta, rounds, min_sep, max_participations, method, accountant, curve,
    max_epsilon, tuple(notes), sampling, count_noise_multiplier,
  )  # fmt: skip


def audit_arrays(
  arrays: participation_log.ParticipationArrays,
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  log_name: str = "",
  violation_limit: Optional[int] = log_statistics.DEFAULT_VIOLATION_LIMIT,
  **claim: Any,
) -> AuditResult:
  """Audits a log already in memory as ``ParticipationArrays`` (see ``audit_log``)."""
  request = _validated(strategy, noise_multiplier, delta, **claim)
  stats, violations = log_statistics.statistics_of_arrays(
    arrays.rounds,
    arrays.codes,
    len(arrays.client_ids),
    request.min_sep,
    request.max_participations,
    arrays.client_ids,
    violation_limit=violation_limit,
  )
  if arrays.cut_off_row is not None:
    stats = dataclasses.replace(stats, cut_off_row=arrays.cut_off_row)
  return _with_amplification(_audit(stats, violations, request, log_name), arrays, request)


def audit_log(
  path: str | os.PathLike[str],
  strategy: Any,
  noise_multiplier: float,
  delta: float,
  *,
  progress: bool = False,
  violation_limit: Optional[int] = log_statistics.DEFAULT_VIOLATION_LIMIT,
  **claim: Any,
) -> AuditResult:
  """Audits a participation log file.

  Args:
    path: Log file (see ``fedmf.privacy.participation_log``).
    strategy: Strategy object, dict or JSON path.
    noise_multiplier: σ used in training, applied to C as loaded (docs/noise-multiplier.md); 0 for
      a run without DP (its participation is audited; no privacy guarantee holds).
    delta: δ for ε.
    progress: tqdm progress on stderr while reading.
    violation_limit: List at most this many violation entries (None: all); all are counted.
    **claim: The declared claim and how it is accounted: rounds, min_sep, max_participations,
      method, accountant, curve, max_epsilon, notes, sampling (their defaults and meaning:
      ``_validated``).
  """
  # Validate the cheap arguments (and estimate the per-round work) before reading a large log.
  request = _validated(strategy, noise_multiplier, delta, **claim)
  stats, violations = log_statistics.statistics_of_file(
    path,
    min_sep=request.min_sep,
    max_participations=request.max_participations,
    violation_limit=violation_limit,
    progress=progress,
  )
  result = _audit(stats, violations, request, os.fspath(path))
  if not request.amplifies:
    return result
  # The partition check needs the client and round columns again (a second read).
  return _with_amplification(result, participation_log.read_participation_arrays(path), request)
