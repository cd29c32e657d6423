"""The built-in models' sizes, without TensorFlow: the presets, the output classes and the
parameter count in closed form.

One concept: how big a preset's model is, known before anything is built, so that a model too
large for `--max-memory` is refused in a second, before TensorFlow is imported and before any data
is generated (`fedmf.program.preflight`). `fedmf.tasks.models` builds the models from the same
presets; tests/tasks/test_models.py checks the count against Keras'.
"""

from __future__ import annotations

import dataclasses

NUM_SPECIAL_TOKENS = 4  # pad, bos, eos, one OOV bucket

# Clients per TFF call of each preset (the default of `platform.clients_per_call`): bounds the
# worker's memory (~54 MB per client of the 4M-parameter LSTM).
CLIENTS_PER_CALL = {"lstm-paper": 20, "lstm-small": 50}


@dataclasses.dataclass(frozen=True)
class LstmSpec:
  embedding_size: int
  lstm_size: int


PRESETS = {
  "lstm-paper": LstmSpec(embedding_size=96, lstm_size=670),
  "lstm-small": LstmSpec(embedding_size=32, lstm_size=128),
}


def num_classes(vocab_size: int) -> int:
  """Output classes: words plus pad, bos, eos and one OOV bucket."""
  return vocab_size + NUM_SPECIAL_TOKENS


def count_params(preset: str, vocab_size: int) -> int:
  """Closed form: emb V'E + LSTM 4H(E+H+1) + proj (H+1)E + out (E+1)V'."""
  e, h = PRESETS[preset].embedding_size, PRESETS[preset].lstm_size
  v = num_classes(vocab_size)
  return v * e + 4 * h * (e + h + 1) + (h + 1) * e + (e + 1) * v
