"""fedmf layer 3: TensorFlow Federated aggregators, noise streams and execution contexts.

See docs/architecture.md. The names below import TensorFlow and TFF when first used (PEP 562), so
that `fedmf worker` and other TF-free modules of this package (`sandbox`, `channels`, `front`)
start without them.

  build_dp_aggregator       the correlated-noise DP mean, a `tff.aggregators` factory.
  build_dp_fed_avg          FedAvg whose model update mean is that aggregator.
  canary_factory            wraps a DP aggregator with canary clients that measure its privacy
                            (docs/empirical-privacy.md).
  build_host_noise_fed_avg  FedAvg for your own loop with the noise kept on the host (faster: only
                            the round's noise crosses TFF's context, not the stream's buffers).
  local_execution_context   an owned local C++ context (its `worker_binary` isolated in a network
                            namespace of its own) that stops its worker on exit.
  ensure_context            the same, installed as TFF's default for command-line programs.
  worker_dataset            a client dataset with tf.data autotuning off, so that TFF's worker does
                            not stall at the end of each client (`fedmf.tff.client_data`).
"""

import importlib

_EXPORTS = {
  'CanaryFactory': 'fedmf.tff.canaries',
  'CorrelatedNoiseFactory': 'fedmf.tff.aggregators',
  'build_dp_aggregator': 'fedmf.tff.aggregators',
  'build_dp_fed_avg': 'fedmf.tff.learning',
  'build_host_noise_fed_avg': 'fedmf.tff.learning',
  'canary_factory': 'fedmf.tff.canaries',
  'ensure_context': 'fedmf.tff.context',
  'local_execution_context': 'fedmf.tff.context',
  'worker_dataset': 'fedmf.tff.client_data',
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
