"""Tests for fedmf.mf.workloads."""

import numpy as np
import pytest

from fedmf.mf import workloads


def test_prefix_sum_is_lower_triangular_ones():
  a = workloads.prefix_sum(4)
  np.testing.assert_array_equal(a, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
  assert a.dtype == np.float64


def test_momentum_zero_without_cooldown_is_prefix_sum():
  np.testing.assert_allclose(
    workloads.momentum_with_cooldown(7, momentum=0.0), workloads.prefix_sum(7)
  )


def test_cooldown_learning_rates_are_linear_and_reach_target():
  lr = workloads.cooldown_learning_rates(10, cooldown_period=4, cooldown_target=0.2)
  np.testing.assert_allclose(lr, [1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2])
  np.testing.assert_array_equal(workloads.cooldown_learning_rates(5), np.ones(5))


@pytest.mark.parametrize('momentum,period', [(0.95, 0), (0.9, 5), (0.5, 12)])
def test_momentum_workload_matches_simulated_sgd(momentum, period):
  n = 12
  rng = np.random.default_rng(0)
  x = rng.standard_normal((n, 3))
  lr = workloads.cooldown_learning_rates(n, period, 0.05)
  # Heavy-ball SGD from model 0 with unit base learning rate.
  model = np.zeros(3)
  buf = np.zeros(3)
  trajectory = []
  for t in range(n):
    buf = momentum * buf + x[t]
    model = model - lr[t] * buf
    trajectory.append(-model)
  a = workloads.momentum_with_cooldown(n, momentum, period, 0.05)
  np.testing.assert_allclose(a @ x, np.array(trajectory), rtol=1e-12, atol=1e-12)
  assert np.all(np.triu(a, 1) == 0)


def test_by_name():
  np.testing.assert_array_equal(workloads.by_name('prefix', 3), workloads.prefix_sum(3))
  np.testing.assert_array_equal(
    workloads.by_name('momentum', 5), workloads.momentum_with_cooldown(5)
  )
  with pytest.raises(ValueError, match='workload'):
    workloads.by_name('adam', 3)


def test_is_prefix_sum():
  assert workloads.is_prefix_sum(None)
  assert workloads.is_prefix_sum(workloads.prefix_sum(5))
  assert not workloads.is_prefix_sum(workloads.momentum_with_cooldown(5))


@pytest.mark.parametrize(
  'kwargs', [dict(momentum=1.0), dict(cooldown_period=9), dict(cooldown_target=0.0)]
)
def test_invalid_arguments(kwargs):
  with pytest.raises(ValueError):
    workloads.momentum_with_cooldown(8, **kwargs)
