"""The privacy plan of a run: which strategy, under which schema, with which noise multiplier.

One concept: everything privacy-related decided before the first round.

* The strategy: a mechanism optimized for the run's own (n, b, k) and cached on disk, or a strategy
  file, refused if it was optimized for another (n, b) unless `force_strategy`.
* The schema the participation model guarantees (the declared claim the audit checks).
* σ: calibrated for `target_epsilon` or given. With Poisson sampling the accountant credits the
  amplification where a theorem gives it: DP-SGD with Poisson sampling (groups = 1), and amplified
  BandMF with one group per band (BandMF §5 Thm 4, Scaling BandMF Prop 2.1); PLD accounts those
  events (`accounting.AMPLIFIED_ACCOUNTANT`), and amplified BandMF is calibrated by the same
  function as `fedmf strategy optimize --bands auto` (`amplification.noise_for`). Otherwise σ is
  accounted as one Gaussian mechanism with the strategy's sensitivity under the declared schema, by
  its exact curve (`accounting.CLAIM_ACCOUNTANT`), PLD's ε at the same σ kept as a labelled
  cross-check.
* The run's accountant: one, named in plan.json and summary.json; the audit of the run and its
  report account the realized claim with the same one.
* The papers' cheap-simulation trick (BandMF App. I): with `reference_clients_per_round`, training
  uses σ·B/B_ref on B clients, so that the noise on the mean equals that of the reference cohort
  with σ; the accounting is that of the reference run with σ.
* With `clip_norm: adaptive`, the count noise multiplier z_b of adaptive clipping (Andrew et al.
  2021; `fedmf.privacy.adaptive_clip`): given, Andrew et al.'s m/10 for the accounted cohort of m
  clients, or the z_b of a budget fraction; σ is calibrated with the count releases composed in
  (scaled like σ by the cheap simulation).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any, Optional

from fedmf.errors import FedmfUserError
from fedmf.mf import resources
from fedmf.mf import strategies
from fedmf.mf import strategy_cache
from fedmf.mf.schema import ParticipationSchema
from fedmf.mf.strategy import AMPLIFIED_BANDMF, AMPLIFIED_DPSGD, Strategy
from fedmf.participation import ParticipationModel
from fedmf.privacy import adaptive_clip as adaptive_lib

logger = logging.getLogger("fedmf.plan")


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
  """What the run promises before it starts.

  Attributes:
    strategy: the loaded strategy (C as the noise and the accountant use it).
    schema: the declared participation schema (n, b, k).
    noise_multiplier: σ of the accounted run (applied to C as loaded).
    training_noise_multiplier: σ used in training (σ·B/B_ref with the cheap-simulation trick).
    epsilon: planned ε at `delta` (inf without noise).
    delta: δ.
    accounting: how ε was computed, in words.
    sensitivity: the strategy's sensitivity under the schema (matrix-mechanism accounting), or None.
    sensitivity_method: exact / upper-bound / lower-bound, or None.
    accountant: the run's accountant ('analytic' or 'pld'; 'none' without noise).
    cross_check: the other accountant's ε at the same σ ({"accountant", "epsilon"}, or a "note"
      saying why there is none), labelled as a cross-check, not the run's claim.
    adaptive_clip: adaptive clipping with its count noise multiplier z_b as accounted (None: a
      fixed clip); its count releases are in `epsilon`.
    training_count_noise_multiplier: z_b used in training (z_b·B/B_ref with the cheap simulation).
  """

  strategy: Strategy
  schema: ParticipationSchema
  noise_multiplier: float
  training_noise_multiplier: float
  epsilon: float
  delta: float
  accounting: str
  sensitivity: Optional[float] = None
  sensitivity_method: Optional[str] = None
  accountant: str = "none"
  cross_check: Optional[dict[str, Any]] = None
  adaptive_clip: Optional[adaptive_lib.AdaptiveClip] = None
  training_count_noise_multiplier: Optional[float] = None

  @property
  def count_noise_multiplier(self) -> Optional[float]:
    """z_b of the count releases as accounted (None: a fixed clip)."""
    return None if self.adaptive_clip is None else self.adaptive_clip.count_noise_multiplier

  def to_dict(self) -> dict[str, Any]:
    out = self._fixed_dict()
    if self.adaptive_clip is not None:  # (absent for a fixed clip: plan.json as it was)
      out["adaptive_clip"] = {
        **dataclasses.asdict(self.adaptive_clip),
        "training_count_noise_multiplier": self.training_count_noise_multiplier,
      }
    return out

  def _fixed_dict(self) -> dict[str, Any]:
    return {
      "strategy": self.strategy.describe(),
      "mechanism": self.strategy.mechanism,
      "declared_schema": self.schema.to_dict(),
      "noise_multiplier": self.noise_multiplier,
      "training_noise_multiplier": self.training_noise_multiplier,
      "epsilon": self.epsilon,
      "delta": self.delta,
      "accounting": self.accounting,
      "sensitivity": self.sensitivity,
      "sensitivity_method": self.sensitivity_method,
      "accountant": self.accountant,
      "cross_check": self.cross_check,
    }


# The strategy cache lives with the strategies (fedmf.mf.strategy_cache, same key and directory),
# shared with `fedmf strategy optimize --bands auto`.
cache_dir = strategy_cache.cache_dir
_optimize_cached = strategy_cache.optimize_cached


def check_optimized_for(
  strategy: Strategy, schema: ParticipationSchema, source: str, force: bool
) -> None:
  """Refuses a strategy file optimized for another (n, b) than the run's, unless forced."""
  made_for = strategy.metadata.get("optimized_for")
  if not isinstance(made_for, dict):
    logger.warning(
      "%s does not say which (n, b) it was optimized for; using it for %s",
      source,
      schema.describe(),
    )
    return
  want = {"n": schema.n, "min_sep": schema.min_sep}
  got = {k: made_for.get(k) for k in want}
  if got != want and not force:
    raise FedmfUserError(
      f"{source} was optimized for n = {got['n']}, b = {got['min_sep']}, but this run has "
      f"n = {schema.n}, b = {schema.min_sep}; optimize one for the run (mechanism: ...) or set "
      "force_strategy: true"
    )


