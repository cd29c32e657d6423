"""fedmf layer 4 (programs), tasks: federated data + model + evaluation.

  synthetic       built-in StackOverflow-like next-word data, no download (the default)
  stackoverflow   TFF's stackoverflow.sqlite from a local directory (never downloads)

`build_task(config)` makes the task of a `TrainingConfig`; a user's own data and model plug in as
a `fedmf.tasks.base.Task` subclass (docs/simulation.md).
"""

from __future__ import annotations

from fedmf.tasks.base import ArrayTask, Task

__all__ = ["ArrayTask", "Task", "build_task"]


def build_task(config) -> Task:
  """The task a training config names (imports TensorFlow)."""
  common = dict(
    num_clients=config.num_clients,
    vocab_size=config.vocab_size,
    preset=config.model,
    sequence_length=config.sequence_length,
    batch_size=config.batch_size,
    max_sentences=config.max_sentences_per_client,
    test_sentences=config.test_sentences,
    seed=config.seed,
  )
  if config.task == "synthetic":
    from fedmf.tasks.synthetic import SyntheticTask  # pylint: disable=g-import-not-at-top

    return SyntheticTask(**common)
  from fedmf.tasks.stackoverflow import StackOverflowTask  # pylint: disable=g-import-not-at-top

  return StackOverflowTask(data_dir=config.data_dir, **common)
