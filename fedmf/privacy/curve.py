"""Per-round privacy over realized participation: ε after r released rounds, r = 1..n (BLT §1, App. C).

One concept: the ε curve of an audit. The first r rounds of a run have their own realized
min-separation b_r and max participations k_r (read off the participation log); each prefix is one
Gaussian matrix mechanism over r rounds (``fedmf.privacy.accounting``), composed with k_r count
releases when the run clipped adaptively (``fedmf.privacy.adaptive_clip``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import adaptive_clip
from fedmf.privacy.gaussian_curve import gaussian_epsilon, rho_zcdp, validate_delta
from fedmf.privacy.events import validate_noise_multiplier


@dataclasses.dataclass(frozen=True)
class EpsilonCurve:
  """Privacy after r released rounds, r = 1..n (index r-1), for realized participation.

  Attributes:
    rounds: int array [1, ..., n].
    min_sep: Realized min-separation of the first r rounds (-1 when no client participated twice).
    max_participations: Realized max participations of the first r rounds (0 before any).
    sensitivity: Sensitivity used for each r (an upper bound when not evaluated at r itself).
    sensitivity_method: Per-r method: 'exact', 'upper-bound' or 'lower-bound'.
    rho: ρ-zCDP per r (with adaptive clipping, its k_r count releases included).
    epsilon: ε at ``delta`` per r (analytic Gaussian curve).
    delta: δ.
    noise_multiplier: σ.
    count_noise_multiplier: z_b of adaptive clipping's count releases (None: a fixed clip).
  """

  rounds: np.ndarray
  min_sep: np.ndarray
  max_participations: np.ndarray
  sensitivity: np.ndarray
  sensitivity_method: tuple[str, ...]
  rho: np.ndarray
  epsilon: np.ndarray
  delta: float
  noise_multiplier: float
  count_noise_multiplier: float | None = None


DEFAULT_MAX_EVALUATIONS = 64


def epsilon_curve(
  strategy: Any,
  min_seps: Sequence[int] | np.ndarray,
  max_participations: Sequence[int] | np.ndarray,
  noise_multiplier: float,
  delta: float,
  *,
  method: str = "auto",
  max_evaluations: int | None = DEFAULT_MAX_EVALUATIONS,
  time_budget: float = 0.0,
  count_noise_multiplier: float | None = None,
) -> EpsilonCurve:
  """ε after r rounds, r = 1..n, using the realized (b_r, k_r) of the first r rounds (BLT §1).

  Args:
    strategy: Strategy (object, dict or path).
    min_seps: b_r for r = 1..n (length n); -1 (or None/0) when no client has participated twice.
    max_participations: k_r for r = 1..n; 0 before any participation (then ε = 0).
    noise_multiplier: σ.
    delta: δ.
    method: Sensitivity method.
    max_evaluations: Cap on sensitivity evaluations (None: no cap, at least one per distinct
      (b_r, k_r)).
    time_budget: Seconds to spend on evaluations beyond the mandatory ones (default none).
    count_noise_multiplier: z_b of adaptive clipping: the first r rounds hold k_r count releases
      of the most-participating device, composed in (μ_r² = (s_r/σ)² + k_r/z_b²).

  The realized b_r never grows and k_r never shrinks, so the rounds fall into runs of constant
  (b_r, k_r), usually a handful. The sensitivity is evaluated once per run, at its last round,
  where it is exact. Every earlier round r of the run uses that value, a valid upper bound: the
  first r rounds' C is the leading r×r block of C (C lower triangular), and a participation
  pattern of the first r rounds is one of the first r' > r rounds with the same (b, k), so the true
  sensitivity is non-decreasing in r. When there are more runs than ``max_evaluations`` (a client
  logged in every round makes k_r grow every round), consecutive runs are grouped and share the
  evaluation at the group's last round: its smaller b and larger k allow every pattern of the
  earlier rounds, so it bounds them too. Values not evaluated at their own round are labelled
  'upper-bound' (an upper-bound method's value bounds the truth at r' and so at r). The last round
  n is always evaluated at its own (b_n, k_n). Within ``time_budget`` and ``max_evaluations``,
  further rounds spread evenly inside the groups are evaluated at their own (b_r, k_r). ε uses the
  exact analytic Gaussian curve, vectorized over r.

  A strategy that computes every prefix in one pass (`Strategy.prefix_sensitivities`: TreeAgg,
  whose per-r Gram bound costs O(r³) alone) is evaluated at every round's own (b_r, k_r) instead,
  whatever ``max_evaluations`` and ``time_budget`` (method 'auto').
  """
  import time  # pylint: disable=g-import-not-at-top
  from fedmf.mf.strategies import load_strategy  # pylint: disable=g-import-not-at-top

  sigma = validate_noise_multiplier(noise_multiplier)
  delta = validate_delta(delta)
  strategy = load_strategy(strategy)
  b = np.asarray([-1 if v is None else int(v) for v in min_seps], dtype=np.int64)
  k = np.asarray(max_participations, dtype=np.int64)
  n = b.shape[0]
  if k.shape != (n,) or n == 0:
    raise ValueError("min_seps and max_participations must be non-empty and of equal length")
  strategy.check_horizon(n)
  b = np.where(b <= 0, -1, b)
  one_pass = _one_pass(strategy, b, k, method)
  if one_pass is not None:
    return _curve(b, k, *one_pass, sigma, delta, count_noise_multiplier)
  change = np.flatnonzero((b[1:] != b[:-1]) | (k[1:] != k[:-1])) + 1
  starts = np.concatenate([[0], change]).astype(np.int64)
  ends = np.concatenate([change, [n]]).astype(np.int64)  # Exclusive.
  runs = [(int(s), int(e)) for s, e in zip(starts, ends) if k[s] > 0]
  if max_evaluations is not None and len(runs) > max(int(max_evaluations), 1):
    # Groups of consecutive runs, ending at evenly spaced runs (always the last one).
    last = np.unique(
      np.round(np.linspace(0, len(runs) - 1, max(int(max_evaluations), 1) + 1)[1:]).astype(np.int64)
    )
    first = np.concatenate([[0], last[:-1] + 1])
    runs = [(runs[f][0], runs[l][1]) for f, l in zip(first, last)]
  # The strategy caches each (r, b, k)'s sensitivity: the audit's headline claim at r = n is
  # computed once for both.
  evaluated: dict[int, Any] = {}  # 0-based index p (r = p + 1) -> Sensitivity.

  def evaluate(p: int) -> None:
    evaluated[p] = strategy.checked_sensitivity(_prefix_schema(b, k, p), method)

  t0 = time.perf_counter()
  for _, e in runs:
    evaluate(e - 1)
  spent = time.perf_counter() - t0
  per_eval = spent / max(len(runs), 1)
  total = sum(e - s for s, e in runs)
  cap = total if max_evaluations is None else max(int(max_evaluations), len(runs))
  extra = min(cap, total) - len(runs)
  if time_budget <= 0:
    extra = 0
  elif per_eval > 0:
    extra = min(extra, int(time_budget / per_eval))
  if extra > 0 and total > len(runs):
    fraction = extra / (total - len(runs))
    for s, e in runs:
      inner = e - 1 - s  # Rounds of the group not yet evaluated.
      m = min(inner, int(math.ceil(inner * fraction)))
      if m <= 0:
        continue
      points = (
        np.unique(np.round(np.linspace(s, e - 2, m)).astype(np.int64))
        if m < inner
        else (np.arange(s, e - 1))
      )
      for p in points:
        evaluate(int(p))

  sens = np.zeros(n)
  methods = ["exact"] * n
  for s, e in runs:
    nxt = None
    for p in range(e - 1, s - 1, -1):
      if p in evaluated:
        nxt = evaluated[p]
        sens[p] = nxt.value
        methods[p] = nxt.method
      else:
        sens[p] = nxt.value
        methods[p] = "upper-bound" if nxt.method == "exact" else nxt.method
  return _curve(b, k, sens, methods, sigma, delta, count_noise_multiplier)


def _prefix_schema(b: np.ndarray, k: np.ndarray, p: int) -> ParticipationSchema:
  """The realized schema of the first r = p + 1 rounds (no min-separation before anyone returns)."""
  kk = int(k[p])
  return ParticipationSchema(p + 1, None if (kk <= 1 or b[p] < 0) else int(b[p]), kk)


def _one_pass(strategy: Any, b: np.ndarray, k: np.ndarray, method: str):
  """(sensitivities, methods) at every round's own (b_r, k_r) where the strategy computes every
  prefix in one pass (`Strategy.prefix_sensitivities`: TreeAgg), else None. The last round is the
  strategy's own (cached) value, so that the curve ends exactly at the audit's realized claim."""
  if method != "auto" or np.any((k > 1) & (b < 0)):
    return None
  values = strategy.prefix_sensitivities(b, k)
  if values is None:
    return None
  if k[-1] > 0:
    values[-1] = strategy.checked_sensitivity(_prefix_schema(b, k, b.shape[0] - 1), method)
  sens = np.array([0.0 if v is None else v.value for v in values])
  return sens, ["exact" if v is None else v.method for v in values]


def _curve(b, k, sens, methods, sigma, delta, count_noise_multiplier) -> EpsilonCurve:
  """The curve from each round's sensitivity: ρ and ε by the analytic Gaussian curve, vectorized."""
  mu = sens / sigma
  rho = np.asarray(rho_zcdp(sens, sigma))
  if count_noise_multiplier is not None:
    counts = np.array([adaptive_clip.count_mu(count_noise_multiplier, int(v)) for v in k])
    mu = np.hypot(mu, counts)
    rho = mu * mu / 2.0
  eps = np.asarray(gaussian_epsilon(mu, delta), dtype=np.float64)
  return EpsilonCurve(
    rounds=np.arange(1, b.shape[0] + 1),
    min_sep=b,
    max_participations=k,
    sensitivity=sens,
    sensitivity_method=tuple(methods),
    rho=rho,
    epsilon=eps,
    delta=delta,
    noise_multiplier=sigma,
    count_noise_multiplier=count_noise_multiplier,
  )