def resolve_strategy(config, schema: ParticipationSchema, cache: Optional[Path] = None) -> Strategy:
  """The run's strategy: the config's strategy file, or its mechanism optimized for `schema`."""
  if config.privacy.strategy is not None:
    strategy = strategies.load_strategy(config.privacy.strategy)
    check_optimized_for(strategy, schema, config.privacy.strategy, config.privacy.force_strategy)
  else:
    strategy = _optimize_cached(config.privacy.mechanism, schema, config.optimize_options, cache)
  strategy.check_horizon(schema.n)
  strategy.check_streamable()
  return strategy


def _amplified_accounting(strategy: Strategy, model: ParticipationModel, rounds: int):
  """(σ ↦ ε, target ↦ σ, words) for the Poisson sampling the accountant may credit, or None."""
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import amplification  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import events  # pylint: disable=g-import-not-at-top

  amp = model.amplification()
  if amp is None:
    return None
  q = amp.sampling_probability
  theorem = strategy.poisson_amplification(rounds, amp.groups)
  if theorem == AMPLIFIED_DPSGD:
    return (
      lambda s, delta: accounting.pld_epsilon(events.dpsgd_event(s, rounds, q), delta),
      lambda eps, delta: accounting.calibrate_dpsgd(eps, rounds, delta, q),
      f"DP-SGD with Poisson sampling (q = {q:.4g}), {rounds} steps, PLD",
    )
  if theorem == AMPLIFIED_BANDMF:
    # The sampling's dataset size only sets q (= groups·batch/size): any size with this q will do.
    sampling = amplification.CyclicPoissonSampling.from_probability(
      max(model.num_clients, amp.groups), amp.groups, q
    )
    return (
      lambda s, delta: amplification.epsilon_for(s, rounds, sampling, delta)[0],
      lambda eps, delta: amplification.noise_for(eps, rounds, sampling, delta),
      f"amplified BandMF (BandMF §5): {amp.groups} groups, q = {q:.4g}, PLD",
    )
  logger.warning(
    "no amplification theorem covers %s with %d Poisson groups: accounting it as "
    "b-min-separation with b = %d",
    strategy.describe(),
    amp.groups,
    amp.groups,
  )
  return None


def _cross_check(result, accountant) -> dict[str, Any]:
  """The other accountant's ε of the same claim at the same σ, or why there is none."""
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top

  other = accounting.other_accountant(accountant)
  try:
    eps = accounting.account_sensitivity(
      result.sensitivity,
      result.noise_multiplier,
      result.delta,
      accountant=other,
      count_noise_multiplier=result.count_noise_multiplier,
      count_releases=result.count_releases,
    ).epsilon
  except FedmfUserError as e:  # PLD beyond its grid or its resolution of δ: the claim stands.
    return {"accountant": other, "epsilon": None, "note": str(e)}
  return {"accountant": other, "epsilon": eps}


def rounds_within_budget(plan: PrivacyPlan, budget: float) -> int:
  """The most rounds r <= n whose ε under the declared schema's first r rounds is at most
  `budget`: the budget guard (which accounts the realized participation, within the declared)
  cannot stop the run before round r. Binary search: ε grows with the rounds."""
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top

  def fits(rounds: int) -> bool:
    schema = plan.schema.with_rounds(rounds)
    result = accounting.account(
      plan.strategy, schema, plan.noise_multiplier, plan.delta, accountant=plan.accountant
    )
    return result.epsilon <= budget

  n = plan.schema.n
  if fits(n):
    return n
  low, high = 0, n  # fits(low) (no round released: ε = 0), not fits(high)
  while high - low > 1:
    mid = (low + high) // 2
    if fits(mid):
      low = mid
    else:
      high = mid
  return low


