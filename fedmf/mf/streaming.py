"""Streaming noise: the numpy reference for round-by-round correlated noise of any strategy.

One concept: turn a loaded strategy into a stream that, fed round i's i.i.d. standard normal z_i
(any trailing shape d), returns round i's noise [C⁻¹ z]_i (BandMF Alg. 1, BLT Eq. 1/4), with state
of b̂·d (banded), nbuf·d (BLT) or d (DP-SGD) numbers. The tree has no C⁻¹; its stream returns the
decoder's per-round noise from node noises keyed by (height, index), see `fedmf.mf.tree`.

This is the reference the TFF aggregators are tested against. Notation: docs/architecture.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from fedmf.mf import strategies as st


class NoiseStream(Protocol):
  """next(z_i) -> [C⁻¹ z]_i for round i = 0, 1, 2, ..."""

  def next(self, z: np.ndarray) -> np.ndarray:
    ...


class _IdentityStream:

  def __init__(self, shape: Sequence[int]):
    self._shape = tuple(shape)

  def next(self, z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    if z.shape != self._shape:
      raise ValueError(f"expected z of shape {self._shape}, got {z.shape}")
    return z.copy()


class _BltStreamAdapter:

  def __init__(self, stream):
    self._stream = stream

  def next(self, z: np.ndarray) -> np.ndarray:
    return self._stream.step(z)


def inverse_noise_stream(strategy: Any, shape: Sequence[int] = (), n: Optional[int] = None) -> NoiseStream:
  """A stream of [C⁻¹ z]_i for DP-SGD, BLT, banded Toeplitz and BandMF.

  Banded strategies need a horizon: `n` defaults to the BandMF file's n and is required for a
  column-normalized banded Toeplitz (its C depends on n). BLT and DP-SGD have no horizon.
  """
  strategy = st.load_strategy(strategy)
  shape = tuple(int(s) for s in shape)
  if isinstance(strategy, st.DpSgd):
    return _IdentityStream(shape)
  if isinstance(strategy, st.Blt):
    from fedmf.mf import blt
    return _BltStreamAdapter(blt.blt_inverse_stream(strategy.buf_decay, strategy.output_scale, shape))
  if isinstance(strategy, (st.BandMF, st.BandToeplitz)):
    from fedmf.mf import banded
    if n is None:
      if isinstance(strategy, st.BandMF):
        n = strategy.n
      else:
        raise st.StrategyError("a banded Toeplitz noise stream needs the horizon n")
    return banded.BandedInverseStream(st.banded_theta(strategy, n), shape)
  raise st.StrategyError(f"{strategy.mechanism} has no C⁻¹ noise stream; use tree_noise_stream")


def tree_noise_stream(strategy: Any, shape: Sequence[int], node_noise: Callable[[int, int], np.ndarray]):
  """The tree decoder's per-round noise from node noises node_noise(height, index) (vanilla, online Honaker)."""
  strategy = st.load_strategy(strategy)
  if not isinstance(strategy, st.Tree):
    raise st.StrategyError(f"{strategy.mechanism} is not a tree strategy")
  from fedmf.mf import tree
  return tree.TreeNoiseStream(strategy.variant, tuple(shape), node_noise)


def noise_row_norms(strategy: Any, n: int) -> np.ndarray:
  """‖row_i of C⁻¹‖ for i < n (tree: the per-round decoder's row norms): per-round noise std at σ = 1."""
  strategy = st.load_strategy(strategy)
  st.check_horizon(strategy, n)
  if isinstance(strategy, st.Tree):
    from fedmf.mf import tree
    d = tree.per_round_decoder(n, strategy.variant)
    return np.linalg.norm(d, axis=1)
  c_inv_rows = np.zeros(n)
  # Feeding z_j = e_j (an n-vector per round) makes round i's output Σ_j (C⁻¹)_ij e_j = row i of C⁻¹.
  stream = inverse_noise_stream(strategy, (n,), n=n)
  eye = np.eye(n)
  for i in range(n):
    row = stream.next(eye[i])
    c_inv_rows[i] = np.linalg.norm(row)
  return c_inv_rows
