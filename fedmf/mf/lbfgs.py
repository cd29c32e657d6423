"""The one L-BFGS driver of the strategy optimizers (BandMF, banded Toeplitz, BLT) and their
progress type.

`minimize` runs L-BFGS on a (value, gradient) function and reports every accepted iterate through
one callback, with one result type; each iteration first checks the `--max-seconds` clock
(`fedmf.mf.resources.check_time`: a no-op unless the caller runs it under `time_limit`). Two line searches are offered because the optimizers' outputs
are pinned bit for bit by their tests and stored strategies:
  * 'backtracking' (BandMF): Armijo backtracking that treats an infinite value (a point outside
    the domain, e.g. a zero column of C) as "step too long", the direction in compact form
    (`CompactHistory`), stopping on a relative decrease below `rtol` over 5 iterations;
  * 'scipy' (banded Toeplitz, BLT): scipy's L-BFGS-B (Byrd, Lu, Nocedal and Zhu 1995) with its
    `ftol` / `gtol` tests, for smooth objectives defined everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np
import scipy.linalg

from fedmf.mf import resources

# Receives one dict per optimizer step (e.g. to drive a progress bar); keys depend on the optimizer.
ProgressFn = Optional[Callable[[dict[str, Any]], None]]

ValueAndGrad = Callable[[np.ndarray], tuple[float, Optional[np.ndarray]]]


@dataclasses.dataclass(frozen=True)
class Step:
  """An accepted iterate: its 1-based number, the point, its value (None where scipy does not
  report it) and the function evaluations so far (None for scipy)."""

  iteration: int
  x: np.ndarray
  f: Optional[float]
  evaluations: Optional[int]


@dataclasses.dataclass(frozen=True)
class LbfgsResult:
  x: np.ndarray
  f: float
  iterations: int
  evaluations: int
  converged: bool
  message: str = ""


def minimize(
  fun: ValueAndGrad,
  x0: np.ndarray,
  *,
  max_iter: int,
  memory: int,
  line_search: str = "backtracking",
  rtol: float = 0.0,
  ftol: float = 0.0,
  gtol: float = 0.0,
  on_step: Optional[Callable[[Step], None]] = None,
) -> LbfgsResult:
  """Minimizes fun from x0 with at most max_iter iterations and `memory` correction pairs.

  line_search 'backtracking' uses `rtol`; 'scipy' uses `ftol` and `gtol` (L-BFGS-B options).
  """
  if line_search == "backtracking":
    return _backtracking(fun, x0, max_iter, memory, rtol, on_step)
  if line_search == "scipy":
    return _scipy(fun, x0, max_iter, memory, ftol, gtol, on_step)
  raise ValueError(f"line_search must be 'backtracking' or 'scipy', got {line_search!r}")


def _scipy(fun, x0, max_iter, memory, ftol, gtol, on_step) -> LbfgsResult:
  import scipy.optimize  # Lazy: scipy.optimize costs ~0.5 s to import.

  iterations = [0]

  def callback(xk: np.ndarray) -> None:
    resources.check_time()  # --max-seconds: iterations are where an optimizer can be stopped.
    iterations[0] += 1
    if on_step is not None:
      on_step(Step(iterations[0], xk, None, None))

  res = scipy.optimize.minimize(
    fun,
    x0,
    jac=True,
    method="L-BFGS-B",
    callback=callback,
    options={"maxiter": max_iter, "maxcor": memory, "ftol": ftol, "gtol": gtol},
  )
  return LbfgsResult(
    x=res.x,
    f=float(res.fun),
    iterations=iterations[0],
    evaluations=int(res.nfev),
    converged=bool(res.success),
    message=str(res.message),
  )


def _backtracking(fun, x0, max_iter, memory, rtol, on_step) -> LbfgsResult:
  """L-BFGS with backtracking; fun returns (inf, None) outside the domain."""
  x = np.array(x0, dtype=np.float64)
  f, g = fun(x)
  evaluations = 1
  if not math.isfinite(f):
    raise ValueError("the starting point of the optimizer is infeasible")
  pairs = CompactHistory(x.size, memory)
  history = [f]
  converged = False
  iteration = 0
  for iteration in range(1, max_iter + 1):
    resources.check_time()  # --max-seconds: iterations are where an optimizer can be stopped.
    d = pairs.direction(g)
    if not pairs.count:
      # First step: move the largest coordinate by 0.01 (entries of X and of normalized C are O(1)).
      d *= 0.01 / max(np.max(np.abs(d)), 1e-300)
    slope = float(g @ d)
    if slope >= 0:  # not a descent direction: restart from steepest descent
      pairs.clear()
      d = -g * (0.01 / max(np.max(np.abs(g)), 1e-300))
      slope = float(g @ d)
    step = 1.0
    accepted = False
    for _ in range(60):
      x_new = x + step * d
      f_new, g_new = fun(x_new)
      evaluations += 1
      if math.isfinite(f_new) and f_new <= f + 1e-4 * step * slope:
        accepted = True
        break
      step *= 0.5
    if not accepted:
      converged = True  # no further decrease possible at float64 resolution
      break
    pairs.add(x_new - x, g_new - g)
    x, f, g = x_new, f_new, g_new
    history.append(f)
    if on_step is not None:
      on_step(Step(iteration, x, f, evaluations))
    if len(history) > 5 and history[-6] - f <= rtol * abs(f):
      converged = True
      break
  return LbfgsResult(x=x, f=f, iterations=iteration, evaluations=evaluations, converged=converged)


class CompactHistory:
  """The last `memory` correction pairs (s, y) and the L-BFGS direction -H g in the compact form
  (Byrd, Nocedal and Schnabel 1994, Eq. 3.1; Nocedal & Wright Eq. 7.24), H₀ = γI with
  γ = sᵀy/yᵀy of the newest pair:

    H g = γ g + S R⁻ᵀ((D + γ YᵀY) u - γ Yᵀg) - γ Y u,   u = R⁻¹ Sᵀg,

  R the upper triangle of SᵀY (pairs oldest first), D its diagonal. The same direction as the
  two-loop recursion (Nocedal & Wright Alg. 7.4) in exact arithmetic, in fewer passes over memory:
  the pairs are rows of two (memory × dim) arrays, the inner products of a new pair with the
  others are taken in the same matrix product as Sᵀg and Yᵀg, and the direction is one more
  product, so each iteration streams the history twice where the two-loop streamed it four times,
  plus q twice per pair (BandMF at n = 2052, b̂ = 342: 643,473-entry vectors, 10 pairs; why:
  docs/benchmarks.md). A pair is kept only if sᵀy > 1e-12·‖s‖‖y‖ (curvature)."""

  def __init__(self, dim: int, memory: int):
    self.memory = max(int(memory), 1)
    self.s = np.zeros((self.memory, dim))
    self.y = np.zeros((self.memory, dim))
    self._probe = np.empty((3, dim))  # g, and the newest s and y, as the columns of one product
    self._sy = np.zeros((self.memory, self.memory))  # [i, j] = s_iᵀ y_j, by slot
    self._yy = np.zeros((self.memory, self.memory))
    self.order: list[int] = []  # slots, oldest pair first
    self._new = False  # the newest pair's inner products are not taken yet

  @property
  def count(self) -> int:
    return len(self.order)

  def clear(self) -> None:
    self.order.clear()
    self._new = False

  def add(self, s: np.ndarray, y: np.ndarray) -> None:
    sy = float(s @ y)
    if not sy > 1e-12 * float(np.linalg.norm(s) * np.linalg.norm(y)):
      return
    if self._new:  # Two pairs without a direction between them (not the driver's order).
      self._inner_products(None)
    slot = self.order.pop(0) if self.count == self.memory else self.count
    self.order.append(slot)
    self.s[slot] = s
    self.y[slot] = y
    self._probe[1] = s
    self._probe[2] = y
    self._new = True

  def _inner_products(self, g: Optional[np.ndarray]) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(Sᵀg, Yᵀg) by slot (None without g), taking the newest pair's inner products with every
    kept pair in the same pass over the history."""
    c = max(self.order) + 1  # slots 0..c-1 are filled
    rows = [0] if g is not None else []
    if g is not None:
      self._probe[0] = g
    if self._new:
      rows += [1, 2]
    probe = self._probe[rows[0] : rows[-1] + 1]  # contiguous rows: no copy
    s_probe = self.s[:c] @ probe.T
    y_probe = self.y[:c] @ probe.T
    if self._new:
      slot, at = self.order[-1], rows.index(1)
      self._sy[slot, :c] = y_probe[:, at]  # s_newᵀ y_j
      self._sy[:c, slot] = s_probe[:, at + 1]  # s_jᵀ y_new
      self._yy[slot, :c] = self._yy[:c, slot] = y_probe[:, at + 1]
      self._new = False
    return None if g is None else (s_probe[:, 0], y_probe[:, 0])

  def direction(self, g: np.ndarray) -> np.ndarray:
    """-H g (a new array; g is not changed)."""
    if not self.order:
      return -np.asarray(g, dtype=np.float64)
    c = max(self.order) + 1
    s_g, y_g = self._inner_products(g)
    order = np.array(self.order)
    sy = self._sy[np.ix_(order, order)]
    yy = self._yy[np.ix_(order, order)]
    newest = order[-1]
    gamma = self._sy[newest, newest] / self._yy[newest, newest]
    r = np.triu(sy)
    s_g, y_g = s_g[order], y_g[order]
    u = scipy.linalg.solve_triangular(r, s_g)
    middle = (np.diag(np.diag(sy)) + gamma * yy) @ u - gamma * y_g
    top = scipy.linalg.solve_triangular(r, middle, trans="T")
    s_coef = np.zeros(c)
    y_coef = np.zeros(c)
    s_coef[order] = -top
    y_coef[order] = gamma * u
    d = s_coef @ self.s[:c]
    d += y_coef @ self.y[:c]
    d -= gamma * g
    return d
