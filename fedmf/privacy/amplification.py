"""Privacy amplification by b̂-cyclic Poisson sampling for banded strategies (amplified BandMF).

The sampling (BandMF §5, Alg. 6; "papers" in docs/references.md): the N examples (or devices) are
split into P disjoint partitions of N/P; round i uses only partition i mod P, each of its members
joining independently with probability q = P·B/N, so the expected batch is B. If C is lower
triangular and at most P-banded, BandMF Thm 4 reduces the release C x + σ z to ⌈n/P⌉ adaptively
composed queries on one partition, each a Poisson-subsampled Gaussian with noise multiplier
σ/Δ, Δ = max_i ‖C e_i‖ (Cor. F.1). Its dp_accounting event is

    SelfComposed(PoissonSampled(q, Gaussian(σ/Δ)), ⌈n/P⌉)

(App. F Example F.1 prints n and m swapped; docs/mechanisms.md gives the corrected event,
`fedmf.privacy.events.amplified_bandmf_event`). DP-SGD with Poisson sampling is the case P = 1,
C = I. With q = 1 nothing is sampled: the event is ⌈n/P⌉ composed Gaussians, i.e. one Gaussian with
μ = √⌈n/P⌉·Δ/σ (Gaussian DP composition, Dong, Roth & Su 2022, Cor. 3.3), which is exactly the
non-amplified accounting of the same (k, b) = (⌈n/P⌉, P) schema with sens = √k·Δ (BandMF Thm 2),
and is accounted by the same accountant.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.mf.strategies import load_strategy
from fedmf.privacy import accounting
from fedmf.privacy import events
from fedmf.privacy import gaussian_curve


# The smallest q accounted: dp_accounting's PLD of a Poisson-subsampled Gaussian fails below
# about 1e-16 ("deltas are not in non-increasing order": log(1 + q) at float64 resolution),
# measured at σ in [0.3, 5]; 1e-12 leaves a margin. ε(q) grows with q, so accounting a q at
# this floor is a valid upper bound for any smaller one.
MIN_SAMPLING_PROBABILITY = 1e-12


@dataclasses.dataclass(frozen=True)
class CyclicPoissonSampling:
  """P-cyclic Poisson sampling over `dataset_size` examples with expected batch `batch_size`."""

  dataset_size: int
  batch_size: float
  partitions: int

  def __post_init__(self):
    for name in ("dataset_size", "partitions"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise FedmfUserError(f"{name.replace('_', ' ')} must be an integer >= 1, got {value!r}")
    b = self.batch_size
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not (math.isfinite(b) and b > 0):
      raise FedmfUserError(f"batch size must be a number > 0, got {b!r}")
    if float(b) > self.dataset_size * (1.0 + 1e-12):
      raise FedmfUserError(
        f"the batch size {b:g} exceeds the dataset size {self.dataset_size}: a round samples at "
        "most every example once (lower the batch size or raise the dataset size)"
      )
    if self.partitions * float(b) > self.dataset_size * (1.0 + 1e-12):
      raise FedmfUserError(
        f"{self.partitions} partitions of {self.dataset_size} examples hold "
        f"{self.dataset_size / self.partitions:.6g} each, fewer than the batch size {b:g}: "
        f"use at most {int(self.dataset_size // b)} partitions (dataset size / batch size)"
      )

    q = self.partitions * float(b) / self.dataset_size
    if q < MIN_SAMPLING_PROBABILITY:
      raise FedmfUserError(
        f"the sampling probability q = partitions x batch size / dataset size = {q:.3g} is below "
        f"{MIN_SAMPLING_PROBABILITY:g}, where the PLD accountant's float64 arithmetic breaks down "
        "(1 + q rounds to 1); account a smaller dataset size: a larger q gives a valid upper "
        "bound on epsilon (epsilon only shrinks with q)"
      )

  @classmethod
  def from_probability(
    cls, dataset_size: int, partitions: int, sampling_probability: float
  ) -> "CyclicPoissonSampling":
    """The sampling that joins each member of the round's partition with probability q."""
    q = float(sampling_probability)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
      raise FedmfUserError(f"sampling probability must be in (0, 1], got {sampling_probability!r}")
    return cls(int(dataset_size), q * dataset_size / partitions, int(partitions))

  @property
  def sampling_probability(self) -> float:
    """q = P·B/N (BandMF §5: partitions of N/P, expected batch B); exactly 1 within 1e-12, so
    that a full partition is accounted as unsampled."""
    q = self.partitions * float(self.batch_size) / self.dataset_size
    return 1.0 if abs(q - 1.0) <= 1e-12 else q

  def steps(self, n: int) -> int:
    """⌈n/P⌉: the queries one example's partition answers over n rounds (BandMF Thm 4)."""
    return -(-int(n) // self.partitions)

  def describe(self, n: int) -> str:
    return (
      f"{self.partitions}-cyclic Poisson sampling: {self.dataset_size} examples in "
      f"{self.partitions} partitions, expected batch {self.batch_size:g}, "
      f"q = {self.sampling_probability:.6g}, {self.steps(n)} queries per example over {n} rounds"
    )


@dataclasses.dataclass(frozen=True)
class AmplifiedAccounting:
  """ε at δ of a banded strategy under cyclic Poisson sampling, and how it was computed."""

  sampling: CyclicPoissonSampling
  n: int
  bands: int
  max_column_norm: float
  noise_multiplier: float
  epsilon: float
  delta: float
  accountant: str

  def to_dict(self) -> dict[str, Any]:
    return {
      "amplified": True,
      "dataset_size": self.sampling.dataset_size,
      "batch_size": self.sampling.batch_size,
      "partitions": self.sampling.partitions,
      "sampling_probability": self.sampling.sampling_probability,
      "steps": self.sampling.steps(self.n),
      "bands": self.bands,
      "max_column_norm": self.max_column_norm,
      "noise_multiplier": self.noise_multiplier,
      "epsilon": self.epsilon,
      "delta": self.delta,
      "accountant": self.accountant,
    }


def band_and_column_norm(strategy: Any, n: int) -> tuple[int, float]:
  """(b̂, Δ): the band count of C at horizon n and its largest column norm (BandMF Thm 4).

  C must have a `banded_theta` (BandMF, banded Toeplitz) or Toeplitz coefficients (DP-SGD's C = I
  has one band; a BLT has n). Anything else (the tree) is refused with one line.
  """
  theta = strategy.banded_theta(n)
  if theta is not None:
    theta = np.asarray(theta, dtype=np.float64)
    nonzero = np.flatnonzero(np.any(theta != 0.0, axis=1))
    bands = int(nonzero[-1]) + 1 if nonzero.size else 1
    return bands, float(np.sqrt(np.max(np.sum(theta * theta, axis=0))))
  coefs = strategy.toeplitz_coefs(n)
  if coefs is not None:
    coefs = np.asarray(coefs, dtype=np.float64)[:n]
    nonzero = np.flatnonzero(coefs)
    bands = int(nonzero[-1]) + 1 if nonzero.size else 1
    return bands, float(np.sqrt(np.sum(coefs * coefs)))  # Column 0 is the longest.
  raise FedmfUserError(
    f"amplification by cyclic Poisson sampling (BandMF Thm 4) needs a banded strategy; "
    f"{strategy.describe()} is not banded at n={n}"
  )


def _check_bands(bands: int, sampling: CyclicPoissonSampling, strategy: Any) -> None:
  if bands > sampling.partitions:
    raise FedmfUserError(
      f"{strategy.describe()} has {bands} bands, more than the {sampling.partitions} partitions "
      f"of the sampling: BandMF Thm 4 needs bands <= partitions"
    )


def epsilon_for(
  noise_multiplier: float,
  n: int,
  sampling: CyclicPoissonSampling,
  delta: float,
  max_column_norm: float = 1.0,
  accountant: accounting.Accountant = accounting.AMPLIFIED_ACCOUNTANT,
  pld_interval: float = accounting.PLD_VALUE_DISCRETIZATION,
) -> tuple[float, str]:
  """(ε, accountant used) of the amplified event; q = 1 is one Gaussian (module docstring).

  `pld_interval` is the PLD value discretization: any interval gives a valid upper bound
  (dp_accounting's pessimistic PLD); 1e-3 is about 10× faster than the default 1e-4 and within
  1e-3 in ε where measured (docs/mechanisms.md, Choosing b̂).
  """
  sigma = events.validate_noise_multiplier(noise_multiplier)
  q = sampling.sampling_probability
  if q == 1.0:
    mu = math.sqrt(sampling.steps(n)) * max_column_norm / sigma
    return accounting.gaussian_epsilon_with(mu, gaussian_curve.validate_delta(delta), accountant), (
      accountant
    )
  event = events.amplified_bandmf_event(sigma, n, sampling.partitions, q, max_column_norm)
  return accounting.pld_epsilon(event, delta, pld_interval), "pld"


def unamplified_noise(
  target_epsilon: float, n: int, sampling: CyclicPoissonSampling, max_column_norm: float, delta
) -> float:
  """σ of the same schema without sampling (q = 1, exact curve): an upper bound on the amplified
  σ, since Poisson subsampling never increases ε."""
  mu = gaussian_curve.gaussian_mu_for_epsilon(target_epsilon, delta)
  return math.sqrt(sampling.steps(n)) * max_column_norm / mu


def noise_for(
  target_epsilon: float,
  n: int,
  sampling: CyclicPoissonSampling,
  delta: float,
  max_column_norm: float = 1.0,
  accountant: accounting.Accountant = accounting.AMPLIFIED_ACCOUNTANT,
  rtol: float = 1e-4,
  pld_interval: float = accounting.PLD_VALUE_DISCRETIZATION,
  upper: Optional[float] = None,
) -> float:
  """The smallest σ (to rtol, conservative side) whose amplified ε is at most the target: the one
  calibrator (`accounting.calibrate_sigma`) on `epsilon_for`, for training and `--bands auto` alike.

  `upper`: a σ known to reach the target (default: the unamplified σ, slightly raised).
  """
  delta = gaussian_curve.validate_delta(delta)

  def epsilon_of(sigma: float) -> float:
    return epsilon_for(sigma, n, sampling, delta, max_column_norm, accountant, pld_interval)[0]

  exact = unamplified_noise(target_epsilon, n, sampling, max_column_norm, delta)
  if sampling.sampling_probability == 1.0:  # One Gaussian: its exact curve, then the accountant.
    return accounting.calibrate_from_exact(epsilon_of, target_epsilon, exact, rtol)
  return accounting.calibrate_sigma(
    epsilon_of, target_epsilon, exact * 1.01 if upper is None else upper, rtol=rtol
  )


def account_amplified(
  strategy: Any,
  n: int,
  sampling: CyclicPoissonSampling,
  delta: float,
  *,
  noise_multiplier: Optional[float] = None,
  target_epsilon: Optional[float] = None,
  accountant: accounting.Accountant = accounting.AMPLIFIED_ACCOUNTANT,
) -> AmplifiedAccounting:
  """ε for a given σ, or the σ reaching `target_epsilon`, of `strategy` over n rounds."""
  if (noise_multiplier is None) == (target_epsilon is None):
    raise ValueError("give exactly one of noise_multiplier and target_epsilon")
  strategy = load_strategy(strategy)
  strategy.check_horizon(n)
  delta = gaussian_curve.validate_delta(delta)
  bands, norm = band_and_column_norm(strategy, n)
  _check_bands(bands, sampling, strategy)
  if target_epsilon is not None:
    noise_multiplier = noise_for(target_epsilon, n, sampling, delta, norm, accountant)
  epsilon, used = epsilon_for(noise_multiplier, n, sampling, delta, norm, accountant)
  return AmplifiedAccounting(
    sampling=sampling,
    n=int(n),
    bands=bands,
    max_column_norm=norm,
    noise_multiplier=float(noise_multiplier),
    epsilon=float(epsilon),
    delta=delta,
    accountant=used,
  )
