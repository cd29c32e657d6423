"""Privacy events: what a mechanism releases, as dp_accounting `DpEvent`s (no privacy math here).

One concept, after dp_accounting: events describe mechanisms; accountants (`fedmf.privacy.accounting`)
compute their privacy. Every correlated-noise mechanism of fedmf reduces to Gaussian events:

* a matrix mechanism with noise multiplier σ and sensitivity s under its participation schema is
  one Gaussian mechanism with noise multiplier σ/s (BandMF §2; the mechanisms' Accounting section);
* amplified BandMF (BandMF §5 Thm 4; Scaling BandMF Prop 2.1) and DP-SGD with Poisson sampling are
  self-composed Poisson-subsampled Gaussian steps.

dp_accounting is imported lazily: it pulls in a few heavy modules.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

from fedmf.errors import FedmfUserError


def validate_noise_multiplier(noise_multiplier: float) -> float:
  # A string or a bool is a caller's mistake (a config read as text), not a number to coerce.
  if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, numbers.Real):
    raise FedmfUserError(
      f"noise multiplier must be a number, got {type(noise_multiplier).__name__} "
      f"{str(noise_multiplier)[:40]!r}"
    )
  sigma = float(noise_multiplier)
  if not (math.isfinite(sigma) and sigma > 0.0):
    raise FedmfUserError(f"noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
  return sigma


def gaussian_event(effective_noise_multiplier: float) -> Any:
  """One Gaussian release with noise multiplier σ/s (sensitivity 1)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  return dp_accounting.GaussianDpEvent(effective_noise_multiplier)


def matrix_mechanism_event(sensitivity: float, noise_multiplier: float) -> Any:
  """The matrix mechanism C x + σ z with sensitivity s: `GaussianDpEvent(σ/s)`."""
  return gaussian_event(validate_noise_multiplier(noise_multiplier) / float(sensitivity))


def poisson_gaussian_event(noise_multiplier: float, sampling_probability: float, steps: int) -> Any:
  """`SelfComposed(PoissonSampled(q, Gaussian(σ)), steps)`; q = 1 means no sampling."""
  import dp_accounting  # pylint: disable=g-import-not-at-top

  sigma = validate_noise_multiplier(noise_multiplier)
  q = float(sampling_probability)
  if not 0.0 < q <= 1.0:
    raise FedmfUserError(f"sampling probability must be in (0, 1], got {sampling_probability!r}")
  if isinstance(steps, bool) or int(steps) != steps or steps < 1:
    raise FedmfUserError(f"steps must be an integer >= 1, got {steps!r}")
  event = dp_accounting.GaussianDpEvent(sigma)
  if q < 1.0:
    event = dp_accounting.PoissonSampledDpEvent(q, event)
  return dp_accounting.SelfComposedDpEvent(event, int(steps))


def amplified_bandmf_event(
  noise_multiplier: float,
  n: int,
  bands: int,
  sampling_probability: float,
  max_column_norm: float = 1.0,
) -> Any:
  """Amplified BandMF (BandMF §5 Thm 4; Scaling BandMF Prop 2.1).

  Round i Poisson-samples group i mod b̂ with probability q = b̂·B/m; the mechanism is accounted as
  ⌈n/b̂⌉ Poisson-subsampled Gaussian steps with σ_eff = σ / max column norm of C. (BandMF App. F
  Example F.1 prints n and m swapped; this is the corrected event.)
  """
  if isinstance(bands, bool) or int(bands) != bands or bands < 1:
    raise FedmfUserError(f"bands must be an integer >= 1, got {bands!r}")
  if not (math.isfinite(max_column_norm) and max_column_norm > 0):
    raise FedmfUserError(f"max column norm must be > 0, got {max_column_norm!r}")
  steps = -(-int(n) // int(bands))
  return poisson_gaussian_event(
    validate_noise_multiplier(noise_multiplier) / max_column_norm, sampling_probability, steps
  )


def bandmf_sampling_probability(batch_size: float, dataset_size: int, bands: int) -> float:
  """q = b̂·B/m: each of the b̂ groups (m/b̂ examples) is sampled with expected batch B."""
  q = float(bands) * float(batch_size) / float(dataset_size)
  if not 0 < q <= 1:
    raise FedmfUserError(f"sampling probability b̂·B/m = {q} is not in (0, 1]")
  return q


def dpsgd_event(
  noise_multiplier: float, steps: int, sampling_probability: Optional[float] = None
) -> Any:
  """DP-SGD (C = I): `steps` Gaussian steps, optionally Poisson-subsampled with rate q."""
  return poisson_gaussian_event(
    noise_multiplier, 1.0 if sampling_probability is None else sampling_probability, steps
  )
