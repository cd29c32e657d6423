"""Random, well-conditioned strategy dicts for tests (the loader's JSON form)."""

from __future__ import annotations

import numpy as np


def random_bandmf(n: int, bands: int, seed: int = 0) -> dict:
  """A BandMF with `bands` bands and columns drawn from U(0.2, 1)."""
  rng = np.random.default_rng(seed)
  cols = [list(rng.uniform(0.2, 1.0, min(bands, n - j))) for j in range(n)]
  return {'mechanism': 'bandmf', 'n': n, 'bands': bands, 'columns': cols}


def random_dense(n: int, seed: int = 1) -> dict:
  """A dense lower-triangular C with a diagonal in [0.7, 1.3]."""
  rng = np.random.default_rng(seed)
  c = np.tril(rng.uniform(-0.3, 0.5, (n, n)))
  c[np.diag_indices(n)] = rng.uniform(0.7, 1.3, n)
  return {'mechanism': 'dense', 'matrix': c.tolist()}
