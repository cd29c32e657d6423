"""fedmf layer 3: TensorFlow Federated aggregators, noise streams and contexts.

See docs/architecture.md. Importing this package imports TensorFlow and TFF.
Public entry points:
  fedmf.tff.aggregators.build_dp_aggregator   the DP mean aggregator factory.
  fedmf.tff.context.local_execution_context   an owned local C++ context.
  fedmf.tff.context.ensure_context            the same, as TFF's default.
"""
