"""Canary directions: exactly orthonormal, inserted and projected by one fast transform each."""

import numpy as np
import pytest
import scipy.linalg

from fedmf.errors import FedmfUserError
from fedmf.privacy import canary_directions as cd


def _flat(tensors):
  return np.concatenate([np.asarray(t, np.float64).reshape(-1) for t in tensors])


@pytest.mark.parametrize("n", [1, 2, 8, 64, 128, 1024])
def test_fwht_is_the_sylvester_hadamard_product(n):
  x = np.random.default_rng(n).normal(size=n)
  expected = scipy.linalg.hadamard(n) @ x
  assert np.allclose(cd.fwht(x.copy()), expected, rtol=0, atol=1e-10 * max(1, np.abs(x).sum()))
  assert np.array_equal(cd.sylvester_hadamard(n), scipy.linalg.hadamard(n))


def test_fwht_refuses_other_lengths():
  with pytest.raises(ValueError, match="power-of-two"):
    cd.fwht(np.zeros(12))


@pytest.mark.parametrize("shapes", [[(3, 5), (7,), (11, 2, 3)], [(97,)], [(10, 10), (1,)]])
def test_directions_are_orthonormal_and_transforms_match_dense(shapes):
  count = 20
  directions = cd.HadamardDirections(shapes, count, seed=7)
  u = np.stack([_flat(directions.dense(c)) for c in range(count)])
  assert np.abs(u @ u.T - np.eye(count)).max() < 1e-12
  assert np.all(np.count_nonzero(u, axis=1) == directions.size)  # N = 2^⌊log₂ d⌋ coordinates
  rng = np.random.default_rng(1)
  x = [rng.normal(size=s) for s in shapes]
  assert np.allclose(directions.project(x), u @ _flat(x), atol=1e-12)
  a = rng.normal(size=count)
  y = [t.copy() for t in x]
  directions.add(y, a)
  assert np.allclose(_flat(y), _flat(x) + a @ u, atol=1e-12)


def test_float32_tensors_keep_their_dtype():
  shapes = [(40, 30), (30,)]
  directions = cd.HadamardDirections(shapes, 5, seed=0)
  x = [np.zeros(s, np.float32) for s in shapes]
  directions.add(x, np.ones(5))
  assert all(t.dtype == np.float32 for t in x)
  assert np.allclose(directions.project(x), np.ones(5), atol=1e-6)


def test_directions_spread_over_every_tensor():
  shapes = [(600,), (300, 2), (1000,), (50,)]
  directions = cd.HadamardDirections(shapes, 3, seed=5)
  covered = [np.count_nonzero(t) for t in directions.dense(0)]
  sizes = [int(np.prod(s)) for s in shapes]
  fraction = directions.size / sum(sizes)
  for got, size in zip(covered, sizes):  # each tensor gets about its share of the N coordinates
    assert abs(got - fraction * size) < 0.1 * size + 10


def test_seeded_and_distinct():
  shapes = [(50, 20)]
  a = cd.HadamardDirections(shapes, 4, seed=1).dense(2)[0]
  b = cd.HadamardDirections(shapes, 4, seed=1).dense(2)[0]
  c = cd.HadamardDirections(shapes, 4, seed=2).dense(2)[0]
  assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_too_many_canaries_for_the_model_is_refused():
  with pytest.raises(FedmfUserError, match="do not fit in a model of 100 parameters"):
    cd.HadamardDirections([(100,)], 65, seed=0)