def plan_run(
  config, model: ParticipationModel, schema: ParticipationSchema, cache: Optional[Path] = None
) -> PrivacyPlan:
  """The run's strategy (`resolve_strategy`) and its privacy plan (`make_plan`), within the time
  limit of `fedmf.mf.resources` for the calibration."""
  strategy = resolve_strategy(config, schema, cache_dir() if cache is None else cache)
  with resources.time_limit(f"calibrating the noise of {strategy.describe()}"):
    return make_plan(config, model, strategy, schema)


def make_plan(
  config, model: ParticipationModel, strategy: Strategy, schema: ParticipationSchema
) -> PrivacyPlan:
  """Calibrates (or accounts for) σ under the participation model's declared schema."""
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top

  factor = config.noise_scale_factor
  amplified = _amplified_accounting(strategy, model, schema.n)
  delta = config.privacy.delta
  if config.privacy.noise_multiplier == 0:
    return PrivacyPlan(
      strategy,
      schema,
      0.0,
      0.0,
      math.inf,
      delta,
      "none: noise_multiplier 0 trains without DP",
      # Without DP the counts are exact too (z_b = 0).
      adaptive_clip=_adaptive(config, 0.0),
      training_count_noise_multiplier=0.0 if config.recipe.adaptive else None,
    )
  calibrate = (
    config.privacy.noise_multiplier is None
  )  # A given σ takes precedence over target_epsilon.
  if amplified is not None:
    epsilon_of, noise_for, how = amplified
    if calibrate:
      sigma = noise_for(config.privacy.target_epsilon, delta)
    else:
      sigma = float(config.privacy.noise_multiplier)
    return PrivacyPlan(
      strategy,
      schema,
      sigma,
      sigma * factor,
      epsilon_of(sigma, delta),
      delta,
      how,
      accountant=accounting.AMPLIFIED_ACCOUNTANT,
      cross_check={
        "accountant": "analytic",
        "epsilon": None,
        "note": "none: the analytic curve is that of one Gaussian mechanism, not of a "
        "Poisson-subsampled one",
      },
    )
  accountant = accounting.CLAIM_ACCOUNTANT
  z, fraction = _count_noise(config)
  if calibrate:
    result = accounting.calibrate_noise_multiplier(
      strategy,
      schema,
      config.privacy.target_epsilon,
      delta,
      accountant=accountant,
      count_noise_multiplier=z,
      count_budget_fraction=fraction,
    )
  else:
    sigma = config.privacy.noise_multiplier
    if fraction is not None:
      sens = accounting.strategy_sensitivity(strategy, schema)
      z = adaptive_lib.count_noise_for_fraction(
        sens.value / sigma, schema.effective_max_participations, fraction
      )
    result = accounting.account(
      strategy, schema, sigma, delta, accountant=accountant, count_noise_multiplier=z
    )
  how = f"matrix mechanism under {schema.describe()}, analytic Gaussian curve (exact)"
  if result.adaptive:
    how += (
      f", composed with {result.count_releases} count releases of adaptive clipping per device "
      f"(count noise multiplier {result.count_noise_multiplier:.6g})"
    )
  return PrivacyPlan(
    strategy,
    schema,
    result.noise_multiplier,
    result.noise_multiplier * factor,
    result.epsilon,
    delta,
    how,
    result.sensitivity,
    result.sensitivity_method,
    accountant=accountant,
    cross_check=_cross_check(result, accountant),
    adaptive_clip=_adaptive(config, result.count_noise_multiplier),
    training_count_noise_multiplier=(
      result.count_noise_multiplier * factor if result.adaptive else None
    ),
  )


def _count_noise(config) -> tuple[Optional[float], Optional[float]]:
  """(z_b, budget fraction) of the config's adaptive clip ((None, None) for a fixed clip): a given
  z_b, a budget fraction, or Andrew et al.'s m/10 for the accounted cohort of m clients."""
  if not config.recipe.adaptive:
    return None, None
  clip = config.recipe.adaptive_clip
  if clip.count_budget_fraction is not None:
    return None, clip.count_budget_fraction
  if clip.count_noise_multiplier is not None:
    return clip.count_noise_multiplier, None
  cohort = config.privacy.reference_clients_per_round or config.program.clients_per_round
  return adaptive_lib.default_count_noise_multiplier(cohort), None


def _adaptive(config, count_noise_multiplier) -> Optional[adaptive_lib.AdaptiveClip]:
  if not config.recipe.adaptive:
    return None
  return config.recipe.adaptive_clip.with_count_noise(count_noise_multiplier)
