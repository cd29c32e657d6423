"""The one L-BFGS driver of the strategy optimizers (BandMF, banded Toeplitz, BLT) and their
progress type.

`minimize` runs L-BFGS on a (value, gradient) function and reports every accepted iterate through
one callback, with one result type; each iteration first checks the `--max-seconds` clock
(`fedmf.mf.resources.check_time`: a no-op unless the caller runs it under `time_limit`). Two line searches are offered because the optimizers' outputs
are pinned bit for bit by their tests and stored strategies:
  * 'backtracking' (BandMF): Armijo backtracking that treats an infinite value (a point outside
    the domain, e.g. a zero column of C) as "step too long", two-loop recursion (Nocedal & Wright
    Alg. 7.4), stopping on a relative decrease below `rtol` over 5 iterations;
  * 'scipy' (banded Toeplitz, BLT): scipy's L-BFGS-B (Byrd, Lu, Nocedal and Zhu 1995) with its
    `ftol` / `gtol` tests, for smooth objectives defined everywhere.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np
from scipy.linalg import blas

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
  s_hist: list[np.ndarray] = []
  y_hist: list[np.ndarray] = []
  history = [f]
  converged = False
  iteration = 0
  for iteration in range(1, max_iter + 1):
    resources.check_time()  # --max-seconds: iterations are where an optimizer can be stopped.
    d = _two_loop(g, s_hist, y_hist)
    if not s_hist:
      # First step: move the largest coordinate by 0.01 (entries of X and of normalized C are O(1)).
      d *= 0.01 / max(np.max(np.abs(d)), 1e-300)
    slope = float(g @ d)
    if slope >= 0:  # not a descent direction: restart from steepest descent
      s_hist.clear()
      y_hist.clear()
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
    s = x_new - x
    y = g_new - g
    sy = float(s @ y)
    if sy > 1e-12 * float(np.linalg.norm(s) * np.linalg.norm(y)):
      s_hist.append(s)
      y_hist.append(y)
      if len(s_hist) > memory:
        s_hist.pop(0)
        y_hist.pop(0)
    x, f, g = x_new, f_new, g_new
    history.append(f)
    if on_step is not None:
      on_step(Step(iteration, x, f, evaluations))
    if len(history) > 5 and history[-6] - f <= rtol * abs(f):
      converged = True
      break
  return LbfgsResult(x=x, f=f, iterations=iteration, evaluations=evaluations, converged=converged)


def _two_loop(g: np.ndarray, s_hist: list[np.ndarray], y_hist: list[np.ndarray]) -> np.ndarray:
  """L-BFGS two-loop recursion (Nocedal & Wright Alg. 7.4): returns -H g.

  The updates of q are BLAS daxpy in place: the recursion streams 4·memory history vectors from
  memory, and `q -= alpha * y` added a temporary and two more passes over q to each (BandMF at
  n = 2052, b̂ = 342, 643,473 entries: 40 against 61 ms per call, one thread, load ~6)."""
  q = np.array(g, dtype=np.float64)  # A contiguous copy: daxpy then updates it in place.
  alphas = []
  for s, y in zip(reversed(s_hist), reversed(y_hist)):
    rho = 1.0 / float(y @ s)
    alpha = rho * float(s @ q)
    q = blas.daxpy(y, q, a=-alpha)
    alphas.append((rho, alpha))
  if s_hist:
    s, y = s_hist[-1], y_hist[-1]
    q *= float(s @ y) / float(y @ y)
  for (s, y), (rho, alpha) in zip(zip(s_hist, y_hist), reversed(alphas)):
    beta = rho * float(y @ q)
    q = blas.daxpy(s, q, a=alpha - beta)
  q *= -1.0
  return q
