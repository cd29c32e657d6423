"""DP-SGD / DP-FedAvg as a matrix mechanism: C = I, independent noise every round.

One concept: the baseline strategy. Under b-min-separation with at most k participations every
participation adds an orthogonal unit vector, so the sensitivity is exactly √k_eff (BandMF §2).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import checks
from fedmf.mf import resources
from fedmf.mf import streaming
from fedmf.mf import strategy as strategy_lib
from fedmf.mf.sensitivity import Sensitivity


@dataclasses.dataclass(frozen=True, eq=False)
class DpSgd(strategy_lib.Strategy):
  """C = I. JSON: {"mechanism": "dpsgd"}."""

  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "dpsgd"
  optimizer_reports_progress: ClassVar[bool] = False  # closed form

  @classmethod
  def from_dict(cls, obj):
    return cls(metadata=checks.extra_fields(obj, ()))

  def fields(self):
    return {}

  @classmethod
  def default_poisson_groups(cls, options):
    return 1  # Poisson sampling of the whole population every round.

  def poisson_amplification(self, rounds, groups):
    return strategy_lib.AMPLIFIED_DPSGD if groups == 1 else None

  def toeplitz_coefs(self, n: int) -> np.ndarray:
    self.check_horizon(n)
    coefs = np.zeros(n)
    coefs[0] = 1.0
    return coefs

  def exact_sensitivity(self, schema) -> Sensitivity:
    # C = I: every participation adds an orthogonal unit vector.
    return Sensitivity(math.sqrt(schema.effective_max_participations), "exact", "identity")

  def exact_sensitivity_cost(self, schema) -> resources.Cost:
    return resources.Cost()

  def error_cost(self, n, dense_workload=False):
    if dense_workload:
      return super().error_cost(n, True)
    return resources.Cost.of(
      "the per-round errors", 8.0 * resources.FLOAT * n, 8.0 * n / resources.VECTOR_RATE
    )

  def noise_stream(self, n: Optional[int] = None) -> streaming.IdentityStream:
    return streaming.IdentityStream()

  @classmethod
  def optimize_cost(cls, schema, options=strategy_lib.OptimizeOptions()):
    return cls().evaluation_cost(schema)  # Nothing to optimize.

  @classmethod
  def optimize(cls, schema, options=strategy_lib.OptimizeOptions()):
    return cls(), {"objective": options.objective or "rms"}
