"""Synthetic federated next-word data with StackOverflow-like statistics (the default task).

One concept: a built-in dataset that needs no download. Deterministic from a seed, and generated
lazily per client index, so a population of 100,000 costs nothing until a cohort is drawn.

Generative model (all ids in TFF's StackOverflow layout, see
`word_prediction_preprocessing.get_special_tokens`: pad 0, words 1..V,
OOV V+1, bos V+2, eos V+3):

* **Zipfian vocabulary**: word rank r has unigram weight ∝ r^-zipf_exponent
  (StackOverflow's word counts are close to Zipf with exponent ~1).
* **Topics**: each of `num_topics` topics re-ranks the words after the
  `shared_head` most frequent ones with its own permutation, so frequent
  function words are shared and content words are topic-specific.
* **Next-word signal**: bigram chains. Every word has `num_successors`
  successors in a global table (shared "syntax") and in one table per topic,
  drawn from the topic's unigram, with slot weights ∝ (slot+1)^-slot_exponent.
  The next word follows the global chain with probability
  `global_chain_weight`, the topic chain with `topic_chain_weight`, else is a
  fresh draw from the topic unigram. A small LSTM learns the global chain
  quickly (accuracy well above the unigram baseline, i.e. always predicting
  the most frequent word) and gains more by inferring the topic from context;
  `oracle_accuracy` (knows the tables and each sentence's topic) bounds it.
* **Per-client topic skew**: topic mixture ~ Dirichlet(topic_alpha); each
  sentence draws its topic from the client's mixture.
* **Long-tailed client sizes**: sentences per client ~ lognormal(median,
  sigma) clipped to [min, max] (StackOverflow: >= 100 sentences per user,
  mean ~400, TFF then keeps <= 256).
* **OOV**: a word is replaced by the OOV id with probability `oov_rate`.
* Sentence length ~ 1 + Poisson(mean_length - 1); TFF's rule then keeps the
  first `sequence_length` words and adds eos only to shorter sentences.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from fedmf.tasks.base import ArrayTask

_TABLES, _CLIENT, _TEST = 0, 1, 2  # RNG stream ids


@dataclasses.dataclass(frozen=True)
class SyntheticNwpConfig:
  """Parameters of the generator (defaults: a CPU-friendly StackOverflow look-alike)."""

  num_clients: int = 10_000
  vocab_size: int = 10_000
  num_topics: int = 20
  zipf_exponent: float = 1.0
  shared_head: int = 100
  num_successors: int = 8
  slot_exponent: float = 1.5
  global_chain_weight: float = 0.5
  topic_chain_weight: float = 0.25
  topic_alpha: float = 0.2
  median_sentences: int = 64
  sentences_sigma: float = 1.0
  min_sentences: int = 8
  max_sentences: int = 512
  mean_length: float = 14.0
  oov_rate: float = 0.02
  sequence_length: int = 20
  seed: int = 0


class SyntheticNwp:
  """Lazy per-client generator; `client_arrays(i)` -> (x, y) like StackOverflow."""

  def __init__(self, config: SyntheticNwpConfig):
    self.config = config
    v = config.vocab_size
    self.oov, self.bos, self.eos = v + 1, v + 2, v + 3
    self._build_tables(np.random.default_rng([config.seed, _TABLES]))

  # -- shared tables (built once from the seed) ------------------------------

  def _build_tables(self, rng: np.random.Generator) -> None:
    c = self.config
    v, k = c.vocab_size, c.num_topics
    head_size = min(c.shared_head, v // 10)  # Small vocabularies keep most words topic-specific.
    weights = np.arange(1, v + 1, dtype=np.float64) ** -c.zipf_exponent
    self._rank_cdf = np.cumsum(weights / weights.sum())
    # word_of[k, rank] = word id (1..V) of that rank in topic k.
    word_of = np.empty((k, v), np.int32)
    head = np.arange(1, head_size + 1)
    for t in range(k):
      tail = rng.permutation(np.arange(head_size + 1, v + 1))
      word_of[t] = np.concatenate([head, tail])
    self._word_of = word_of
    # successors[k, w, s] for w in 0..V (row 0 = after bos/OOV: unused);
    # topic k = num_topics is the global chain (drawn from the shared ranks).
    ranks = self._draw_ranks(rng, (k + 1, v + 1, c.num_successors))
    global_words = np.arange(1, v + 1)
    self._successors = np.stack([word_of[t][ranks[t]] for t in range(k)] + [global_words[ranks[k]]])
    slot = np.arange(1, c.num_successors + 1, dtype=np.float64) ** -c.slot_exponent
    self._slot_cdf = np.cumsum(slot / slot.sum())

  def _draw_ranks(self, rng: np.random.Generator, shape) -> np.ndarray:
    u = rng.random(shape)
    return np.minimum(np.searchsorted(self._rank_cdf, u), self.config.vocab_size - 1)

  # -- per client ------------------------------------------------------------

  def client_rng(self, index: int, stream: int = _CLIENT) -> np.random.Generator:
    """The generator of client `index`: independent of all other clients."""
    return np.random.default_rng([self.config.seed, stream, index])

  def num_sentences(self, index: int, stream: int = _CLIENT) -> int:
    """Client size (before TFF's 256 cap); the first draw of the client's RNG."""
    return self._size(self.client_rng(index, stream))

  def _size(self, rng: np.random.Generator) -> int:
    c = self.config
    n = c.median_sentences * np.exp(c.sentences_sigma * rng.standard_normal())
    return int(np.clip(round(n), c.min_sentences, c.max_sentences))

  def client_sequences(
    self,
    index: int,
    stream: int = _CLIENT,
    max_sentences: Optional[int] = None,
    return_topics: bool = False,
  ):
    """int64 [n, sequence_length + 1]: bos, words, eos (if short), 0-padding.

    With `return_topics`, also each sentence's topic (for the oracle).
    """
    c = self.config
    rng = self.client_rng(index, stream)
    n = self._size(rng)
    mixture = rng.dirichlet(np.full(c.num_topics, c.topic_alpha))
    topics = rng.choice(c.num_topics, size=n, p=mixture)
    lengths = 1 + rng.poisson(c.mean_length - 1, size=n)
    words = self._sentences(rng, topics, min(int(lengths.max()), c.sequence_length))
    if max_sentences is not None:
      words, lengths = words[:max_sentences], lengths[:max_sentences]
      topics = topics[:max_sentences]
    seq = self._to_sequences(words, lengths)
    return (seq, topics) if return_topics else seq

  def _sentences(self, rng: np.random.Generator, topics: np.ndarray, steps: int) -> np.ndarray:
    """Word ids [n, steps] from each sentence's topic chain."""
    c = self.config
    n = len(topics)
    out = np.empty((n, steps), np.int64)
    prev = self._word_of[topics, self._draw_ranks(rng, n)]
    out[:, 0] = prev
    global_row = np.full(n, c.num_topics)
    for t in range(1, steps):
      fresh = self._word_of[topics, self._draw_ranks(rng, n)]
      slot = np.searchsorted(self._slot_cdf, rng.random(n))
      u = rng.random(n)
      table = np.where(u < c.global_chain_weight, global_row, topics)
      chained = self._successors[table, prev, slot]
      prev = np.where(u < c.global_chain_weight + c.topic_chain_weight, chained, fresh)
      out[:, t] = prev
    oov = rng.random(out.shape) < c.oov_rate
    return np.where(oov, self.oov, out)

  def _to_sequences(self, words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TFF's `build_to_ids_fn` layout from word ids and sentence lengths."""
    length = self.config.sequence_length
    n = len(lengths)
    seq = np.zeros((n, length + 1), np.int64)
    seq[:, 0] = self.bos
    kept = np.minimum(lengths, length)
    cols = np.arange(length)
    body = (
      np.where(cols[None, :] < kept[:, None], words[:, :length], 0)
      if words.shape[1] >= length
      else np.pad(
        np.where(cols[None, : words.shape[1]] < kept[:, None], words, 0),
        ((0, 0), (0, length - words.shape[1])),
      )
    )
    seq[:, 1:] = body
    short = kept < length
    seq[np.nonzero(short)[0], kept[short] + 1] = self.eos
    return seq

  def client_arrays(
    self, index: int, max_sentences: int = 256, stream: int = _CLIENT
  ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) int64 [n, sequence_length], n <= max_sentences (TFF's cap)."""
    seq = self.client_sequences(index, stream, max_sentences)
    return seq[:, :-1], seq[:, 1:]

  def test_arrays(
    self, num_clients: int = 200, max_sentences: int = 32
  ) -> tuple[np.ndarray, np.ndarray]:
    """A pooled test set from `num_clients` unseen clients (own RNG stream)."""
    parts = [self.client_arrays(i, max_sentences, stream=_TEST) for i in range(num_clients)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

  # -- reference numbers ------------------------------------------------------

  def unigram_baseline(self, y: np.ndarray) -> float:
    """Accuracy of always predicting the most frequent word (same mask as the model)."""
    valid = (y > 0) & (y <= self.config.vocab_size)
    counts = np.bincount(y[valid], minlength=self.config.vocab_size + 1)
    return float(counts.max() / max(valid.sum(), 1))

  def oracle_accuracy(self, num_clients: int = 200, max_sentences: int = 32) -> float:
    """Accuracy of the Bayes rule that knows each sentence's topic and the
    tables (an upper bound; the model must infer the topic from context)."""
    c = self.config
    hits = total = 0
    slot_p = np.diff(np.concatenate([[0.0], self._slot_cdf]))
    rank_p = np.diff(np.concatenate([[0.0], self._rank_cdf]))
    for i in range(num_clients):
      seq, topics = self.client_sequences(i, _TEST, max_sentences, return_topics=True)
      for row, t in zip(seq, topics):
        unigram = np.zeros(c.vocab_size + 1)
        unigram[self._word_of[t]] = rank_p
        for prev, nxt in zip(row[1:-1], row[2:]):
          if not 1 <= nxt <= c.vocab_size:
            continue
          total += 1
          if not 1 <= prev <= c.vocab_size:
            p = unigram
          else:
            p = (1 - c.global_chain_weight - c.topic_chain_weight) * unigram
            np.add.at(p, self._successors[c.num_topics, prev], c.global_chain_weight * slot_p)
            np.add.at(p, self._successors[t, prev], c.topic_chain_weight * slot_p)
          hits += int(np.argmax(p) == nxt)
    return hits / max(total, 1)

  def words_as_text(self, seq_row: np.ndarray) -> str:
    """A sequence row as a sentence of `w<id>` tokens (OOV as `oov<k>`)."""
    words = []
    for t in seq_row[1:]:
      if t in (0, self.eos):
        break
      words.append(f'w{t}' if t <= self.config.vocab_size else f'zz_oov{t}')
    return ' '.join(words)


# The `SyntheticNwpConfig` fields a caller of `SyntheticTask` may set beyond the task's own keywords
# (max_sentences is the task's cap on a client's sentences, not the generator's).
_GENERATOR_FIELDS = frozenset(f.name for f in dataclasses.fields(SyntheticNwpConfig)) - {
  "num_clients",
  "vocab_size",
  "sequence_length",
  "seed",
  "max_sentences",
}


class SyntheticTask(ArrayTask):
  """The `synthetic` task: `SyntheticNwp` clients, a pooled test set from unseen clients."""

  name = "synthetic"

  def __init__(self, *, num_clients: int, **settings: Any):
    """`settings`: the keywords of `ArrayTask` (preset, vocab_size, sequence_length, ...) and
    further `SyntheticNwpConfig` fields (e.g. min_sentences for fixed-size clients)."""
    generator = {k: settings.pop(k) for k in tuple(settings) if k in _GENERATOR_FIELDS}
    super().__init__(**settings)
    self.data = SyntheticNwp(
      SyntheticNwpConfig(
        num_clients=num_clients,
        vocab_size=self.vocab_size,
        sequence_length=self.sequence_length,
        seed=self.seed,
        **generator,
      )
    )
    self._num_clients = int(num_clients)

  @property
  def num_clients(self) -> int:
    return self._num_clients

  def client_id(self, index: int) -> str:
    return f"client-{int(index):06d}"

  def client_arrays(self, index: int):
    return self.data.client_arrays(int(index), self.max_sentences)

  def test_arrays(self):
    per_client = 32
    # Test clients have 8 to 512 sentences: draw twice as many as needed, keep the first ones.
    clients = max(1, -(-2 * self.test_sentences // per_client))
    x, y = self.data.test_arrays(clients, per_client)
    return x[: self.test_sentences], y[: self.test_sentences]
