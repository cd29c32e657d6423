"""Public entry point for the TFF DP aggregators (re-export; imports TensorFlow).

See fedmf.tff.aggregators and docs/aggregators.md.
"""

from fedmf.tff.aggregators import build_dp_aggregator  # noqa: F401

__all__ = ['build_dp_aggregator']
