"""fedmf layer 2, privacy: accounting, participation logs, the post-hoc auditor and its report.

Depends on the pure-math layer (`fedmf.mf`), dp_accounting and pyarrow; never on TensorFlow.
"""
