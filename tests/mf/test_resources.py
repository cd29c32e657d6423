"""Resource estimates (fedmf.mf.resources): they bound the measured memory, they are checked before
any allocation, and a refusal names the estimate, the limit and the flag."""

import time
import tracemalloc

import numpy as np
import pytest
import scipy.signal  # noqa: F401 (imported lazily by the code; its import would count as a peak)

from fedmf.mf import toeplitz_math
from fedmf.mf import evaluation, resources, strategies as st
from fedmf.mf.schema import ParticipationSchema

N = 300
STRATEGIES = {
  "dpsgd": {"mechanism": "dpsgd"},
  "tree": {"mechanism": "tree"},
  "tree-vanilla": {"mechanism": "tree", "variant": "vanilla"},
  "tree-full": {"mechanism": "tree", "variant": "full-honaker"},
  "blt": {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]},
  "blt-no-thm3.1": {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.9, 0.5]},
  "band-toeplitz": {"mechanism": "band-toeplitz", "coefficients": [1, 0.5, 0.25]},
  "band-toeplitz-signed": {"mechanism": "band-toeplitz", "coefficients": [1, -0.5, 0.25]},
  "band-toeplitz-normalized": {
    "mechanism": "band-toeplitz",
    "coefficients": [1, 0.5, 0.25],
    "column_normalized": True,
  },
  "bandmf": {
    "mechanism": "bandmf",
    "n": N,
    "bands": 4,
    "columns": [[1, 0.5, 0.2, 0.1][: min(4, N - j)] for j in range(N)],
  },
  "dense": {"mechanism": "dense", "matrix": (np.tril(np.full((N, N), 0.01)) + np.eye(N)).tolist()},
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_memory_estimate_bounds_the_measured_peak(name):
  """Every route of `evaluate` (exact, max column norm, Gram bound, lower bound; prefix and dense
  workloads) peaks below its estimate, measured by tracemalloc (numpy reports to it)."""
  strategy = st.load_strategy(STRATEGIES[name])
  for b, k in [(N, 1), (5, 10), (1, N), (2, 3)]:
    schema = ParticipationSchema(N, b, k)
    for method in ("auto", "upper-bound", "lower-bound"):
      for workload in ("prefix", "momentum"):
        estimate = strategy.evaluation_cost(schema, workload == "momentum", method).memory_bytes
        tracemalloc.start()
        try:
          evaluation.evaluate(strategy, schema, workload=workload, method=method)
          peak = tracemalloc.get_traced_memory()[1]
        finally:
          tracemalloc.stop()
        assert peak <= estimate, (b, k, method, workload, peak, estimate)


def test_refused_before_allocating_naming_estimate_limit_and_flag():
  start = time.perf_counter()
  with pytest.raises(resources.ResourceLimitError) as info:
    evaluation.evaluate({"mechanism": "dpsgd"}, 10**18, 1, 1)
  assert time.perf_counter() - start < 5  # refused up front, not after a failed allocation
  message = str(info.value)
  assert "evaluating dpsgd at n=1000000000000000000 needs about" in message
  assert "EiB of memory" in message and "limit of 4 GiB (--max-memory" in message


def test_dense_work_at_large_n_is_refused_and_the_limit_can_be_raised():
  tree = {"mechanism": "tree"}
  with pytest.raises(resources.ResourceLimitError, match=r"dense 1000000×1999993 tree decoder"):
    evaluation.evaluate(tree, 10**6, 10, 5)
  with pytest.raises(resources.ResourceLimitError, match=r"estimated .* above the limit of 1 s"):
    with resources.limits(max_seconds=1.0):
      evaluation.evaluate({"mechanism": "blt", "buf_decay": [0.5], "output_scale": [0.5]}, 10**5)
  with resources.limits(max_memory_bytes=64 * 2**20) as lim:  # 64 MiB
    assert resources.current() is lim
    with pytest.raises(resources.ResourceLimitError, match="limit of 64 MiB"):
      evaluation.evaluate(tree, 2000, 10, 5)
  assert resources.current().max_memory_bytes == resources.DEFAULT_MAX_MEMORY_BYTES
  with resources.limits(max_seconds=1e6):
    result = evaluation.evaluate({"mechanism": "dpsgd"}, 10**6, 10**3, 5)
  assert result.rms_error == pytest.approx(np.sqrt(np.mean(np.arange(1, 10**6 + 1))))


def test_padded_toeplitz_coefficients_cost_o_n():
  """C = I and banded Toeplitz C padded to n coefficients: the inverse filter runs on the b̂
  non-zero ones (bit-identical), so n = 10^6 takes a fraction of a second, not minutes."""
  strategy = st.load_strategy({"mechanism": "band-toeplitz", "coefficients": [1, 0.5, 0.25]})
  assert strategy.error_cost(10**6).seconds < 0.1
  start = time.perf_counter()
  rows = strategy.decoder_row_sq_norms(10**6)
  assert time.perf_counter() - start < 10

  direct = np.cumsum(np.cumsum(toeplitz_math.inverse_coefs([1, 0.5, 0.25], 5000)) ** 2)
  assert np.array_equal(rows[:5000], direct)


def test_format():
  assert resources.format_bytes(146 * 2**40) == "146 TiB"
  assert resources.format_bytes(float("inf")) == "unbounded memory"
  assert resources.format_seconds(3 * 86400) == "3 days"
  cost = resources.Cost.of("a", 10, 1) + resources.Cost.of("b", 30, 2)
  assert cost.memory_bytes == 30 and cost.seconds == 3 and cost.largest("seconds").what == "b"
