"""Per-round privacy over realized participation: ε after r released rounds, r = 1..n (BLT §1, App. C).

One concept: the ε curve of an audit. The first r rounds of a run have their own realized
min-separation b_r and max participations k_r (read off the participation log); each prefix is one
Gaussian matrix mechanism over r rounds (``fedmf.privacy.accounting``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from fedmf.mf.evaluation import sensitivity as _sensitivity
from fedmf.privacy.accounting import gaussian_epsilon, rho_zcdp, validate_delta
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
    rho: ρ-zCDP per r.
    epsilon: ε at ``delta`` per r (analytic Gaussian curve).
    delta: δ.
    noise_multiplier: σ.
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


def epsilon_curve(strategy: Any, min_seps: Sequence[int] | np.ndarray,
                  max_participations: Sequence[int] | np.ndarray, noise_multiplier: float,
                  delta: float, *, method: str = "auto", max_evaluations: int | None = None,
                  time_budget: float = 5.0) -> EpsilonCurve:
  """ε after r rounds, r = 1..n, using the realized (b_r, k_r) of the first r rounds (BLT §1).

  Args:
    strategy: Strategy (object, dict or path).
    min_seps: b_r for r = 1..n (length n); -1 (or None/0) when no client has participated twice.
    max_participations: k_r for r = 1..n; 0 before any participation (then ε = 0).
    noise_multiplier: σ.
    delta: δ.
    method: Sensitivity method.
    max_evaluations: Cap on sensitivity evaluations (default: one per round).
    time_budget: Seconds to spend on evaluations beyond the mandatory ones.

  The sensitivity is always evaluated at r = the last round of every run of constant (b_r, k_r);
  then, within ``time_budget`` and ``max_evaluations``, at rounds spread evenly inside the runs (all
  of them for fast strategies such as a BLT, 0.2 ms per Thm 3.1 evaluation at n = 2000). A round
  between evaluations uses the value at the next evaluated round of its run: for lower-triangular C
  the first r rounds' C is the leading r×r block, so the true sensitivity is non-decreasing in r and
  that value is a valid upper bound (labelled 'upper-bound'). ε uses the exact analytic Gaussian
  curve, vectorized over r.
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
  change = np.flatnonzero((b[1:] != b[:-1]) | (k[1:] != k[:-1])) + 1
  starts = np.concatenate([[0], change]).astype(np.int64)
  ends = np.concatenate([change, [n]]).astype(np.int64)  # Exclusive.
  runs = [(int(s), int(e)) for s, e in zip(starts, ends) if k[s] > 0]

  evaluated: dict[int, Any] = {}  # 0-based index p (r = p + 1) -> Sensitivity.

  def evaluate(p: int) -> None:
    kk = int(k[p])
    ms = None if (kk <= 1 or b[p] < 0) else int(b[p])
    evaluated[p] = _sensitivity(strategy, p + 1, ms, kk, method)

  t0 = time.perf_counter()
  for _, e in runs:
    evaluate(e - 1)
  spent = time.perf_counter() - t0
  per_eval = spent / max(len(runs), 1)
  total = sum(e - s for s, e in runs)
  cap = total if max_evaluations is None else max(int(max_evaluations), len(runs))
  extra = min(cap, total) - len(runs)
  if per_eval > 0:
    extra = min(extra, int(time_budget / per_eval))
  if extra > 0 and total > len(runs):
    fraction = extra / (total - len(runs))
    for s, e in runs:
      inner = e - 1 - s  # Rounds of the run not yet evaluated.
      m = min(inner, int(math.ceil(inner * fraction)))
      if m <= 0:
        continue
      points = np.unique(np.round(np.linspace(s, e - 2, m)).astype(np.int64)) if m < inner else (
          np.arange(s, e - 1))
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
  mu = sens / sigma
  eps = np.asarray(gaussian_epsilon(mu, delta), dtype=np.float64)
  return EpsilonCurve(
      rounds=np.arange(1, n + 1), min_sep=b, max_participations=k, sensitivity=sens,
      sensitivity_method=tuple(methods), rho=np.asarray(rho_zcdp(sens, sigma)), epsilon=eps,
      delta=delta, noise_multiplier=sigma)
