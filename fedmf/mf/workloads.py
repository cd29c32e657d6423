"""Workload matrices A: the linear queries a matrix mechanism answers.

A workload is a dense n×n lower-triangular matrix A (notation of docs/architecture.md): row i expresses
the quantity released after round i as a linear function of the per-round gradient sums x_0..x_i.
fedmf factors A = B C and adds noise to C x.

- `prefix_sum(n)`: A_ij = 1 for i ≥ j (the running sum; the default everywhere).
- `momentum_with_cooldown(n, ...)`: the model trajectory of SGD with heavy-ball momentum and an
  optional linear learning-rate cooldown (Denisov et al. 2022, as cited in BandMF and Scaling BandMF; BandMF
  App. H/I use momentum 0.95 and a linear cooldown to 0.05× the learning rate).

All matrices are float64.
"""

from __future__ import annotations

import numpy as np

WORKLOAD_NAMES = ('prefix', 'momentum')


def prefix_sum(n: int) -> np.ndarray:
  """Returns the n×n prefix-sum workload: ones on and below the diagonal."""
  _check_n(n)
  return np.tril(np.ones((n, n), dtype=np.float64))


def cooldown_learning_rates(
  n: int, cooldown_period: int = 0, cooldown_target: float = 0.05
) -> np.ndarray:
  """Per-round learning-rate multipliers lr_0..lr_{n-1} with a linear cooldown.

  lr_t = 1 for t < n - p, where p = cooldown_period. Over the last p rounds the rate decreases linearly
  and reaches `cooldown_target` at the last round: lr_{n-p+s} = 1 + (target - 1)·(s + 1)/p for
  s = 0..p-1. With p = 0 every rate is 1.

  Args:
    n: number of rounds.
    cooldown_period: p, the number of final rounds over which the rate decays (0 ≤ p ≤ n).
    cooldown_target: the final multiplier, in (0, 1]. Zero is refused: a zero learning rate makes a
      column of A vanish and A singular, so no factorization exists.

  Returns:
    float64 array of length n.
  """
  _check_n(n)
  if not 0 <= cooldown_period <= n:
    raise ValueError(f'cooldown_period must be in [0, n={n}], got {cooldown_period}')
  if not 0.0 < cooldown_target <= 1.0:
    raise ValueError(f'cooldown_target must be in (0, 1], got {cooldown_target}')
  lr = np.ones(n, dtype=np.float64)
  p = int(cooldown_period)
  if p > 0:
    s = np.arange(1, p + 1, dtype=np.float64)
    lr[n - p :] = 1.0 + (cooldown_target - 1.0) * s / p
  return lr


def momentum_with_cooldown(
  n: int, momentum: float = 0.95, cooldown_period: int = 0, cooldown_target: float = 0.05
) -> np.ndarray:
  """Workload of SGD with heavy-ball momentum and a linear learning-rate cooldown.

  The optimizer (with a unit base learning rate and model starting at 0) is

    m_{-1} = 0,  m_t = β m_{t-1} + x_t,  θ_t = θ_{t-1} - lr_t m_t,

  with β = `momentum` and lr_t from `cooldown_learning_rates`. Then -θ_i = Σ_{t≤i} lr_t m_t
  = Σ_{j≤i} A_ij x_j with

    A_ij = Σ_{t=j}^{i} lr_t β^{t-j}   for i ≥ j, and 0 above the diagonal.

  This is the matrix of jax_privacy's / tensorflow_privacy's `momentum_sgd_matrix`. With β = 0 and no
  cooldown it is the prefix-sum workload. Row i is the (negated) model after round i.

  Args:
    n: number of rounds.
    momentum: β in [0, 1).
    cooldown_period: number of final rounds with linearly decaying learning rate (0 = none).
    cooldown_target: learning-rate multiplier reached at the last round.

  Returns:
    The dense n×n lower-triangular workload, float64.
  """
  _check_n(n)
  if not 0.0 <= momentum < 1.0:
    raise ValueError(f'momentum must be in [0, 1), got {momentum}')
  lr = cooldown_learning_rates(n, cooldown_period, cooldown_target)
  # M_tj = β^{t-j} for t ≥ j (the momentum buffer as a function of x); A = cumsum_t(lr_t M_tj).
  idx = np.arange(n)
  gap = idx[:, None] - idx[None, :]
  mom = np.where(gap >= 0, float(momentum) ** np.maximum(gap, 0), 0.0)
  return np.cumsum(lr[:, None] * mom, axis=0)


def by_name(name: str, n: int) -> np.ndarray:
  """Returns the workload called `name` ('prefix' or 'momentum', with the defaults above) for n rounds."""
  if name == 'prefix':
    return prefix_sum(n)
  if name == 'momentum':
    return momentum_with_cooldown(n)
  raise ValueError(f'workload must be one of {WORKLOAD_NAMES}, got {name!r}')


def is_prefix_sum(workload: np.ndarray | None) -> bool:
  """True when `workload` is None (meaning prefix sum) or exactly the prefix-sum matrix."""
  if workload is None:
    return True
  a = np.asarray(workload)
  return a.ndim == 2 and a.shape[0] == a.shape[1] and np.array_equal(a, prefix_sum(a.shape[0]))


def _check_n(n: int) -> None:
  if int(n) != n or n < 1:
    raise ValueError(f'n must be a positive integer, got {n}')
