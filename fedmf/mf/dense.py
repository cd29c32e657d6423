"""A general lower-triangular strategy C given entry by entry (e.g. from another optimizer).

One concept: the dense matrix mechanism of the BandMF paper's §2 with no structure assumed. C is
used as given (no normalization). A file built for n serves any n' ≤ n through its leading
n'×n' block. Its noise stream is the banded stream with b̂ = n, so it keeps n - 1 model-sized
buffers: meant for small models and for checking other mechanisms, not for large-scale training.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping, Optional

import numpy as np

from fedmf.mf import banded_matrix
from fedmf.mf import banded_stream
from fedmf.mf import checks
from fedmf.mf import strategy as strategy_lib


@dataclasses.dataclass(frozen=True, eq=False)
class Dense(strategy_lib.Strategy):
  """C as an explicit n×n lower-triangular matrix. JSON: {"mechanism": "dense", "matrix": [[...]]}."""

  c: np.ndarray
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mechanism: ClassVar[str] = "dense"
  conditioning_field: ClassVar[str] = "strategy field 'matrix'"

  @classmethod
  def from_dict(cls, obj):
    if "matrix" not in obj:
      raise checks.StrategyError("strategy field 'matrix' is missing")
    c = checks.float_array(obj["matrix"], "strategy field 'matrix'", 2)
    if c.shape[0] != c.shape[1] or c.shape[0] == 0:
      raise checks.StrategyError(
        f"strategy field 'matrix' must be a non-empty square matrix, got shape {c.shape}"
      )
    checks.check_lower_triangular(c, "strategy field 'matrix'")
    strategy = cls(checks.readonly(c), metadata=checks.extra_fields(obj, ("matrix",)))
    strategy.check_conditioning()
    return strategy

  def fields(self):
    return {"matrix": self.c.tolist()}

  def describe(self) -> str:
    return f"dense (n={self.horizon})"

  @property
  def horizon(self) -> int:
    return int(self.c.shape[0])

  def matrix(self, n: int) -> np.ndarray:
    self.check_horizon(n)
    return np.array(self.c[:n, :n])

  def conditioning(self, n: Optional[int] = None) -> strategy_lib.Conditioning:
    """Exact over the horizon (the leading n'×n' block of a smaller n' has fewer rows of C⁻¹ and
    shorter columns, so it is never worse), by the triangular inverse (LAPACK dtrtri)."""
    n = self.horizon if n is None else n
    c = self.c[:n, :n]
    column_norm = float(np.max(np.linalg.norm(c, axis=0)))
    gain = float(
      np.sqrt(np.max(banded_matrix.inverse_row_sq_norms(banded_matrix.theta_from_matrix(c, n))))
    )
    return strategy_lib.Conditioning(column_norm, gain, float(np.max(np.abs(np.diag(c)))), n)

  def noise_stream(self, n: Optional[int] = None) -> banded_stream.BandedStream:
    n = self.horizon if n is None else n
    self.check_horizon(n)
    return banded_stream.banded_stream(banded_matrix.theta_from_matrix(self.c[:n, :n], n))
