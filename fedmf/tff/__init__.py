"""fedmf layer 3: TensorFlow Federated aggregators, noise streams and execution contexts.

See docs/architecture.md. Importing this package imports TensorFlow and TFF.

  build_dp_aggregator       the correlated-noise DP mean, a `tff.aggregators` factory.
  build_dp_fed_avg          FedAvg whose model update mean is that aggregator.
  local_execution_context   an owned local C++ context that stops its `worker_binary` on exit.
  ensure_context            the same, installed as TFF's default for command-line programs.
"""

from fedmf.tff.aggregators import CorrelatedNoiseFactory, build_dp_aggregator
from fedmf.tff.context import ensure_context, local_execution_context
from fedmf.tff.learning import build_dp_fed_avg

__all__ = [
  'CorrelatedNoiseFactory',
  'build_dp_aggregator',
  'build_dp_fed_avg',
  'ensure_context',
  'local_execution_context',
]
