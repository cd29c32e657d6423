"""Optimizing column-normalized b̂-banded strategies (BandMF) and choosing b̂.

Notation follows docs/architecture.md (n, A, C, B = A C⁻¹, X = CᵀC, `bands` = b̂, `min_sep` = b,
`max_participations` = k). The objective is the expected total squared error (BandMF Eq. 3–4)

  L(C) = sens²(C) · ‖A C⁻¹‖²_F.

For a column-normalized b̂-banded C and b-min-sep participation with b ≥ b̂, sens² = k_eff =
min(k, ceil(n/b)) for every such C (BandMF §4, Scaling BandMF §3.1). So once b ≥ b̂ the optimal C does not depend on
(b, k): we minimize ‖A C⁻¹‖²_F alone, and (b, k) only scale the result. The optional 'max' objective
minimizes max_i ‖row_i(A C⁻¹)‖² (MaxError², BandMF Eq. 3–4) through a p-norm continuation of the squared
row norms, with the same gradient machinery (a row-weighted Frobenius gradient).

Two methods share one L-BFGS loop (Armijo backtracking; an infeasible trial point counts as +inf
and shrinks the step, since scipy's L-BFGS-B has been seen to stop early when fed inf):

- 'theta' (default): L-BFGS directly on the raw parameters Θ of the column-normalized C (Scaling BandMF §3.1),
  C[:, j] = Θ[:, j] / ‖Θ[:, j]‖. Gradient: the adjoint of ‖A C⁻¹‖²_F, ∂/∂C = -2 Fᵀ A X⁻¹ with
  F = A C⁻¹, masked to the band and pulled back through the normalization
  (`banded_matrix.loss_sq_and_grad`). For the prefix sum one evaluation is the block recursion of
  `fedmf.mf.banded_blocks` and its hand-derived reverse pass: O(n·b̂²) in BLAS-3 (n = 2052,
  b̂ = 342: ~1.3·10⁹ multiply-adds, 0.23 s of CPU on one core of this machine, against 0.85–0.97 s
  for the dense triangular inverse and products it replaced), memory O(n·b̂), not the O(n² b̂) tape of
  reverse-mode autodiff. Other workloads take the dense O(n³) route.
- 'x', the "X route" (BandMF Problem 2 / Eq. 6): minimize the convex tr(AᵀA X⁻¹) over symmetric X with
  diag(X) = 1 and X_ij = 0 for |i-j| ≥ b̂; the gradient is -X⁻¹AᵀAX⁻¹ masked to the band, and a
  failed Cholesky marks a non-PD trial point. C is recovered by the banded reverse Cholesky
  (BandMF Prop 4.1), with unit columns because diag(X) = 1.

Both reach the same optimum (Scaling BandMF App. B Example B.1 to 1e-9). The X route's iterations
stay dense (O(n³)), and it needs far more of them: at n = 2052, b̂ = 342 (prefix sum) 'theta'
reaches ‖A C⁻¹‖²_F = 25267.5 after 80 iterations, 25266.4 after 100 and 25265.85 after 180, whereas
the X route is at 25689.8 after 80 and 25514.3 after 100 (measured, 2 shared cores). Hence the
default. Small problems start from the column-normalized truncated square-root Toeplitz strategy
(the optimal banded Toeplitz start saves no iterations: measured at n = 1026, b̂ = 171 and at
n = 2052, b̂ = 342, 133 iterations either way, as neither a larger L-BFGS memory nor per-column
scaling of its initial Hessian does). Large ones (n ≥ 1024, b̂ ≥ 128) take a nested start
(`coarse_start_theta`, the multilevel idea of nested iteration): the optimum at half n and half b̂,
whose iterations cost ~1/8, interpolated to (n, b̂). What the Toeplitz starts lack is the edges
(the first and the truncated last columns), which the coarse optimum has; at n = 2052, b̂ = 342 the
fine level then stops after 108-111 iterations instead of 133-136, at the same loss (RmsLoss
8.59517-8.59518), and the whole run takes ~5-9% less CPU (the coarse levels cost ~3-4 CPU-s).

Stopping: when the loss fell by less than `rtol` = 1e-6 (relative) over the last 5 iterations. At
n = 2052, b̂ = 342 that is about iteration 140, ‖A C⁻¹‖²_F = 25265.91 (RmsLoss 8.59517), 3e-6 above
the optimum 25265.84 that rtol = 1e-8 reaches after ~230 iterations (measured).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import threadpoolctl
from scipy.linalg import blas, lapack

from fedmf.errors import FedmfUserError
from fedmf.mf import banded_matrix
from fedmf.mf import lbfgs
from fedmf.mf import workloads as workloads_lib


# L-BFGS history length. Each iteration streams the 2·memory history vectors twice
# (`lbfgs.CompactHistory`), which at n = 2052, b̂ = 342 is memory-bound (56 MB per 10 vectors):
# 5 pairs took 111 iterations to the stopping rule against 108 with 10, and 35.6 against 37.1 s
# (7 pairs: 108 iterations, 37.1 s; 15: 108, 39.6 s), at RmsLoss 8.595177 against 8.595174
# (measured on one quiet core, docs/benchmarks.md).
LBFGS_MEMORY = 5


def sqrt_toeplitz_coefs(bands: int) -> np.ndarray:
  """First `bands` Toeplitz coefficients of √(prefix sum): c_0 = 1, c_j = c_{j-1}(2j-1)/(2j)."""
  c = np.ones(bands, dtype=np.float64)
  for j in range(1, bands):
    c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
  return c


def warm_start_theta(n: int, bands: int) -> np.ndarray:
  """Column-normalized, truncated square-root Toeplitz strategy (the optimizer's default start)."""
  bands = min(bands, n)
  coefs = sqrt_toeplitz_coefs(bands)
  return banded_matrix.normalize_columns(np.tile(coefs[:, None], (1, n)), n)


# The nested start applies from this size on: below it the coarse solve saves less than it costs
# (measured at n = 2052, b̂ = 342: 108-110 fine iterations from the coarse start against 133-135
# from the square-root Toeplitz start, the coarse solve at n = 1026, b̂ = 171 costing ~1/8 per
# iteration; at n = 256, b̂ = 32 the two starts need 48 and 49 iterations).
COARSE_MIN_N = 1024
COARSE_MIN_BANDS = 128
STARTS = ('auto', 'sqrt-toeplitz', 'coarse')


def uses_coarse_start(n: int, bands: int, start: str = 'auto') -> bool:
  """Whether `optimize_bandmf` (prefix sum, objective 'rms', no `init`) starts from the coarse
  solution: `start` 'coarse', or 'auto' at n ≥ COARSE_MIN_N and b̂ ≥ COARSE_MIN_BANDS."""
  if start not in STARTS:
    raise ValueError(f'start must be one of {STARTS}, got {start!r}')
  if start == 'auto':
    return n >= COARSE_MIN_N and min(bands, n) >= COARSE_MIN_BANDS
  return start == 'coarse' and n >= 4 and min(bands, n) >= 4


def interpolate_theta(theta: np.ndarray, n: int, bands: int) -> np.ndarray:
  """A (bands × n) band bilinearly interpolated from a coarser (b̂' × n') one, corners aligned:
  entry (r, j) reads the coarse band at (r·(b̂'-1)/(b̂-1), j·(n'-1)/(n-1)). Not normalized.

  The optimal column-normalized C for the prefix sum changes slowly along its diagonals and down
  its columns (near-Toeplitz, c_r ~ 1/√r; Scaling BandMF §3), so the optimum at (n/2, b̂/2) read at
  half resolution is close to the optimum at (n, b̂), edges included, which the Toeplitz starts
  are not (measured: the optimal band-Toeplitz start saves no iterations at n = 2052, b̂ = 342).
  """
  from scipy import ndimage  # pylint: disable=g-import-not-at-top  (only the nested start needs it)

  coarse_bands, coarse_n = theta.shape
  r = np.arange(bands)[:, None] * ((coarse_bands - 1) / max(bands - 1, 1))
  j = np.arange(n)[None, :] * ((coarse_n - 1) / max(n - 1, 1))
  rows, cols = np.broadcast_arrays(r, j)
  fine = ndimage.map_coordinates(np.asarray(theta, dtype=np.float64), [rows, cols], order=1)
  return banded_matrix.columns_to_theta(fine, n)


def coarse_start_theta(
  n: int, bands: int, max_iter: int, rtol: float, memory: int
) -> tuple[np.ndarray, dict[str, Any]]:
  """The nested (multilevel) start: `optimize_bandmf` at (⌈n/2⌉, ⌈b̂/2⌉) with the same stopping
  rule and iteration budget (itself started from a coarser solution when that is large enough),
  interpolated to (n, b̂) and column-normalized. Returns (theta, info of the coarse solve).

  Its iterations are not reported to `progress` (whose steps a progress bar bounds by max_iter):
  at n = 2052, b̂ = 342 they take ~1/8 of the time."""
  coarse_n, coarse_bands = (n + 1) // 2, (min(bands, n) + 1) // 2
  coarse, info = optimize_bandmf(
    coarse_n, coarse_bands, max_iter=max_iter, rtol=rtol, memory=memory
  )
  return banded_matrix.normalize_columns(interpolate_theta(coarse, n, bands), n), info


def optimize_bandmf(
  n: int,
  bands: int,
  min_sep: int | None = None,
  max_participations: int | None = None,
  workload: np.ndarray | None = None,
  objective: str = 'rms',
  max_iter: int = 500,
  progress: lbfgs.ProgressFn = None,
  *,
  init: np.ndarray | None = None,
  method: str = 'theta',
  rtol: float = 1e-6,
  memory: int = LBFGS_MEMORY,
  route: str = 'auto',
  start: str = 'auto',
) -> tuple[np.ndarray, dict[str, Any]]:
  """Optimizes a column-normalized b̂-banded strategy C for the workload A.

  Args:
    n: number of rounds.
    bands: b̂ (clipped to n; b̂ = n gives a general lower-triangular C).
    min_sep: b, used only to validate b ≥ b̂ and to report sens²; it does not change the optimum.
    max_participations: k (None = unbounded), used only to report sens² = k_eff.
    workload: dense n×n lower-triangular A; None means prefix sum.
    objective: 'rms' minimizes ‖A C⁻¹‖²_F (the expected total squared error up to sens²). 'max'
      minimizes the largest squared row norm max_i ‖row_i(A C⁻¹)‖² (MaxError² up to sens²) through
      the p-norm continuation p = 16 → 1024 (method 'theta' only; max_iter is split over stages).
    max_iter: maximum L-BFGS iterations.
    progress: optional callable receiving {'iteration', 'loss', 'loss_sq', 'evaluations', 'elapsed'}
      after every iteration (e.g. to drive a progress bar). 'loss_sq' is the current objective
      value, ‖A C⁻¹‖²_F for 'rms' and the p-norm surrogate of max_i ‖row_i(A C⁻¹)‖² (key 'power' = p)
      for 'max'; 'loss' is its square root (sensitivity excluded).
    init: optional starting theta (bands × n, normalized here); default `warm_start_theta`.
    method: 'theta' (column-normalized parametrization, default) or 'x' (convex X route).
    rtol: stop when the relative decrease of the loss over 5 iterations falls below this.
    memory: L-BFGS history length.
    route: how method 'theta' evaluates the loss and gradient (`banded_matrix.ROUTES`: 'auto' is
      the block recursion for the prefix sum; 'dense' the O(n³) route, for benchmarks).
    start: without `init`, where method 'theta' starts for the prefix sum and objective 'rms':
      'sqrt-toeplitz' (`warm_start_theta`), 'coarse' (`coarse_start_theta`: the optimum at half n
      and half b̂, interpolated) or 'auto' (coarse when `uses_coarse_start`, else sqrt-toeplitz).
      Other workloads, objective 'max' and method 'x' always take sqrt-toeplitz.

  Returns:
    (theta, info): theta is the (bands × n) column-normalized C; info holds 'loss_sq' = ‖A C⁻¹‖²_F,
    'max_row_sq' = max_i ‖row_i(A C⁻¹)‖², 'objective', 'iterations', 'evaluations', 'seconds',
    'converged', 'method', 'bands', 'start', 'coarse_iterations' and 'coarse_evaluations' (0 without
    the coarse start) and, when min_sep is given,
    'sens_sq' = k_eff and 'expected_total_sq_error' = sens² · loss_sq.
  """
  if objective not in ('rms', 'max'):
    raise FedmfUserError(f"objective must be 'rms' or 'max', got {objective!r}")
  if objective == 'max' and method != 'theta':
    raise FedmfUserError("objective='max' requires method='theta'")
  if int(n) != n or n < 1:
    raise FedmfUserError(f'n must be a positive integer, got {n}')
  if int(bands) != bands or bands < 1:
    raise FedmfUserError(f'bands must be a positive integer, got {bands}')
  bands = min(int(bands), int(n))
  if min_sep is not None and bands > min_sep:
    raise FedmfUserError(
      f'bands={bands} > min_sep={min_sep}: the sensitivity of a banded C is then not '
      'k_eff; use bands ≤ min_sep'
    )
  a = None if workloads_lib.is_prefix_sum(workload) else np.asarray(workload, dtype=np.float64)
  if a is not None and a.shape != (n, n):
    raise FedmfUserError(f'workload has shape {a.shape}, expected ({n}, {n})')
  # One BLAS thread for the block recursion: on its s×s blocks (s = max(b̂ + 1, 64)) a second
  # OpenBLAS thread buys little on a quiet machine (dtrmm, half the work, runs on one thread
  # anyway) and costs much on a loaded one, where the threads wait for each other: one evaluation
  # at n = 2052, b̂ = 342 took 0.25 CPU-s and 0.26 s wall on one thread against 0.43-0.46 CPU-s and
  # 0.67-0.87 s wall on two (load 5.6 on 2 cores; docs/benchmarks.md). The dense routes' n×n
  # products keep the default.
  blocks = method == 'theta' and a is None and route != 'dense'
  with (
    threadpoolctl.threadpool_limits(limits=1, user_api='blas')
    if blocks
    else contextlib.nullcontext()
  ):
    started = time.perf_counter()
    coarse_info = {'iterations': 0, 'evaluations': 0}
    if init is not None:
      start_used = 'init'
      theta0 = banded_matrix.normalize_columns(
        banded_matrix.columns_to_theta(np.asarray(init, dtype=np.float64)[:bands], n), n
      )
    elif (
      method == 'theta' and objective == 'rms' and a is None and uses_coarse_start(n, bands, start)
    ):
      start_used = 'coarse'
      theta0, coarse_info = coarse_start_theta(n, bands, max_iter, rtol, memory)
    else:
      uses_coarse_start(n, bands, start)  # Validates `start`.
      start_used = 'sqrt-toeplitz'
      theta0 = warm_start_theta(n, bands)
    if bands == 1:
      theta = np.ones((1, n))
      result = lbfgs.LbfgsResult(
        x=np.zeros(0),
        f=_x_value_and_grad(np.ones((1, n)), a)[0],
        iterations=0,
        evaluations=1,
        converged=True,
      )
    elif method == 'x':
      mask = _strict_band_mask(bands, n)
      x_low0 = banded_matrix.gram_band(theta0)

      def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        x_low = np.zeros((bands, n))
        x_low[0] = 1.0
        x_low[mask] = x
        value, grad = _x_value_and_grad(x_low, a)
        return value, (grad[mask] if grad is not None else None)

      result = _run_lbfgs(fun, x_low0[mask], max_iter, memory, rtol, progress, started)
      x_low = np.zeros((bands, n))
      x_low[0] = 1.0
      x_low[mask] = result.x
      theta = banded_matrix.reverse_cholesky_banded(x_low)
    elif method == 'theta':
      # The variable is the whole (bands × n) Θ, flattened: its out-of-range entries (j + r ≥ n)
      # start at zero and their gradient is zero, so they stay zero, without a boolean gather and
      # scatter of the band in every evaluation.
      in_range = _in_range_mask(bands, n)
      x0 = np.where(in_range, theta0, 0.0).ravel()

      def make_fun(weights):
        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
          th = x.reshape(bands, n)
          if not np.all(np.einsum('ij,ij->j', th, th) > 0):
            return math.inf, None
          value, grad, _ = banded_matrix.loss_and_grad_with_row_weights(th, a, weights, route)
          return value, grad.ravel()

        return fun

      if objective == 'rms':
        result = _run_lbfgs(
          make_fun(lambda r: (float(np.sum(r)), None)),
          x0,
          max_iter,
          memory,
          rtol,
          progress,
          started,
        )
      else:
        # Smooth continuation for max_i r_i: minimize (Σ r_i^p)^{1/p}, which lies within a factor
        # n^{1/p} of the maximum, for p = 16, 64, 256, 1024, each stage warm-started from the last.
        x = x0
        per_stage = max(1, max_iter // len(_MAX_POWERS))
        iterations = evaluations = 0
        for power in _MAX_POWERS:
          stage_progress = (
            None
            if progress is None
            else functools.partial(
              _offset_progress, progress=progress, offset=iterations, power=power
            )
          )
          result = _run_lbfgs(
            make_fun(functools.partial(_pnorm_weights, power=power)),
            x,
            per_stage,
            memory,
            rtol,
            stage_progress,
            started,
          )
          x = result.x
          iterations += result.iterations
          evaluations += result.evaluations
        result = dataclasses.replace(result, iterations=iterations, evaluations=evaluations)
      theta = np.where(in_range, result.x.reshape(bands, n), 0.0)
    else:
      raise ValueError(f"method must be 'x' or 'theta', got {method!r}")

    theta = banded_matrix.normalize_columns(theta, n)
    row_sq = banded_matrix.decoder_row_sq_norms(theta, a)
    info: dict[str, Any] = {
      'loss_sq': float(np.sum(row_sq)),
      'max_row_sq': float(np.max(row_sq)),
      'objective': objective,
      'iterations': result.iterations,
      'evaluations': result.evaluations,
      'seconds': time.perf_counter() - started,
      'converged': result.converged,
      'method': method,
      'bands': bands,
      'start': start_used,
      'coarse_iterations': coarse_info['iterations'],
      'coarse_evaluations': coarse_info['evaluations'],
    }
    if min_sep is not None:
      sens_sq = banded_matrix.sensitivity_sq(n, bands, min_sep, max_participations)
      info['sens_sq'] = sens_sq
      info['expected_total_sq_error'] = sens_sq * info['loss_sq']
    return theta, info


_MAX_POWERS = (16, 64, 256, 1024)


def _offset_progress(
  update: dict[str, Any], progress: lbfgs.ProgressFn, offset: int, power: int
) -> None:
  progress(dict(update, iteration=update['iteration'] + offset, power=power))


def _pnorm_weights(row_sq: np.ndarray, power: float) -> tuple[float, np.ndarray]:
  """φ = (Σ r_i^p)^{1/p} and ∂φ/∂r_i = S^{1/p-1} u_i^{p-1}, with u = r / max r and S = Σ u^p."""
  top = float(np.max(row_sq))
  u = row_sq / top
  total = float(np.sum(u**power))
  return top * total ** (1.0 / power), total ** (1.0 / power - 1.0) * u ** (power - 1.0)


def choose_bands(
  n: int,
  min_sep: int,
  max_participations: int | None,
  workload: np.ndarray | None = None,
  candidates: Sequence[int] | None = None,
  *,
  max_iter: int = 50,
  rtol: float = 0.0,
  max_bands: int | None = None,
  progress: lbfgs.ProgressFn = None,
) -> int:
  """Picks b̂ by the expected loss sens² · ‖A C⁻¹‖²_F over candidate band counts.

  Heuristic: every candidate satisfies b̂ ≤ min(min_sep, n, max_bands), so sens² = k_eff is exact
  and the same for all of them; each candidate is optimized with a cheap budget (`max_iter` L-BFGS
  steps of `optimize_bandmf`). Since a b̂-banded C is also (b̂+1)-banded, the true optimum is
  non-increasing in b̂ and b̂ = min(min_sep, n) wins up to optimizer budget; the search therefore
  matters when `rtol` > 0: the smallest candidate within a factor (1 + rtol) of the best loss is
  returned, saving streaming memory (b̂ model-sized buffers) at a bounded error cost. (Amplified
  BandMF, where σ depends on b̂, is the accountant's concern and not modelled here.) Cost: one
  `optimize_bandmf` run per candidate, each O(max_iter · n³) in BLAS-3 whatever b̂ is.

  Args:
    n: rounds.
    min_sep: b.
    max_participations: k (None = unbounded).
    workload: dense A, or None for prefix sum.
    candidates: band counts to try; default the powers of two below the cap, plus the cap itself
      (cap = min(min_sep, n, max_bands)). Candidates above the cap are dropped.
    max_iter: L-BFGS budget per candidate.
    rtol: relative loss tolerance for preferring fewer bands (0 = plain argmin).
    max_bands: optional memory cap on b̂.
    progress: optional callable receiving {'bands', 'loss_sq', 'expected_loss_sq'} per candidate.

  Returns:
    The chosen b̂.
  """
  cap = min(int(min_sep), int(n), int(max_bands) if max_bands is not None else int(n))
  if cap < 1:
    raise ValueError(f'no admissible band count: min_sep={min_sep}, n={n}, max_bands={max_bands}')
  if candidates is None:
    cands = [1 << p for p in range(int(math.log2(cap)) + 1) if (1 << p) < cap] + [cap]
  else:
    cands = sorted({int(c) for c in candidates if 1 <= int(c) <= cap})
    if not cands:
      raise ValueError(f'no candidate band count in [1, {cap}]')
  sens_sq = banded_matrix.sensitivity_sq(
    n, 1, min_sep, max_participations
  )  # k_eff, same for every b̂ ≤ b
  scores = []
  for b in cands:
    # The square-root Toeplitz start: candidates are compared at one cheap budget each.
    _, info = optimize_bandmf(
      n, b, min_sep, max_participations, workload, max_iter=max_iter, start='sqrt-toeplitz'
    )
    expected = sens_sq * info['loss_sq']
    scores.append(expected)
    if progress is not None:
      progress({'bands': b, 'loss_sq': info['loss_sq'], 'expected_loss_sq': expected})
  best = min(scores)
  for b, s in zip(cands, scores):
    if s <= (1.0 + rtol) * best:
      return b
  return cands[int(np.argmin(scores))]


# ---------------------------------------------------------------------------------------------
# X-route objective.


def _x_value_and_grad(x_low: np.ndarray, a: np.ndarray | None) -> tuple[float, np.ndarray | None]:
  """tr(AᵀA X⁻¹) and its gradient w.r.t. the lower-band entries of the symmetric banded X.

  Returns (inf, None) when X is not positive definite. The gradient entry for x_low[r, j], r ≥ 1,
  counts both X[j+r, j] and X[j, j+r]: 2·G[j+r, j] with G = -X⁻¹AᵀAX⁻¹ (BandMF Eq. 6).
  """
  bands, n = x_low.shape
  try:
    theta = banded_matrix.reverse_cholesky_banded(x_low)  # BandMF Prop 4.1: CᵀC = X
  except np.linalg.LinAlgError:
    return math.inf, None
  if not np.all(np.isfinite(theta)):
    return math.inf, None
  c = banded_matrix.banded_matrix(theta)
  c_inv, info = lapack.dtrtri(c, lower=1)
  if info != 0:
    return math.inf, None
  f = banded_matrix.apply_workload(a, c_inv)  # F = A C⁻¹
  value = float(np.dot(f.ravel(), f.ravel()))  # ‖A C⁻¹‖²_F = tr(AᵀA X⁻¹)
  if bands == 1:
    return value, np.zeros_like(x_low)
  m = blas.dtrmm(1.0, c_inv, f, side=1, lower=1, trans_a=1)  # M = F C⁻ᵀ = A X⁻¹
  grad = -2.0 * banded_matrix.band_of_product(m, m, bands)
  grad[0] = 0.0
  return value, grad


def _strict_band_mask(bands: int, n: int) -> np.ndarray:
  mask = _in_range_mask(bands, n)
  mask[0] = False
  return mask


def _in_range_mask(bands: int, n: int) -> np.ndarray:
  r = np.arange(bands)[:, None]
  j = np.arange(n)[None, :]
  return j + r < n


def _run_lbfgs(
  fun: Callable[[np.ndarray], tuple[float, np.ndarray | None]],
  x0: np.ndarray,
  max_iter: int,
  memory: int,
  rtol: float,
  progress: lbfgs.ProgressFn,
  start: float,
) -> lbfgs.LbfgsResult:
  """The shared driver's backtracking L-BFGS (inf = outside the domain), reporting progress."""

  def on_step(step: lbfgs.Step) -> None:
    progress(
      {
        'iteration': step.iteration,
        'loss': math.sqrt(step.f),
        'loss_sq': step.f,
        'evaluations': step.evaluations,
        'elapsed': time.perf_counter() - start,
      }
    )

  return lbfgs.minimize(
    fun,
    x0,
    max_iter=max_iter,
    memory=memory,
    line_search='backtracking',
    rtol=rtol,
    on_step=None if progress is None else on_step,
  )
