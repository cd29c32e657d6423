"""Streaming noise: one interface for every mechanism's round-by-round correlated noise.

One concept: a `NoiseStream` turns round t's standard normal draws into round t's noise [C⁻¹ z]_t
(BandMF Alg. 1, BLT Eq. 1/4; for the tree, the decoder's per-round noise), with its state as
explicit data (after jax_privacy's streaming matrices):

    state = stream.init(specs, ops)
    noise, state = stream.step(state, z, ops)     # one call per round t = 0, 1, 2, ...
    std = stream.row_norm(state, ops)             # ‖row_t of C⁻¹‖, before the step of round t

* `specs` lists the tensors the noise is for (anything with `.shape` and `.dtype`, e.g. a
  `tf.TensorSpec` or `Spec`); the noise is one array per spec.
* `z(j)` returns round t's j-th independent standard normal draw, one array per spec. The linear
  mechanisms use draw 0 only; the tree uses draws 0..h for the h + 1 nodes that round t completes.
  A seeded implementation keys draw j of round t by (seed, t, j), so noise is a pure function of
  (seed, state) and a restored state continues bit for bit.
* `ops` is the array backend. `NUMPY` (here) runs the stream in numpy, the float64 reference;
  `fedmf.tff.noise.TF_OPS` runs the very same definition in TensorFlow, for the aggregator and the
  training program. Each mechanism's stream is written once, against `ops`.
* The state is a tuple whose first entry is the round counter t and whose second is per tensor
  (one entry per spec); the rest (if any) is a small float64 part for `row_norm`.
* `stream.host_kernel(specs)` runs the same stream on the host in numpy with its model-sized
  buffers updated in place (`HostKernel`; issue 11): the training program's fast path. A
  mechanism may give an in-place kernel of its own; it must equal `step` with `NUMPY` bit for bit
  (tests/mf/test_host_kernels.py), and the default runs `step` itself.

Notation: docs/architecture.md (n rounds, 0-based; C strategy; b̂ bands; θ, ω BLT decays and scales).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from fedmf.mf.checks import StrategyError

Draws = Callable[[Any], list]


@dataclasses.dataclass(frozen=True)
class Spec:
  """Shape and dtype of one noise tensor (numpy's counterpart of a tf.TensorSpec)."""

  shape: tuple[int, ...]
  dtype: Any = np.float64


class NumpyOps:
  """The numpy backend of the streams (float64 reference; also runs float32 in place of TF)."""

  float64 = np.float64
  int64 = np.int64

  @staticmethod
  def zeros(shape, dtype):
    return np.zeros(tuple(shape), dtype=dtype)

  @staticmethod
  def constant(value, dtype):
    return np.asarray(value, dtype=dtype)

  @staticmethod
  def cast(x, dtype):
    return np.asarray(x).astype(dtype)

  @staticmethod
  def gather(table: np.ndarray, index, dtype):
    """table[index] (first axis) in `dtype`."""
    return np.asarray(table[int(index)], dtype=dtype)

  @staticmethod
  def is_first_round(t, dtype):
    """1.0 in round 0, else 0.0 (the impulse δ_{t,0})."""
    return np.asarray(1.0 if int(t) == 0 else 0.0, dtype=dtype)

  @staticmethod
  def sqrt(x):
    return np.sqrt(x)

  @staticmethod
  def fori_loop(lower, upper, body: Callable[[Any, Any], Any], carry):
    """carry = body(i, carry) for i in [lower, upper)."""
    for i in range(int(lower), int(upper)):
      carry = body(i, carry)
    return carry

  @staticmethod
  def trailing_zeros(x) -> int:
    """Trailing zero bits of a positive integer."""
    x = int(x)
    return (x & -x).bit_length() - 1

  @staticmethod
  def empty_rows(shape, dtype):
    """A (0, *shape) array that `set_row` grows."""
    return np.zeros((0,) + tuple(shape), dtype=dtype)

  @staticmethod
  def set_row(buffer: np.ndarray, index, value):
    """buffer with row `index` replaced by `value`, grown by one row when index == len(buffer)."""
    index = int(index)
    if index >= buffer.shape[0]:
      buffer = np.concatenate(
        [buffer, np.zeros((index + 1 - buffer.shape[0],) + buffer.shape[1:], buffer.dtype)]
      )
    else:
      buffer = buffer.copy()
    buffer[index] = value
    return buffer

  @staticmethod
  def row(buffer, index):
    return buffer[int(index)]


NUMPY = NumpyOps()


class NoiseStream(abc.ABC):
  """Round-by-round unit-scale noise with explicit state (see the module docstring)."""

  #: Rounds the stream may produce (None: no horizon).
  horizon: Optional[int] = None

  def model_buffers(self, rounds: int) -> int:
    """How many model-sized arrays the state holds after `rounds` rounds (memory planning)."""
    return 0

  @abc.abstractmethod
  def init(self, specs: Sequence[Any], ops: Any) -> tuple:
    """The state before round 0: (t = 0, ...)."""

  @abc.abstractmethod
  def step(self, state: tuple, z: Draws, ops: Any) -> tuple[list, tuple]:
    """Round t's noise (one array per spec) from the draws `z`, and the state of round t + 1."""

  @abc.abstractmethod
  def row_norm(self, state: tuple, ops: Any) -> Any:
    """float64 std of one coordinate of round t's unit-scale noise (‖row_t of C⁻¹‖)."""

  def host_kernel(self, specs: Sequence[Any]) -> "HostKernel":
    """The stream on the host in numpy (`HostKernel`); mechanisms with big state override it."""
    return GenericKernel(self, specs)


def round_counter(ops: Any) -> Any:
  """The t entry of a fresh state."""
  return ops.constant(0, ops.int64)


@dataclasses.dataclass(frozen=True)
class IdentityStream(NoiseStream):
  """C = I (DP-SGD): round t's noise is z_t itself."""

  def init(self, specs, ops):
    return (round_counter(ops),)

  def step(self, state, z, ops):
    return list(z(0)), (state[0] + 1,)

  def row_norm(self, state, ops):
    return ops.constant(1.0, ops.float64)


def check_horizon(stream: NoiseStream, round_index: int, what: str = "strategy") -> None:
  """Refuses a round past the stream's horizon (numpy side; TF asserts in the aggregator)."""
  if stream.horizon is not None and round_index >= stream.horizon:
    raise StrategyError(
      f"the {what} was built for n={stream.horizon} rounds and cannot produce "
      f"noise for round {round_index} (0-based)"
    )


def run(
  stream: NoiseStream,
  draws: Sequence[Sequence[Sequence[np.ndarray]]],
  specs: Sequence[Spec],
  ops: Any = NUMPY,
) -> list[list[np.ndarray]]:
  """Runs a stream over given draws: draws[t][j] is round t's j-th draw (one array per spec).

  Returns outputs[t] = round t's noise (one array per spec). The reference for tests.
  """
  state = stream.init(specs, ops)
  outputs = []
  for t, round_draws in enumerate(draws):
    check_horizon(stream, t)
    noise, state = stream.step(state, lambda j, d=round_draws: d[int(j)], ops)
    outputs.append(noise)
  return outputs


def inverse_noise(stream: NoiseStream, z: np.ndarray) -> np.ndarray:
  """[C⁻¹ z] row by row for an (n, *shape) array z of a linear stream (one draw per round)."""
  z = np.asarray(z, dtype=np.float64)
  specs = [Spec(z.shape[1:])]
  return np.stack([out[0] for out in run(stream, [[[row]] for row in z], specs)]) if len(z) else z


def row_norms(stream: NoiseStream, n: int, ops: Any = NUMPY) -> np.ndarray:
  """`row_norm` of rounds 0..n-1 (the stream fed zeros)."""
  specs = [Spec(())]
  state = stream.init(specs, ops)
  zero = [np.zeros(())]
  out = np.zeros(n)
  for t in range(n):
    check_horizon(stream, t)
    out[t] = float(stream.row_norm(state, ops))
    _, state = stream.step(state, lambda j: zero, ops)
  return out


# ---------------------------------------------------------------------------------------------
# Host kernels: the stream in numpy with its state held (and updated in place) on the host.

#: float32 elements per chunk of the in-place kernels (256 KiB): every temporary of a chunk stays
#: in the L2 cache while the buffers stream through memory once (issue 11 measurements).
CHUNK = 1 << 16


def chunks(size: int, chunk: Optional[int] = None):
  """[lo, hi) ranges covering [0, size), of `chunk` (default CHUNK) elements."""
  chunk = chunk or CHUNK
  return [(lo, min(lo + chunk, size)) for lo in range(0, size, chunk)]


class HostKernel:
  """A stream run on the host in numpy, its state owned by the kernel.

  `step(z)` returns round t's noise as new arrays (one per spec; the caller owns them) and
  advances; `row_norm()` is round t's before the step. `state(copy)` is the stream's own state
  (`NoiseStream.init` layout, numpy), `restore(state)` takes one back. Subclasses keep the
  model-sized part of the state in their own layout and update it in place; the small float64
  part stays the stream's own state with no tensors (`stream.init([], NUMPY)`), advanced by the
  stream's own `step`, so `row_norm` and the round counter are the generic definition's.
  """

  def __init__(self, stream: NoiseStream, specs: Sequence[Any]):
    self.stream = stream
    self.specs = [
      Spec(tuple(int(n) for n in s.shape), np.dtype(_numpy_dtype(s.dtype))) for s in specs
    ]
    self._scalars = stream.init([], NUMPY)

  @property
  def round(self) -> int:
    return int(self._scalars[0])

  def row_norm(self) -> float:
    return float(self.stream.row_norm(self._scalars, NUMPY))

  def _advance_scalars(self) -> None:
    _, self._scalars = self.stream.step(self._scalars, lambda j: [], NUMPY)

  def step(self, z: Draws) -> list[np.ndarray]:
    raise NotImplementedError

  def buffers(self) -> list[np.ndarray]:
    """The model-sized arrays the kernel holds (its memory; benchmarks stream through them)."""
    return [np.asarray(x) for x in _leaves(self.tensor_state(copy=False))]

  def tensor_state(self, copy: bool) -> tuple:
    """The per-tensor entry of the stream state (state[1])."""
    raise NotImplementedError

  def restore_tensors(self, tensors: Sequence[Any]) -> None:
    raise NotImplementedError

  def state(self, copy: bool = True) -> tuple:
    """The stream state; copy=False gives views of the buffers, valid until the next step."""
    return (np.asarray(self._scalars[0]), self.tensor_state(copy)) + tuple(self._scalars[2:])

  def restore(self, state: Sequence[Any]) -> None:
    if len(state) != len(self._scalars):
      raise ValueError(
        f'noise state has {len(state)} parts, the stream expects {len(self._scalars)}'
      )
    tensors = state[1]
    if len(tensors) != len(self.specs):
      raise ValueError(
        f'noise state is for {len(tensors)} tensors, the model has {len(self.specs)}'
      )
    self.restore_tensors(tensors)
    rest = _restore_like(tuple(self._scalars[2:]), tuple(state[2:]))
    self._scalars = (np.array(state[0], np.int64), ()) + rest


def _numpy_dtype(dtype: Any) -> Any:
  return getattr(dtype, 'as_numpy_dtype', dtype)


def check_shape(got: Any, want: tuple, what: str) -> np.ndarray:
  got = np.asarray(got)
  if got.shape != tuple(want):
    raise ValueError(f'noise state {what} has shape {got.shape}, expected {tuple(want)}')
  return got


class GenericKernel(HostKernel):
  """The stream's own `step` with the numpy backend (no in-place updates)."""

  def __init__(self, stream: NoiseStream, specs: Sequence[Any]):
    super().__init__(stream, specs)
    self._state = stream.init(self.specs, NUMPY)

  @property
  def round(self) -> int:
    return int(self._state[0])

  def row_norm(self) -> float:
    return float(self.stream.row_norm(self._state, NUMPY))

  def buffers(self):
    return [np.asarray(x) for x in _leaves(self._state[1:2])]

  def step(self, z):
    noise, self._state = self.stream.step(self._state, z, NUMPY)
    return [np.array(x, dtype=s.dtype).reshape(s.shape) for x, s in zip(noise, self.specs)]

  def state(self, copy=True):
    return _map_arrays(self._state, np.array if copy else np.asarray)

  def restore(self, state):
    template = self.stream.init(self.specs, NUMPY)
    self._state = _restore_like(template, state)


def _leaves(tree: Any) -> list:
  if isinstance(tree, tuple):
    return [leaf for x in tree for leaf in _leaves(x)]
  return [tree]


def _map_arrays(tree: Any, fn: Callable) -> Any:
  if isinstance(tree, tuple):
    return tuple(_map_arrays(x, fn) for x in tree)
  return fn(tree)


def _restore_like(template: Any, value: Any) -> Any:
  if isinstance(template, tuple):
    if not isinstance(value, (tuple, list)) or len(value) != len(template):
      raise ValueError('noise state does not match the stream')
    return tuple(_restore_like(t, v) for t, v in zip(template, value))
  value = np.array(value, dtype=np.asarray(template).dtype)
  return value
