"""Canary directions: many orthonormal unit vectors in model space, never stored.

One concept: the directions u_c of the canary clients (docs/empirical-privacy.md) as a randomized
Hadamard transform, so that inserting every canary of a round and projecting a released aggregate
on every direction each cost one fast Walsh–Hadamard transform, O(d log d) whatever the number of
canaries, and no canary vector is ever held (Ailon & Chazelle 2009 use the same transform, random
signs then Hadamard, to spread a vector's energy evenly over all directions).

With d parameters (the model's tensors flattened in order) and N = 2^⌊log₂ d⌋:

    s_i = (a·i + b) mod d, i < N       N distinct coordinates (gcd(a, d) = 1), spread over the model
    u_c[s_i] = D_i · H[i, j_c] / √N    zero elsewhere

with D ∈ {±1}^N random signs, H the N×N Sylvester Hadamard matrix (symmetric, H H = N·I) and j_c
distinct columns. Hence ⟨u_c, u_c'⟩ = δ_cc' exactly, Σ_c a_c u_c = scatter(D ⊙ H a / √N) and
⟨x, u_c⟩ = [H (D ⊙ x_s)]_{j_c} / √N. Every choice (a, b, D, j) comes from the canary seed alone.
A real client's update g projects on u_c with variance about ‖g_s‖²/N ≤ ‖g‖²/N: the random signs
spread any structure of g evenly over the N directions.

The vectors are float64 where they are computed (projections, the sum of a round's canaries); the
sum is added to the float32 model-shaped sum it enters.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fedmf.errors import FedmfUserError

# The purpose tag of the canary seed's stream of directions (other canary draws use other tags).
DIRECTIONS_TAG = 0x0D12EC7
# The first log₂(_BLOCK) butterfly stages of the transform run as one product with H_BLOCK (BLAS):
# numpy's strided butterflies are slowest where the blocks are shortest.
_BLOCK = 64


def sylvester_hadamard(n: int) -> np.ndarray:
  """H_n with H[i, j] = (-1)^popcount(i & j) (n a power of two), float64."""
  i = np.arange(n)
  bits = np.bitwise_and.outer(i, i)
  parity = np.zeros_like(bits)
  while bits.any():
    parity ^= bits & 1
    bits >>= 1
  return 1.0 - 2.0 * parity


_H_BLOCKS: dict[int, np.ndarray] = {}


def fwht(x: np.ndarray) -> np.ndarray:
  """x ← H x in place (unnormalized; len(x) a power of two, float64, contiguous); returns x."""
  n = x.shape[0]
  if n & (n - 1) or x.ndim != 1 or not x.flags.c_contiguous:
    raise ValueError(f"fwht needs a contiguous vector of power-of-two length, got shape {x.shape}")
  block = min(n, _BLOCK)
  if block not in _H_BLOCKS:
    _H_BLOCKS[block] = sylvester_hadamard(block)
  rows = x.reshape(-1, block)
  rows[...] = rows @ _H_BLOCKS[block]  # H_n = H_{n/B} ⊗ H_B: the low bits' stages at once
  h = block
  tmp = np.empty(n // 2, x.dtype)
  while h < n:
    pairs = x.reshape(-1, 2, h)
    lo, hi, t = pairs[:, 0], pairs[:, 1], tmp.reshape(-1, h)
    np.subtract(lo, hi, out=t)
    lo += hi
    hi[...] = t
    h *= 2
  return x


def _coprime_step(dim: int, rng: np.random.Generator) -> int:
  """A step a in [1, dim) with gcd(a, dim) = 1, near dim·(golden ratio − 1) so that consecutive
  coordinates fall far apart (1 for dim = 1)."""
  if dim <= 2:
    return 1
  a = int(dim * 0.6180339887498949) + int(rng.integers(0, max(dim // 16, 1)))
  a = min(max(a, 1), dim - 1)
  while math.gcd(a, dim) != 1:
    a = a + 1 if a + 1 < dim else 1
  return a


class HadamardDirections:
  """`count` orthonormal directions over tensors of `shapes` (see the module docstring).

  `project(tensors)` gives ⟨x, u_c⟩ for every c (float64); `add(tensors, coefficients)` adds
  Σ_c a_c u_c to float tensors in place. Memory: the coordinates and signs of N = 2^⌊log₂ d⌋
  entries (9 bytes each) and a float64 work vector of N, whatever the count.
  """

  def __init__(self, shapes: Sequence[tuple[int, ...]], count: int, seed: int):
    self.shapes = [tuple(int(s) for s in shape) for shape in shapes]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
    self.dim = int(sum(sizes))
    self.count = int(count)
    if self.dim < 1:
      raise FedmfUserError("canaries need a model with at least one parameter")
    self.size = 1 << (self.dim.bit_length() - 1)  # N
    if not 1 <= self.count <= self.size:
      raise FedmfUserError(
        f"canaries.count + canaries.held_out = {self.count} orthonormal directions do not fit in "
        f"a model of {self.dim} parameters (at most {self.size}, the largest power of two <= d)"
      )
    rng = np.random.default_rng([int(seed), DIRECTIONS_TAG])
    self.step = step = _coprime_step(self.dim, rng)
    self.offset = offset = int(rng.integers(0, self.dim))
    self.signs = (1 - 2 * rng.integers(0, 2, self.size, dtype=np.int8)).astype(np.int8)
    self.columns = rng.choice(self.size, self.count, replace=False).astype(np.int64)  # shuffled
    coords = (np.arange(self.size, dtype=np.int64) * step + offset) % self.dim
    # Per tensor: the positions i < N whose coordinate lies in it, and the offsets inside it.
    bounds = np.cumsum([0, *sizes])
    index = np.int32 if self.dim < 2**31 else np.int64
    self._parts = []
    for k in range(len(sizes)):
      where = np.nonzero((coords >= bounds[k]) & (coords < bounds[k + 1]))[0]
      self._parts.append((where.astype(index), (coords[where] - bounds[k]).astype(index)))
    self._scale = 1.0 / math.sqrt(self.size)

  def _check(self, tensors: Sequence[np.ndarray]) -> None:
    if len(tensors) != len(self.shapes) or any(
      tuple(np.shape(t)) != s for t, s in zip(tensors, self.shapes)
    ):
      raise ValueError(
        f"canary directions are for tensors of shapes {self.shapes}, got "
        f"{[tuple(np.shape(t)) for t in tensors]}"
      )

  def project(self, tensors: Sequence[np.ndarray]) -> np.ndarray:
    """⟨x, u_c⟩ for every canary c (float64, length `count`)."""
    self._check(tensors)
    x = np.empty(self.size, np.float64)
    for t, (where, local) in zip(tensors, self._parts):
      x[where] = np.asarray(t).reshape(-1)[local]
    x *= self.signs
    fwht(x)
    out = x[self.columns]
    out *= self._scale
    return out

  def vector_sum(self, coefficients: np.ndarray) -> np.ndarray:
    """Σ_c a_c u_c restricted to the N coordinates s (float64, in the order of i)."""
    a = np.asarray(coefficients, np.float64)
    if a.shape != (self.count,):
      raise ValueError(f"expected {self.count} coefficients, got shape {a.shape}")
    v = np.zeros(self.size, np.float64)
    v[self.columns] = a
    fwht(v)
    v *= self.signs
    v *= self._scale
    return v

  def add(self, tensors: Sequence[np.ndarray], coefficients: np.ndarray) -> None:
    """tensors += Σ_c a_c u_c, in place (each tensor keeps its dtype)."""
    self._check(tensors)
    v = self.vector_sum(coefficients)
    for t, (where, local) in zip(tensors, self._parts):
      flat = t.reshape(-1)  # a view: the tensors are contiguous arrays
      if not np.shares_memory(flat, t):
        raise ValueError("canary insertion needs contiguous arrays")
      flat[local] += v[where].astype(t.dtype)

  def dense(self, c: int) -> list[np.ndarray]:
    """u_c as tensors (float64): for tests and small models only."""
    a = np.zeros(self.count)
    a[c] = 1.0
    v = self.vector_sum(a)
    out = []
    for shape, (where, local) in zip(self.shapes, self._parts):
      t = np.zeros(int(np.prod(shape, dtype=np.int64)))
      t[local] = v[where]
      out.append(t.reshape(shape))
    return out
