"""Choosing the number of bands b̂ of BandMF under amplification (BandMF §5 "Optimizing the number
of bands", App. G Table 3).

With b̂-cyclic Poisson sampling (`fedmf.privacy.amplification`) σ depends on b̂: fewer bands mean
more partitions of fewer examples each, a smaller sampling probability q = b̂·B/N and fewer
composed queries ⌈n/b̂⌉, so a smaller σ for the same ε; more bands give a better factorization.
BandMF §5 minimizes the expected total squared error

    σ_ε,δ(b̂)² · ‖A C_b̂⁻¹‖²_F        (C_b̂ column-normalized, so Δ = 1 in Thm 4)

over b̂ ∈ {1, 2, 4, …} up to the cap min(n, b, ⌊N/B⌋), plus the cap itself: at b̂ = N/B a
partition is one batch (q = 1) and more bands bring no amplification (BandMF §5). Each candidate
C_b̂ is optimized once for the prefix workload (cached, `fedmf.mf.strategy_cache`) and σ calibrated
with PLD; the report is RMSE = σ·‖A C⁻¹‖_F/√n per candidate.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from fedmf.errors import FedmfUserError
from fedmf.mf import strategy_cache
from fedmf.mf.lbfgs import ProgressFn
from fedmf.mf.schema import ParticipationSchema
from fedmf.mf.strategy import OptimizeOptions
from fedmf.privacy import amplification


@dataclasses.dataclass(frozen=True)
class BandCandidate:
  """One b̂: its prefix-sum loss ‖A C⁻¹‖²_F, calibrated σ and RMSE under amplification."""

  bands: int
  loss_sq: float
  noise_multiplier: float
  rmse: float
  sampling_probability: float
  steps: int

  def to_dict(self) -> dict[str, Any]:
    return {"bands": self.bands, "rmse": self.rmse, "noise_multiplier": self.noise_multiplier}


def candidate_bands(
  n: int, min_sep: Optional[int], dataset_size: int, batch_size: float
) -> list[int]:
  """Powers of two below the cap, and the cap = min(n, b, ⌊N/B⌋) (BandMF §5)."""
  cap = min(
    int(n), int(min_sep) if min_sep is not None else int(n), int(dataset_size // batch_size)
  )
  if cap < 1:
    raise FedmfUserError(
      f"no band count fits: the dataset size {dataset_size} is below the batch size {batch_size:g}"
    )
  candidates = [1 << p for p in range(int(math.log2(cap)) + 1) if (1 << p) < cap] + [cap]
  for bands in candidates:  # Each candidate's sampling is checked now, before any optimization.
    amplification.CyclicPoissonSampling(int(dataset_size), batch_size, bands)
  return candidates


def pld_interval_for(target_epsilon: float) -> float:
  """PLD discretization for calibrating at ε: 1e-3 (10× faster than 1e-4, measured within 0.05%
  at ε ≥ 1), finer at small ε where the grid's pessimism is a larger share of ε (at ε = 1/32 and
  1024 compositions, 1e-3 overstates ε by 70%; ε·1e-3 by < 0.1%)."""
  return min(1e-3, target_epsilon * 1e-3)


def evaluate_candidates(
  n: int,
  loss_sq_by_bands: Mapping[int, float],
  target_epsilon: float,
  delta: float,
  dataset_size: int,
  batch_size: float,
  *,
  rtol: float = 1e-4,
  progress: ProgressFn = None,
) -> list[BandCandidate]:
  """σ(b̂) for the target ε and the RMSE σ·‖A C_b̂⁻¹‖_F/√n of each candidate b̂."""
  interval = pld_interval_for(target_epsilon)
  out = []
  for bands in sorted(loss_sq_by_bands):
    sampling = amplification.CyclicPoissonSampling(dataset_size, batch_size, bands)
    sigma = amplification.noise_for(
      target_epsilon, n, sampling, delta, rtol=rtol, pld_interval=interval
    )
    loss_sq = float(loss_sq_by_bands[bands])
    candidate = BandCandidate(
      bands=bands,
      loss_sq=loss_sq,
      noise_multiplier=sigma,
      rmse=sigma * math.sqrt(loss_sq / n),
      sampling_probability=sampling.sampling_probability,
      steps=sampling.steps(n),
    )
    out.append(candidate)
    if progress is not None:
      progress({"stage": "calibrate", "bands": bands, "rmse": candidate.rmse})
  return out


def best(candidates: Sequence[BandCandidate]) -> BandCandidate:
  """The candidate of least RMSE (ties: fewer bands, less memory)."""
  return min(candidates, key=lambda c: (c.rmse, c.bands))


def optimize_candidates(
  n: int,
  bands: Sequence[int],
  max_participations: Optional[int] = None,
  *,
  cache: Optional[Path] = None,
  max_iter: Optional[int] = None,
  progress: ProgressFn = None,
) -> dict[int, Any]:
  """{b̂: the BandMF strategy optimized for n rounds and b̂ bands}, cached on disk.

  Each is optimized under b = b̂ (the schema the amplified run declares, k = ⌈n/b̂⌉ unless given):
  the column-normalized optimum does not depend on b or k (BandMF §4, sens² = k for every b̂ ≤ b).
  """
  out = {}
  for b in bands:
    schema = ParticipationSchema(n, b, max_participations)
    options = OptimizeOptions(max_iter=max_iter, progress=progress)  # b̂ = b, as the program keys it
    out[b] = strategy_cache.optimize_cached("bandmf", schema, options, cache)
  return out


def loss_sq_of(strategy: Any, n: int) -> float:
  """‖A C⁻¹‖²_F of the prefix workload for the strategy as used (column-normalized)."""
  return float(sum(strategy.decoder_row_sq_norms(n)))
