"""Streaming C⁻¹ z for a b̂-banded C (BandMF App. J Alg. 9) with O(b̂·d) state.

One definition for numpy and TensorFlow (see fedmf.mf.streaming); the band comes from
`fedmf.mf.banded_matrix` (theta[r, j] = C[j + r, j]).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from fedmf.mf import streaming
from fedmf.mf.banded_matrix import inverse_row_sq_norms

# ---------------------------------------------------------------------------------------------
# Streaming C⁻¹ z (one definition for numpy and TensorFlow, see fedmf.mf.streaming).


@dataclasses.dataclass(frozen=True, eq=False)
class BandedStream(streaming.NoiseStream):
  """Round t's [C⁻¹ z]_t for a b̂-banded lower-triangular C (BandMF App. J Alg. 9):

      y_t = (z_t - Σ_{r=1}^{b̂-1} C[t, t-r] y_{t-r}) / C[t, t].

  State: (t, per tensor the b̂ - 1 previous outputs, newest first); the ring shifts by tuple
  re-indexing, so a step allocates one model-sized output and copies nothing. C[t, t-r] comes from
  `table[t, r]` (any banded C over a horizon n: BandMF, a column-normalized banded Toeplitz, a
  dense C as b̂ = n), or from Toeplitz `coefs[r]` (no horizon). The Toeplitz form also carries the
  impulse response ĉ of C⁻¹ in float64, whose running sum of squares is ‖row_t of C⁻¹‖².

  Bit-exact everywhere (issue 11): the sum is a chain of subtractions, and the Toeplitz form
  multiplies by 1/coefs[0] rather than dividing by the constant, which TF's graph optimizer would
  rewrite as that multiplication in the TFF aggregator only. The table's C[t, t] is looked up by
  the round, so its division stays a division in every backend.
  """

  bands: int
  table: Optional[np.ndarray] = None  # (n, b̂): table[t, r] = C[t, t-r] (0 where t < r).
  coefs: Optional[tuple[float, ...]] = None  # (b̂,): C[t, t-r] = coefs[r].
  row_norm_table: Optional[np.ndarray] = None  # (n,): ‖row_t of C⁻¹‖ with `table`.
  rounds: Optional[int] = None  # A horizon for the Toeplitz form (its C⁻¹ grows with the rounds).

  @property
  def horizon(self) -> Optional[int]:  # type: ignore[override]
    return self.rounds if self.table is None else int(self.table.shape[0])

  @property
  def memory(self) -> int:
    return self.bands - 1

  def _ring(self, shape, dtype, ops) -> tuple:
    # A bands = 1 (diagonal) C keeps one unused scalar: TFF refuses empty state structures.
    if not self.memory:
      return (ops.zeros((), dtype),)
    return tuple(ops.zeros(shape, dtype) for _ in range(self.memory))

  def model_buffers(self, rounds: int) -> int:
    return max(self.bands - 1, 0)

  def init(self, specs, ops):
    state = (
      streaming.round_counter(ops),
      tuple(self._ring(spec.shape, spec.dtype, ops) for spec in specs),
    )
    if self.table is None:
      state += ((self._ring((), ops.float64, ops), ops.constant(0.0, ops.float64)),)
    return state

  def _coefficients(self, t, dtype, ops):
    if self.table is not None:
      return ops.gather(self.table, t, dtype)
    return self.coefs

  def _apply(self, z, ring, coef):
    acc = z
    for r in range(1, self.bands):  # Newest first: ring[r-1] = y_{t-r}.
      acc = acc - coef[r] * ring[r - 1]
    y = acc / coef[0] if self.table is not None else acc * (1.0 / coef[0])
    return y, (((y,) + tuple(ring[:-1])) if self.memory else tuple(ring))

  def step(self, state, z, ops):
    t, rings = state[0], state[1]
    draws = z(0)
    coefs = {}
    outputs, new_rings = [], []
    for zk, ring in zip(draws, rings):
      if zk.dtype not in coefs:
        coefs[zk.dtype] = self._coefficients(t, zk.dtype, ops)
      y, new_ring = self._apply(zk, ring, coefs[zk.dtype])
      outputs.append(y)
      new_rings.append(new_ring)
    new_state = (t + 1, tuple(new_rings))
    if self.table is None:
      imp_ring, cum = state[2]
      c_hat, imp_ring = self._apply(ops.is_first_round(t, ops.float64), imp_ring, self.coefs)
      new_state += ((imp_ring, cum + c_hat * c_hat),)
    return outputs, new_state

  def row_norm(self, state, ops):
    t = state[0]
    if self.table is not None:
      return ops.gather(self.row_norm_table, t, ops.float64)
    imp_ring, cum = state[2]
    c_hat, _ = self._apply(ops.is_first_round(t, ops.float64), imp_ring, self.coefs)
    return ops.sqrt(cum + c_hat * c_hat)

  def host_kernel(self, specs):
    return BandedKernel(self, specs)


class BandedKernel(streaming.HostKernel):
  """`BandedStream.step` in numpy with the b̂ - 1 previous outputs of a tensor in one
  [b̂ - 1, size] array with a rotating head: the newest output overwrites the oldest row, so the
  state is the buffers alone (no shift, no copy) and a round reads each row once, chunk by chunk,
  with the definition's operations in its order (tests/mf/test_host_kernels.py). For BandMF at
  b̂ = 342 on the 4M-parameter LSTM that is 5.3 GiB held, 1.0x the buffers (BandMF §3, Scaling
  BandMF §3.3 on the memory limit).
  """

  def __init__(self, stream: BandedStream, specs):
    super().__init__(stream, specs)
    self._rings = []
    for spec in self.specs:
      ring = np.empty((stream.memory, int(np.prod(spec.shape))), spec.dtype)
      ring.fill(0)  # Commits the pages now: the memory is held from round 0, not on first write.
      self._rings.append(ring)
    self._head = 0  # Row of y_{t-1}; y_{t-r} is row (head + r - 1) % (b̂ - 1).

  def _coefficients(self, dtype):
    stream = self.stream
    if stream.table is not None:
      return np.asarray(stream.table[self.round], dtype)
    return np.asarray(stream.coefs, dtype)

  def step(self, z):
    stream, memory = self.stream, self.stream.memory
    rows = [(self._head + r - 1) % memory for r in range(1, stream.bands)] if memory else []
    outputs = []
    for zk, ring, spec in zip(z(0), self._rings, self.specs):
      coef = self._coefficients(ring.dtype)
      inverse = ring.dtype.type(1.0 / float(stream.coefs[0])) if stream.table is None else None
      zk = np.asarray(zk, ring.dtype).reshape(-1)
      y = np.empty_like(zk)
      tmp = np.empty(min(streaming.CHUNK, zk.size), ring.dtype)
      for lo, hi in streaming.chunks(zk.size):
        acc, t = y[lo:hi], tmp[: hi - lo]
        acc[...] = zk[lo:hi]
        for r, row in enumerate(rows, start=1):
          np.subtract(acc, np.multiply(coef[r], ring[row, lo:hi], out=t), out=acc)
        if inverse is None:
          np.divide(acc, coef[0], out=acc)
        else:
          np.multiply(acc, inverse, out=acc)
        if memory:
          ring[rows[-1], lo:hi] = acc  # The oldest row, read for the last time just above.
      outputs.append(y.reshape(spec.shape))
    if memory:
      self._head = rows[-1]
    self._advance_scalars()
    return outputs

  def buffers(self):
    return list(self._rings)

  def tensor_state(self, copy):
    memory = self.stream.memory
    wrap = np.array if copy else np.asarray
    out = []
    for ring, spec in zip(self._rings, self.specs):
      if not memory:
        out.append((np.zeros((), spec.dtype),))
        continue
      out.append(
        tuple(wrap(ring[(self._head + r) % memory]).reshape(spec.shape) for r in range(memory))
      )
    return tuple(out)

  def restore_tensors(self, tensors):
    memory = self.stream.memory
    for ring, value, spec in zip(self._rings, tensors, self.specs):
      if len(value) != max(memory, 1):
        raise ValueError(f'noise state has {len(value)} previous outputs, expected {memory}')
      for r in range(memory):
        ring[r] = streaming.check_shape(value[r], spec.shape, 'previous output').reshape(-1)
    self._head = 0


def banded_stream(theta: np.ndarray) -> BandedStream:
  """The C⁻¹ stream of the banded C given by theta (b̂ × n) over its horizon n."""
  theta = np.asarray(theta, dtype=np.float64)
  bands, n = theta.shape
  if np.any(theta[0] == 0.0):
    raise ValueError("banded C has a zero diagonal entry and is not invertible")
  table = np.zeros((n, bands))
  for r in range(bands):  # table[t, r] = C[t, t-r] = theta[r, t-r].
    table[r:, r] = theta[r, : n - r]
  return BandedStream(bands=bands, table=table, row_norm_table=np.sqrt(inverse_row_sq_norms(theta)))


def toeplitz_stream(coefs: Sequence[float], rounds: Optional[int] = None) -> BandedStream:
  """The C⁻¹ stream of the banded Toeplitz C = LtToep(coefs), with no horizon unless `rounds`."""
  coefs = tuple(float(c) for c in coefs)
  if coefs[0] == 0.0:
    raise ValueError("the diagonal coefficient coefs[0] must be non-zero")
  return BandedStream(bands=len(coefs), coefs=coefs, rounds=rounds)
