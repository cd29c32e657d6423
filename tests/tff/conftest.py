"""Shared fixtures for the TFF tests: one owned local C++ context per session."""

import os

import pytest

# Quieter TF logs; set before TensorFlow is imported.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


@pytest.fixture(scope='session')
def tff_context():
  """Installs a fedmf LocalExecutionContext for the session; kills its worker."""
  from fedmf.tff import context  # pylint: disable=import-outside-toplevel

  with context.local_execution_context() as ctx:
    yield ctx
