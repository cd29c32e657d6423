"""The strategy interface: what every correlated-noise mechanism knows about its own math.

One concept: a `Strategy` is a frozen dataclass naming a mechanism and its parameters. It owns
  * its matrix C for any n (`matrix`), and, where it has them, its Toeplitz coefficients
    (`toeplitz_coefs`) or band (`banded_theta`), which the generic formulas use;
  * its sensitivity under a `ParticipationSchema`, labelled exact / upper-bound / lower-bound;
  * its per-round error for a workload (`decoder_row_sq_norms`);
  * its streaming noise (`noise_stream`, one definition for numpy and TensorFlow);
  * its JSON form (`from_dict` / `to_dict`), its description, and its optimizer.
Generic code (evaluation, accounting, the aggregator, the CLI) calls these methods and never asks
for the type. The loader in `fedmf.mf.strategies` maps JSON "mechanism" names to classes.

Notation (docs/architecture.md): n rounds, 0-based; A workload; C strategy; C⁻¹ noising matrix;
B = A C⁻¹ decoder; X = CᵀC; b = min-sep (a gap); k = max participations; b̂ bands.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Mapping, Optional

import numpy as np
import scipy.linalg

from fedmf.mf import banded_matrix
from fedmf.mf import resources
from fedmf.mf import streaming
from fedmf.mf import toeplitz_math
from fedmf.mf import workloads
from fedmf.mf import sensitivity as sens_lib
from fedmf.mf.checks import StrategyError
from fedmf.mf.lbfgs import ProgressFn
from fedmf.mf.schema import ParticipationSchema
from fedmf.mf.sensitivity import AssumptionError, Sensitivity

SENSITIVITY_METHODS = ("auto", "upper-bound", "lower-bound")

# ---------------------------------------------------------------------------------------------
# Conditioning of C (docs/mechanisms.md, Conditioning): checked when a strategy is loaded.
#
# r = max_t ‖row_t(C⁻¹)‖ is the noise std of one round at σ = 1 and s = max_j ‖col_j(C)‖ the
# single-participation sensitivity. Row t of C⁻¹ has the entry 1/C_tt, so r ≥ 1/|C_tt| for every t
# and κ = max_t |C_tt| · r ≥ 1: how much more noise C⁻¹ adds than its own diagonal accounts for.
# κ is scale-free, 1 for C = I, below 5 for every strategy the optimizers produce, and huge exactly
# when C is near-singular: a tiny pivot (a diagonal of 1e-300 gives κ ≈ 1e300) or a C⁻¹ that grows
# geometrically over the rounds.

MAX_NOISE_AMPLIFICATION = 1e6  # κ: five orders of magnitude above any optimized strategy
MAX_NOISE_GAIN = 1e12  # r: C⁻¹ z stays far inside float32's 3.4e38 for any σ·ζ and sum
MAX_COLUMN_NORM = 1e12  # s: s² is float64-safe, and r ≥ 1/s ≥ 1e-12 (no float32 underflow)


@dataclasses.dataclass(frozen=True)
class Conditioning:
  """How C scales the noise, over `rounds` rounds (None: every round of a horizon-free C).

  Attributes:
    column_norm: s = max_j ‖col_j(C)‖ (the k = 1 sensitivity).
    noise_gain: r = max_t ‖row_t(C⁻¹)‖ (the per-round noise std at σ = 1).
    diagonal: max_t |C_tt|.
    rounds: the horizon these cover; None for the supremum over all rounds.
    unstable: for an IIR C⁻¹ (horizon-free Toeplitz C), a description of a pole on or outside
      the unit circle (the noise then grows without bound in the number of rounds), else None.
  """

  column_norm: float
  noise_gain: float
  diagonal: float = 1.0
  rounds: Optional[int] = None
  unstable: Optional[str] = None

  @property
  def amplification(self) -> float:
    """κ = max_t |C_tt| · r."""
    with np.errstate(over="ignore", invalid="ignore"):
      return float(np.float64(self.diagonal) * np.float64(self.noise_gain))

  def check(self, field: str) -> None:
    """Raises StrategyError naming `field`, the numbers and the limit, unless C is usable."""
    over = "all rounds" if self.rounds is None else f"n={self.rounds} rounds"
    why = f" ({self.unstable})" if self.unstable else ""
    s, r, kappa = self.column_norm, self.noise_gain, self.amplification
    if not s <= MAX_COLUMN_NORM:
      raise StrategyError(
        f"{field}: C overflows: its largest column norm over {over} is {s:.3g}, above the "
        f"limit {MAX_COLUMN_NORM:.0e}{why}"
      )
    if not r <= MAX_NOISE_GAIN:
      raise StrategyError(
        f"{field}: C is near-singular: the noise std of a round at σ = 1, max_t ‖row_t(C⁻¹)‖ "
        f"over {over}, is {r:.3g}, above the limit {MAX_NOISE_GAIN:.0e} (float32 noise "
        f"overflows){why}"
      )
    if not kappa <= MAX_NOISE_AMPLIFICATION:
      raise StrategyError(
        f"{field}: C is near-singular: max_t |C_tt| · max_t ‖row_t(C⁻¹)‖ over {over} = "
        f"{self.diagonal:.3g} · {r:.3g} = {kappa:.3g}, above the limit "
        f"{MAX_NOISE_AMPLIFICATION:.0e}{why}"
      )


# Amplification theorems a strategy may be covered by (`Strategy.poisson_amplification`).
AMPLIFIED_DPSGD = "dpsgd-poisson"  # DP-SGD with Poisson sampling: one group
AMPLIFIED_BANDMF = "amplified-bandmf"  # BandMF §5 Thm 4: column-normalized, one group per band

# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptimizeOptions:
  """Options of `Strategy.optimize`; each mechanism reads the ones it has.

  Attributes:
    bands: b̂ for banded mechanisms (default: the schema's b, at most n).
    buffers: BLT buffers (default: chosen by the optimizer).
    objective: 'max' or 'rms' loss (default: the mechanism's usual one).
    tree_variant: 'vanilla', 'online-honaker' or 'full-honaker'.
    column_normalize: store a banded Toeplitz strategy column-normalized (BandMF-scaling §3.1).
    max_iter: optimizer iteration budget.
    seed: seed of multi-start optimizers.
    progress: callback receiving a dict per optimizer step.
  """

  bands: Optional[int] = None
  buffers: Optional[int] = None
  objective: Optional[str] = None
  tree_variant: str = "online-honaker"
  column_normalize: bool = False
  max_iter: Optional[int] = None
  seed: int = 0
  progress: ProgressFn = None

  def band_count(self, schema: ParticipationSchema) -> int:
    return min(self.bands or schema.min_sep, schema.n)

  def max_iter_kwargs(self) -> dict[str, int]:
    return {} if self.max_iter is None else {"max_iter": self.max_iter}


class Strategy(abc.ABC):
  """A correlated-noise mechanism (see the module docstring). Subclasses are frozen dataclasses."""

  mechanism: ClassVar[str]
  metadata: Mapping[str, Any]
  #: The JSON field(s) a conditioning refusal names.
  conditioning_field: ClassVar[str] = "strategy"

  # --- JSON -----------------------------------------------------------------------------------

  @classmethod
  @abc.abstractmethod
  def from_dict(cls, obj: Mapping[str, Any]) -> "Strategy":
    """Builds a validated strategy from its JSON object (raises StrategyError naming the field)."""

  @abc.abstractmethod
  def fields(self) -> dict[str, Any]:
    """The mechanism's own JSON fields (without 'mechanism' and metadata)."""

  def to_dict(self) -> dict[str, Any]:
    """The JSON form (round-trips through the loader), metadata included."""
    out: dict[str, Any] = {"mechanism": self.mechanism, **self.fields()}
    for key, value in self.metadata.items():
      out.setdefault(key, value)
    return out

  def describe(self) -> str:
    """A short human-readable name, e.g. 'blt (4 buffers)'."""
    return self.mechanism

  # --- Poisson sampling (cyclic Poisson participation; issue 21: the strategy answers, not a
  # switch on its name in the program) ------------------------------------------------------

  @classmethod
  def default_poisson_groups(cls, options: "OptimizeOptions") -> Optional[int]:
    """Cyclic Poisson groups of a run optimizing this mechanism with `options` when
    participation.min_sep is not given (None: the run must give it)."""
    return None

  def poisson_amplification(self, rounds: int, groups: int) -> Optional[str]:
    """The amplification theorem (`AMPLIFIED_DPSGD`, `AMPLIFIED_BANDMF`) that covers this strategy
    over `rounds` rounds with `groups` cyclic Poisson groups, or None."""
    return None

  # --- C --------------------------------------------------------------------------------------

  @property
  def horizon(self) -> Optional[int]:
    """The largest n this strategy is defined for (None: any n)."""
    return None

  def check_horizon(self, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
      raise StrategyError(f"the number of rounds n must be a positive integer, got {n!r}")
    if self.horizon is not None and n > self.horizon:
      raise StrategyError(
        f"this {self.mechanism} strategy was built for n={self.horizon} rounds "
        f"and cannot be used for n={n}"
      )

  def toeplitz_coefs(self, n: int) -> Optional[np.ndarray]:
    """The first n coefficients of C = LtToep(c) at horizon n, or None if C is not Toeplitz."""
    return None

  def banded_theta(self, n: int) -> Optional[np.ndarray]:
    """(b̂ × n) theta[r, j] = C[j+r, j] of a banded C at horizon n, or None if C is not banded."""
    return None

  def matrix(self, n: int) -> np.ndarray:
    """Dense C at horizon n, normalized exactly as noise and sensitivity use it."""
    self.check_horizon(n)
    coefs = self.toeplitz_coefs(n)
    if coefs is not None:
      return np.tril(scipy.linalg.toeplitz(coefs))
    theta = self.banded_theta(n)
    if theta is not None:
      return banded_matrix.banded_matrix(theta)
    raise NotImplementedError(f"{type(self).__name__}.matrix")

  # --- conditioning ---------------------------------------------------------------------------

  def conditioning(self, n: Optional[int] = None) -> Optional[Conditioning]:
    """How C scales the noise over n rounds (None: the strategy's horizon, or every round).

    None for mechanisms that are well-conditioned by construction (C = I, the tree).
    """
    return None

  def check_conditioning(self, n: Optional[int] = None) -> None:
    """Raises StrategyError (naming the field, the numbers and the limit) for a near-singular or
    overflowing C; `from_dict` calls it, so every loaded strategy passed it."""
    with np.errstate(all="ignore"):  # Overflow shows as inf, which the limits refuse.
      conditioning = self.conditioning(n)
    if conditioning is not None:
      conditioning.check(self.conditioning_field)

  # --- sensitivity ----------------------------------------------------------------------------

  def sensitivity(self, schema: ParticipationSchema, method: str = "auto") -> Sensitivity:
    """Sensitivity over schema.n rounds under b-min-sep with at most k participations.

    method:
      'auto': exact where a theorem applies (`exact_sensitivity`), otherwise for k = 1 the max
        column norm (exact) and else the general upper bound (VecSens appendix Alg. 3). Never an
        optimistic value.
      'upper-bound': the general two-stage VecSens bound over |CᵀC| (VecSens appendix Alg. 3).
      'lower-bound': ‖C u(π*)‖ with π* = (0, b, 2b, …) (BLT Remark 3.2), labelled as such.
    """
    self.check_horizon(schema.n)
    # Cached per strategy object (frozen: its C cannot change), so that the plan, the meter, the
    # audit and the report ask the strategy instead of recomputing (an exact banded or Toeplitz
    # value is cheap, a general bound over n×n is not).
    key = (schema.n, schema.min_sep, schema.effective_max_participations, method)
    cache = self.__dict__.get("_sensitivity_cache")
    if cache is None:
      cache = {}
      object.__setattr__(self, "_sensitivity_cache", cache)  # not a field: to_dict/eq ignore it
    if key not in cache:
      cache[key] = self._compute_sensitivity(schema, method)
    return cache[key]

  def prefix_sensitivities(
    self, min_seps: np.ndarray, max_participations: np.ndarray
  ) -> Optional[list[Optional[Sensitivity]]]:
    """`sensitivity` (method 'auto') after r rounds at each prefix's own (b_r, k_r), r = 1..n (None
    where k_r = 0), in one pass where the mechanism has one (TreeAgg); None where it has not, and
    the caller evaluates round by round (the audit's per-round ε curve, `fedmf.privacy.curve`)."""
    return None

  def checked_sensitivity(self, schema: ParticipationSchema, method: str = "auto") -> Sensitivity:
    """`sensitivity`, first refusing a horizon the strategy lacks and, unless it is cached, work
    beyond the resource limits (`fedmf.mf.resources`: --max-memory, --max-seconds)."""
    self.check_horizon(schema.n)
    cache = self.__dict__.get("_sensitivity_cache") or {}
    if (schema.n, schema.min_sep, schema.effective_max_participations, method) not in cache:
      resources.check(
        self.sensitivity_cost(schema, method),
        f"the sensitivity of {self.describe()} at n={schema.n}",
      )
    return self.sensitivity(schema, method)

  def _compute_sensitivity(self, schema: ParticipationSchema, method: str) -> Sensitivity:
    b, k = schema.min_sep, schema.effective_max_participations
    if method == "auto":
      exact = self.exact_sensitivity(schema)
      if exact is not None:
        return exact
      c = self.matrix(schema.n)
      if k == 1:
        return sens_lib.single_participation_sensitivity(c)
      return sens_lib.gram_upper_bound(c, b, k)
    if method == "upper-bound":
      return sens_lib.gram_upper_bound(self.matrix(schema.n), b, k)
    if method == "lower-bound":
      return sens_lib.toeplitz_lower_bound(self.matrix(schema.n), b, k)
    raise StrategyError(
      f"sensitivity method must be one of {', '.join(SENSITIVITY_METHODS)}, got {method!r}"
    )

  def exact_sensitivity(self, schema: ParticipationSchema) -> Optional[Sensitivity]:
    """The exact sensitivity where a theorem applies to this C and schema, else None.

    Toeplitz C with non-negative, non-increasing coefficients: BLT Thm 3.1. Banded C with b ≥ b̂:
    BandMF Thm 2 (columns b̂ apart are orthogonal). Assumptions are checked, never assumed.
    """
    n, b, k = schema.n, schema.min_sep, schema.effective_max_participations
    coefs = self.toeplitz_coefs(n)
    if coefs is not None:
      try:
        return sens_lib.toeplitz_sensitivity_exact(coefs, n, b, k)
      except AssumptionError:
        pass  # e.g. a BLT with Σω > 1: fall through to valid bounds.
    theta = self.banded_theta(n)
    if theta is not None and b >= theta.shape[0]:
      return sens_lib.banded_sensitivity_exact_from_norms(
        np.sum(theta * theta, axis=0), theta.shape[0], b, k
      )
    return None

  # --- error ----------------------------------------------------------------------------------

  def decoder_row_sq_norms(self, n: int, workload: Optional[np.ndarray] = None) -> np.ndarray:
    """Squared per-round errors ‖row_i(A C⁻¹)‖² (sensitivity excluded), float64.

    workload None is the prefix sum, for which the structured formulas apply: O(n·b̂) for Toeplitz
    C (BandMF-scaling Prop 3.1, BLT Prop 3.3), O(n²·b̂) time and O(n·b̂) memory for banded C
    (BandMF-scaling Alg. 3). Other workloads use dense triangular solves.
    """
    self.check_horizon(n)
    if workload is None:
      coefs = self.toeplitz_coefs(n)
      if coefs is not None:
        return np.asarray(toeplitz_math.decoder_row_sq_norms(coefs, n), dtype=np.float64)
      theta = self.banded_theta(n)
      if theta is not None:
        return np.asarray(banded_matrix.decoder_row_sq_norms(theta), dtype=np.float64)
      workload = workloads.prefix_sum(n)
    c = self.matrix(n)
    # B = A C⁻¹  <=>  Cᵀ Bᵀ = Aᵀ, with C lower triangular.
    b_mat = scipy.linalg.solve_triangular(c.T, np.asarray(workload, np.float64).T, lower=False).T
    return np.sum(b_mat * b_mat, axis=1)

  # --- noise ----------------------------------------------------------------------------------

  @abc.abstractmethod
  def noise_stream(self, n: Optional[int] = None):
    """The `fedmf.mf.streaming.NoiseStream` of round-by-round [C⁻¹ z]_t.

    `n` is the horizon where C depends on it (banded, dense); defaults to the strategy's own.
    Raises StrategyError for a strategy that cannot stream (e.g. the full-Honaker tree).
    """

  def check_streamable(self) -> None:
    """Raises StrategyError now if this strategy cannot drive training (checked at load)."""

  def noise_row_norms(self, n: int) -> np.ndarray:
    """‖row_t of C⁻¹‖ for t < n: the per-round noise std at σ = 1."""
    self.check_horizon(n)
    return streaming.row_norms(self.noise_stream(n), n)

  def per_round_noise_matrix(self, n: int) -> np.ndarray:
    """P with round t's unit-σ noise [P w]_t for w i.i.d. N(0, 1), dense: C⁻¹ (n×n) for a square
    C. The per-round releases' noise covariance is P Pᵀ (docs/empirical-privacy.md)."""
    self.check_horizon(n)
    return scipy.linalg.solve_triangular(self.matrix(n), np.eye(n), lower=True)

  # --- resources (fedmf.mf.resources): estimated before any work -----------------------------

  def matrix_shape(self, n: int) -> tuple[int, int]:
    """The shape of `matrix(n)` (the tree has more rows than columns)."""
    return (n, n)

  def dense_cost(
    self, n: int, what: str, arrays: float = 2.0, flops: float = 0.0
  ) -> resources.Cost:
    """A step holding `arrays` copies of the dense C at horizon n (and `flops` BLAS-3 work)."""
    rows, cols = self.matrix_shape(n)
    size = float(rows) * float(cols)
    return resources.Cost.of(
      what,
      resources.FLOAT * size * arrays,
      size / resources.VECTOR_RATE + flops / resources.DENSE_RATE,
    )

  def exact_sensitivity_cost(self, schema: ParticipationSchema) -> Optional[resources.Cost]:
    """The cost of `exact_sensitivity(schema)` when it returns a value (None when it returns None).

    Mechanisms with an exact route override it, mirroring their `exact_sensitivity`.
    """
    return None

  def sensitivity_cost(self, schema: ParticipationSchema, method: str = "auto") -> resources.Cost:
    """Estimated memory and time of `sensitivity(schema, method)`, computed before any work."""
    n, b, k = schema.n, schema.min_sep, schema.effective_max_participations
    if method == "auto":
      exact = self.exact_sensitivity_cost(schema)
      if exact is not None:
        return exact
      if k == 1:
        return self.dense_cost(n, "the dense C for its largest column norm", arrays=3.0)
    if method in ("auto", "upper-bound"):
      rows, _ = self.matrix_shape(n)
      nn = float(n) * float(n)
      return self.dense_cost(
        n,
        f"the dense {rows}×{n} C and |CᵀC| for the general sensitivity bound",
        arrays=1.0 + 5.0 * n / max(rows, 1),
        flops=2.0 * float(rows) * nn,
      ) + resources.Cost.of("VecSens over the rows of |CᵀC|", 0.0, nn * k / resources.VECTOR_RATE)
    if method == "lower-bound":
      return self.dense_cost(n, "the dense C for the Remark 3.2 lower bound", arrays=2.5)
    return resources.Cost()  # `sensitivity` refuses the method itself.

  def error_cost(self, n: int, dense_workload: bool = False) -> resources.Cost:
    """Estimated memory and time of `decoder_row_sq_norms(n, workload)`.

    The default is the dense route (triangular solves against the n×n workload); mechanisms with
    structured prefix-sum formulas override it for `dense_workload=False`.
    """
    nn = float(n) * float(n)
    return resources.Cost.of(
      f"the dense {n}×{n} workload, C and A C⁻¹ for the errors",
      resources.FLOAT * 8.0 * nn,
      8.0 * nn / resources.VECTOR_RATE + float(n) * nn / resources.DENSE_RATE,
    )

  def evaluation_cost(
    self, schema: ParticipationSchema, dense_workload: bool = False, method: str = "auto"
  ) -> resources.Cost:
    """Sensitivity and errors (`fedmf.mf.evaluation.evaluate`)."""
    return self.sensitivity_cost(schema, method) + self.error_cost(schema.n, dense_workload)

  @classmethod
  def optimize_cost(cls, schema: ParticipationSchema, options: "OptimizeOptions") -> resources.Cost:
    """Estimated memory of `optimize(schema, options)` (its time shows in a progress bar)."""
    return resources.Cost()

  # --- optimization ---------------------------------------------------------------------------

  # Whether `optimize` runs an iterative optimizer that reports progress (False: closed form).
  optimizer_reports_progress: ClassVar[bool] = True
  # The `OptimizeOptions` fields its optimizer reads beyond objective, max_iter, seed and progress
  # (a config key for any other mechanism has no effect, and is refused).
  optimizer_options: ClassVar[tuple[str, ...]] = ()
  # Whether its bands can be chosen under cyclic Poisson amplification (`--bands auto`,
  # fedmf.privacy.band_choice: BandMF §5 Thm 4).
  bands_chosen_under_amplification: ClassVar[bool] = False

  @classmethod
  def optimizer_iterations(cls, options: "OptimizeOptions") -> Optional[int]:
    """The optimizer's iteration count when known in advance (a progress bar's total), else None."""
    return None

  @classmethod
  def optimize(
    cls, schema: ParticipationSchema, options: OptimizeOptions = OptimizeOptions()
  ) -> tuple["Strategy", dict[str, Any]]:
    """A strategy of this mechanism optimized for `schema` (prefix sums), and an info dict."""
    raise StrategyError(f"the {cls.mechanism} mechanism has no optimizer")
