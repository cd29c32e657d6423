"""fedmf layer 4 (programs), tasks: federated data + model + evaluation.

  synthetic       built-in StackOverflow-like next-word data, no download (the default)
  stackoverflow   TFF's stackoverflow.sqlite from a local directory (never downloads)

`build_task(spec)` makes the task a `TaskSpec` names (the program fills it from its config); a
user's own data and model plug in as a `fedmf.tasks.base.Task` subclass (docs/simulation.md).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
  from fedmf.tasks.base import Task

__all__ = ["ArrayTask", "Task", "TaskSpec", "build_task"]


def __getattr__(name: str):
  # `fedmf.tasks.Task` and `ArrayTask` import TensorFlow: only when asked for, so that the package's
  # TF-free modules (`model_sizes`) can be imported before TensorFlow (the CLI's early refusals).
  if name in ("ArrayTask", "Task"):
    from fedmf.tasks import base  # pylint: disable=g-import-not-at-top

    return getattr(base, name)
  raise AttributeError(f"module 'fedmf.tasks' has no attribute {name!r}")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What a built-in task needs, and nothing else (docs/simulation.md names the config keys)."""

  task: str  # synthetic | stackoverflow
  num_clients: int
  vocab_size: int
  preset: str  # the model: lstm-small | lstm-paper
  sequence_length: int
  batch_size: int
  max_sentences: int
  test_sentences: int
  seed: int
  data_dir: Optional[str] = None  # stackoverflow: the directory holding stackoverflow.sqlite


def build_task(spec: TaskSpec) -> Task:
  """The task `spec` names (imports TensorFlow)."""
  common = dataclasses.asdict(spec)
  name, data_dir = common.pop("task"), common.pop("data_dir")
  if name == "synthetic":
    from fedmf.tasks.synthetic import SyntheticTask  # pylint: disable=g-import-not-at-top

    return SyntheticTask(**common)
  from fedmf.tasks.stackoverflow import StackOverflowTask  # pylint: disable=g-import-not-at-top

  return StackOverflowTask(data_dir=data_dir, **common)
