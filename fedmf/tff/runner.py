"""Runs the federated part of a round over a cohort, in chunks, in the installed TFF context.

One concept: turning a cohort's datasets into the clipped sum. The cohort is split into contiguous
chunks of at most `clients_per_call` clients, one TFF call each, and the chunk sums are added on
the host in chunk order, so the result is deterministic. Chunks bound the worker's memory: TFF
keeps every client's weights and update alive until a call returns (about 54 MB per client of the
4M-parameter LSTM), so a 100-client cohort in one call would need about 6 GB.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class RoundResult:
  """The federated part's output: the clipped sum and what the clients reported."""

  clipped_sum: list[np.ndarray]
  clients: int = 0
  clipped: int = 0
  zeroed: int = 0
  loss: float = float("nan")  # mean training loss over the cohort's examples
  examples: int = 0
  loss_sum: float = 0.0

  def finish(self) -> None:
    self.loss = self.loss_sum / self.examples if self.examples else float("nan")

  @property
  def within(self) -> int:
    """Clients whose update was within the clip norm (neither clipped nor zeroed)."""
    return self.clients - self.clipped - self.zeroed


def add_chunk_result(result: RoundResult, out) -> None:
  """Adds one TFF call's output (a chunk of the cohort) into `result`, in place."""
  for total, part in zip(result.clipped_sum, out["clipped_sum"]):
    total += np.asarray(part, np.float32)
  result.clients += int(out["clients"])
  result.clipped += int(out["clipped_count"])
  result.zeroed += int(out["zeroed_count"])
  loss, examples = _train_stats(out["train"])
  result.loss_sum += loss * examples
  result.examples += examples


def _train_stats(train: Any) -> tuple[float, int]:
  """(loss, num_examples) from tff.learning's client-work measurements."""
  metrics = train.get("train", train) if hasattr(train, "get") else train
  loss = float(np.asarray(metrics["loss"]))
  examples = int(np.asarray(metrics.get("num_examples", 0)))
  return loss, examples


def zeros_like(shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
  return [np.zeros(s, np.float32) for s in shapes]


class RoundRunner:
  """Calls `client_round(weights, datasets)` on chunks and adds the results up in order."""

  def __init__(
    self,
    client_round: Callable,
    shapes: Sequence[tuple[int, ...]],
    clients_per_call: Optional[int] = None,
  ):
    self.client_round = client_round
    self.shapes = [tuple(s) for s in shapes]
    self.clients_per_call = clients_per_call

  def _model_weights(self, weights):
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

    return tff.learning.models.ModelWeights(trainable=list(weights), non_trainable=[])

  def chunks(self, items: list) -> list[list]:
    size = self.clients_per_call or len(items) or 1
    return [items[i : i + size] for i in range(0, len(items), size)]

  def run(
    self, weights: Sequence[np.ndarray], datasets: list, clip: Optional[float] = None
  ) -> RoundResult:
    """The cohort's clipped sum; `clip` is the round's ζ_t for a computation built with an
    adaptive clip (`fedmf.tff.rounds.build_client_round(clip_norm=None)`), else None."""
    result = RoundResult(clipped_sum=zeros_like(self.shapes))
    if not datasets:
      return result
    model_weights = self._model_weights(weights)
    extra = () if clip is None else (np.float64(clip),)
    for chunk in self.chunks(datasets):
      add_chunk_result(result, self.client_round(model_weights, chunk, *extra))
    result.finish()
    return result
