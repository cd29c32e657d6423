"""`tree_sensitivity.prefix_sensitivities`: TreeAgg's sensitivity at every prefix in one pass must
equal the strategy's own evaluation at each (r, b_r, k_r), bound the brute-force truth, and give
the audit's ε curve the values round-by-round evaluation gives."""

import numpy as np
import pytest

from fedmf.mf import resources
from fedmf.mf import tree
from fedmf.mf import tree_sensitivity
from fedmf.mf.schema import ParticipationSchema
from fedmf.privacy import curve as curve_lib
from tests.mf import brute_force


def _realized(n, seed, start=3):
  """A realized (b_r, k_r) sequence as a log gives it: nobody before round `start`, then k_r grows
  and b_r shrinks by random jumps (b_r = -1 while nobody has returned)."""
  rng = np.random.default_rng(seed)
  k = np.zeros(n, dtype=np.int64)
  k[start:] = 1 + np.cumsum(rng.random(n - start) < 0.3)
  drops = np.cumsum((rng.random(n) < 0.2) * rng.integers(1, 4, n))
  b = np.where(k >= 2, np.maximum(1, n // 3 - drops), -1)
  return b, k


def _one_by_one(strategy, b, k):
  out = []
  for r in range(1, b.shape[0] + 1):
    if k[r - 1] <= 0:
      out.append(None)
      continue
    ms = None if k[r - 1] <= 1 else int(b[r - 1])
    out.append(strategy.sensitivity(ParticipationSchema(r, ms, int(k[r - 1]))))
  return out


@pytest.mark.parametrize("n,seed", [(40, 0), (64, 1), (97, 2), (130, 3)])
def test_every_prefix_equals_the_strategys_own_value(n, seed):
  strategy = tree.Tree()
  b, k = _realized(n, seed)
  fast = tree_sensitivity.prefix_sensitivities(b, k)
  slow = _one_by_one(strategy, b, k)
  assert len(fast) == n
  for r, (f, s) in enumerate(zip(fast, slow), start=1):
    if s is None:
      assert f is None, r
      continue
    assert (f.method, f.algorithm) == (s.method, s.algorithm), r
    assert f.value == pytest.approx(s.value, rel=1e-12), r


def test_constant_schema_and_adversarial_separations():
  # (b, k) fixed from round 2 on (only the trailing rows change), then b = 1 and k = n (every
  # subset: VecSens's top-k route), and a schema that changes every round.
  strategy = tree.Tree()
  n = 70
  for b, k in [
    (np.r_[-1, np.full(n - 1, 5)], np.r_[1, np.full(n - 1, 3)]),
    (np.r_[-1, np.ones(n - 1, dtype=np.int64)], np.r_[1, np.arange(2, n + 1)]),
    (np.maximum(n - np.arange(n), 1), np.minimum(np.arange(n) // 3 + 1, 9)),
  ]:
    b, k = np.asarray(b), np.asarray(k)
    b = np.where(k <= 1, -1, b)
    fast = tree_sensitivity.prefix_sensitivities(b, k)
    for f, s in zip(fast, _one_by_one(strategy, b, k)):
      assert f.method == s.method and f.value == pytest.approx(s.value, rel=1e-12)


@pytest.mark.parametrize("n,b,kk", [(9, 2, 3), (11, 3, 4), (12, 1, 5), (10, 4, 2)])
def test_bounds_the_brute_force_sensitivity_of_every_prefix(n, b, kk):
  bs = np.full(n, b)
  ks = np.full(n, kk)
  fast = tree_sensitivity.prefix_sensitivities(bs, ks)
  for r in range(1, n + 1):
    truth = brute_force.brute_force_sensitivity(tree.tree_matrix(r), b, kk)
    assert fast[r - 1].value >= truth - 1e-12, r
  single = tree_sensitivity.prefix_sensitivities(np.full(n, -1), np.ones(n, dtype=np.int64))
  for r in range(1, n + 1):  # k = 1: exact.
    truth = brute_force.brute_force_sensitivity(tree.tree_matrix(r), 1, 1)
    assert single[r - 1].value == pytest.approx(truth, rel=1e-12)
    assert single[r - 1].method == "exact"


def test_the_audit_curve_is_the_round_by_round_curve():
  strategy = tree.Tree()
  n = 150
  b, k = _realized(n, 7)
  got = curve_lib.epsilon_curve(strategy, b, k, 2.0, 1e-6, max_evaluations=None, time_budget=1e12)
  other = tree.Tree()  # Its own cache, evaluated round by round as strategies without one pass.
  object.__setattr__(other, "prefix_sensitivities", lambda *_: None)
  want = curve_lib.epsilon_curve(other, b, k, 2.0, 1e-6, max_evaluations=None, time_budget=1e12)
  np.testing.assert_allclose(got.sensitivity, want.sensitivity, rtol=1e-12)
  np.testing.assert_allclose(got.epsilon, want.epsilon, rtol=1e-10)
  assert got.sensitivity_method == want.sensitivity_method
  # The last point is the strategy's cached value, the audit's realized claim, exactly.
  last = strategy.sensitivity(ParticipationSchema(n, int(b[-1]), int(k[-1])))
  assert got.sensitivity[-1] == last.value
  # The default (a bounded number of evaluations) gets every round's own value too.
  default = curve_lib.epsilon_curve(strategy, b, k, 2.0, 1e-6)
  np.testing.assert_array_equal(default.sensitivity, got.sensitivity)


def test_refused_beyond_the_memory_limit():
  with resources.limits(max_memory_bytes=1000):
    with pytest.raises(resources.ResourceLimitError, match="Gram matrix"):
      tree_sensitivity.prefix_sensitivities(np.full(100, 3), np.full(100, 2))
