"""fedmf: differentially private federated learning with correlated noise.

Layers (imports only go downwards; see docs/architecture.md):
  fedmf.mf          pure math (numpy/scipy): strategies, streaming noise, sensitivity, error, optimizers.
  fedmf.accounting, fedmf.participation, fedmf.audit
                    privacy accounting (dp_accounting), participation logs and the post-hoc auditor.
  fedmf.tff         TensorFlow Federated aggregators and processes.
  fedmf.cli         the `fedmf` console script.

Importing `fedmf` does not import TensorFlow.
"""

__version__ = "0.1.0"
