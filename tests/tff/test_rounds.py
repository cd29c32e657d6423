"""The federated part of a round: the FunctionalModel and the VariableModel train alike."""

import numpy as np
import pytest
import tensorflow_federated as tff

from fedmf.tasks.synthetic import SyntheticTask
from fedmf.tff.rounds import build_client_round


@pytest.fixture(scope='module')
def task():
  return SyntheticTask(
    num_clients=8,
    vocab_size=60,
    preset='lstm-small',
    sequence_length=20,
    batch_size=8,
    max_sentences=32,
    test_sentences=16,
    seed=3,
  )


def _round(task, model, clip_norm):
  client_round, _ = build_client_round(
    model, client_learning_rate=0.5, clip_norm=clip_norm, zeroing_linf=None
  )
  weights = tff.learning.models.ModelWeights(trainable=task.initial_weights(0), non_trainable=[])
  return client_round(weights, [task.client_dataset(i) for i in range(4)])


@pytest.mark.parametrize('clip_norm', [100.0, 0.01])
def test_functional_and_variable_models_give_the_same_round(tff_context, task, clip_norm):
  del tff_context
  functional = _round(task, task.functional_model(), clip_norm)
  variable = _round(task, task.model_fn(), clip_norm)
  for a, b in zip(functional['clipped_sum'], variable['clipped_sum']):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert np.abs(functional['clipped_sum'][0]).sum() > 0  # Something was trained.
  assert functional['clipped_count'] == variable['clipped_count']
  assert functional['clipped_count'] == (4 if clip_norm < 1 else 0)
  f, v = functional['train']['train'], variable['train']['train']
  assert f['num_examples'] == v['num_examples'] > 0
  np.testing.assert_allclose(f['loss'], v['loss'], rtol=1e-5)
