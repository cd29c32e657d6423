"""StackOverflow next-word prediction from a user-given directory, never downloading.

One concept: the papers' StackOverflow task (BandMF §6, BLT §5) read from TFF's own files. Checked
against the installed TFF 0.87 source:

* `tff.simulation.datasets.stackoverflow.load_data(cache_dir)` calls
  `download.get_compressed_file`, which returns `<cache_dir>/stackoverflow.sqlite`
  if it exists and downloads otherwise; it then wraps the file in
  `sql_client_data.SqlClientData(path, split)` and maps `_add_proto_parsing`.
  We call `SqlClientData` ourselves, so a missing file cannot trigger a download.
* `stackoverflow.load_word_counts` always goes through `tf.keras.utils.get_file`
  (`<cache_dir>/datasets/stackoverflow.word_count.tar.bz2`, sha256-checked); the
  extracted `stackoverflow.word_count` is plain text, one `word count` per line,
  most frequent first (count = number of train users using the word). We read
  that text file (or the .tar.bz2) directly.
* Preprocessing is TFF's own
  `tff.simulation.baselines.stackoverflow.word_prediction_preprocessing`
  (`create_preprocess_fn`, `build_to_ids_fn`, `batch_and_split`,
  `get_special_tokens`); we only add a seeded shuffle in front of it.
* `sql_client_data_utils.save_to_sql_client_data` can write the schema, but it
  puts each client in exactly one split (StackOverflow clients appear in train
  and test) and round-trips through `tempfile`, so tests use plain sqlite3 here.
* At run time clients are read with plain sqlite3 + protobuf and turned into ids by `TokenIds`, the
  numpy twin of TFF's `build_to_ids_fn` + `batch_and_split` (about 7 ms per client against 340 ms
  for a `tf.data` pipeline per client); TFF's `preprocess` stays the test oracle.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sqlite3
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np
import tensorflow as tf
from tensorflow_federated.python.simulation.baselines import client_spec
from tensorflow_federated.python.simulation.baselines.stackoverflow import (
  word_prediction_preprocessing as so_pre,
)
from tensorflow_federated.python.simulation.datasets import sql_client_data

from fedmf.tasks import sqlite_rows
from fedmf.errors import FedmfUserError
from fedmf.tasks.base import ArrayTask
from fedmf.tff import client_data

SQLITE_NAME = 'stackoverflow.sqlite'
WORD_COUNT_NAME = 'stackoverflow.word_count'
WORD_COUNT_ARCHIVE = 'stackoverflow.word_count.tar.bz2'
SPLITS = ('train', 'heldout', 'test')

# The papers' recipe (BandMF App. I, BLT §5); TFF's constants
# module has DEFAULT_SEQUENCE_LENGTH = 20, DEFAULT_WORD_VOCAB_SIZE = 10000.
VOCAB_SIZE = 10_000
SEQUENCE_LENGTH = 20
MAX_ELEMENTS = 256
BATCH_SIZE = 16
NUM_OOV_BUCKETS = 1

# The six features of TFF's `stackoverflow._add_proto_parsing`.
_FEATURE_SPEC = collections.OrderedDict(
  creation_date=tf.io.FixedLenFeature(dtype=tf.string, shape=()),
  score=tf.io.FixedLenFeature(dtype=tf.int64, shape=()),
  tags=tf.io.FixedLenFeature(dtype=tf.string, shape=()),
  title=tf.io.FixedLenFeature(dtype=tf.string, shape=()),
  tokens=tf.io.FixedLenFeature(dtype=tf.string, shape=()),
  type=tf.io.FixedLenFeature(dtype=tf.string, shape=()),
)
_TOKENS_SPEC = {'tokens': _FEATURE_SPEC['tokens']}


class MissingDataError(FedmfUserError):
  """A required data file is absent or unusable; the CLI prints it on one line, exit 2."""


# --------------------------------------------------------------------------
# Writing TFF's schema (tests).
# --------------------------------------------------------------------------


def serialize_example(
  tokens: str,
  *,
  creation_date: str = '2017-01-01 00:00:00 UTC',
  score: int = 0,
  tags: str = '',
  title: str = '',
  kind: str = 'answer',
) -> bytes:
  """One `tf.train.Example` with the six StackOverflow features, serialized."""

  def b(s):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[s.encode()]))

  feature = {
    'creation_date': b(creation_date),
    'score': tf.train.Feature(int64_list=tf.train.Int64List(value=[score])),
    'tags': b(tags),
    'title': b(title),
    'tokens': b(tokens),
    'type': b(kind),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tiny_stackoverflow_sqlite(
  path: str, clients: Mapping[str, Mapping[str, Sequence[str]]], *, index: bool = True
) -> None:
  """Writes `clients[split][client_id] = [sentence, ...]` in TFF's schema.

  Tables as in `sql_client_data_utils.save_to_sql_client_data` (TFF 0.87):
  `examples(split_name, client_id, serialized_example_proto)` and
  `client_metadata(client_id, split_name, num_examples)`. A client id may
  appear in several splits, as in the real file.

  Args:
    path: output file; overwritten.
    clients: split name -> client id -> sentences (space-separated tokens).
    index: also create an index on `examples(client_id, split_name)`, which
      makes per-client queries O(log N) instead of a full table scan.
  """
  if os.path.exists(path):
    os.remove(path)
  with contextlib.closing(sqlite3.connect(path)) as con:
    con.execute(
      'CREATE TABLE examples (split_name TEXT NOT NULL, '
      'client_id TEXT NOT NULL, serialized_example_proto BLOB NOT NULL)'
    )
    con.execute(
      'CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
      'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL)'
    )
    for split, by_client in clients.items():
      for cid, sentences in by_client.items():
        con.executemany(
          'INSERT INTO examples VALUES (?, ?, ?)',
          [(split, cid, serialize_example(s)) for s in sentences],
        )
        con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (cid, split, len(sentences)))
    if index:
      con.execute('CREATE INDEX examples_client ON examples(client_id, split_name)')
    con.commit()


# --------------------------------------------------------------------------
# Loading.
# --------------------------------------------------------------------------


def sqlite_path(data_dir: str) -> str:
  """`<data_dir>/stackoverflow.sqlite`, or `MissingDataError` naming it."""
  path = os.path.join(data_dir, SQLITE_NAME)
  if not os.path.isfile(path):
    raise MissingDataError(
      f'StackOverflow data not found: expected {path} (tff.simulation.datasets.stackoverflow'
      '.load_data() puts it in ~/.tff, where fedmf looks when --data-dir is not given)'
    )
  return path


def parse_tokens(serialized: tf.Tensor) -> tf.Tensor:
  """Serialized `tf.train.Example` -> its `tokens` string (scalar).

  Parses only `tokens`, the one feature word prediction uses; TFF's
  `stackoverflow._add_proto_parsing` parses all six into an OrderedDict.
  """
  return tf.io.parse_single_example(serialized, _TOKENS_SPEC)['tokens']


def parse_all_features(serialized: tf.Tensor):
  """Same output as TFF's `stackoverflow._add_proto_parsing` for one element."""
  return collections.OrderedDict(tf.io.parse_single_example(serialized, _FEATURE_SPEC))


def _tokens_of(blob: bytes) -> bytes:
  """The `tokens` bytes of one serialized `tf.train.Example` (upb protobuf)."""
  return tf.train.Example.FromString(blob).features.feature['tokens'].bytes_list.value[0]


class StackOverflowClients:
  """Lazy per-client datasets of one split of `stackoverflow.sqlite`.

  Wraps `tff.simulation.datasets.sql_client_data.SqlClientData`. Holds only the
  sorted client-id list (what `SqlClientData.__init__` reads from
  `client_metadata`); each client's `tf.data.Dataset` is a `SqlDataset` query
  built on demand, so memory does not grow with the cohorts drawn.
  """

  def __init__(self, path: str, split: str, rows: Optional[sqlite_rows.ClientRows] = None):
    """`rows`: the client rows of a file without an index (`fedmf.tasks.sqlite_rows`)."""
    if split not in SPLITS:
      raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
    self._sql = sql_client_data.SqlClientData(path, split)
    self._ids = set(self._sql.client_ids)  # O(1) membership; TFF scans a list.
    self._con: Optional[sqlite3.Connection] = None
    self._rows = rows
    self.split = split

  @property
  def client_ids(self) -> list[str]:
    return self._sql.client_ids

  def raw_dataset(self, client_id: str) -> tf.data.Dataset:
    """Serialized examples of one client (TFF's `serializable_dataset_fn`)."""
    if client_id not in self._ids:
      raise KeyError(f'no client {client_id!r} in split {self.split!r}')
    return self._sql.serializable_dataset_fn(client_id)

  def sentences(self, client_id: str) -> tf.data.Dataset:
    """The client's `tokens` strings, in a dict as TFF's preprocessing expects."""
    return self.raw_dataset(client_id).map(lambda s: {'tokens': parse_tokens(s)})

  def fetch_sentences(self, client_id: str) -> list[bytes]:
    """The client's `tokens` strings via plain sqlite3 + protobuf (fast path).

    Same rows and order as `raw_dataset` (same WHERE clause, parameterized),
    ~5 ms for 300 rows against ~300 ms for the `tf.data` pipeline.
    """
    if client_id not in self._ids:
      raise KeyError(f'no client {client_id!r} in split {self.split!r}')
    if self._con is None:
      self._con = sqlite3.connect(
        f'file:{self._sql._filepath}?mode=ro', uri=True, check_same_thread=False
      )
    if self._rows is not None:  # No index on client_id: the cached row runs.
      return [
        _tokens_of(b) for b in sqlite_rows.fetch(self._con, self._rows, self.split, client_id)
      ]
    rows = self._con.execute(
      'SELECT serialized_example_proto FROM examples WHERE client_id = ? AND split_name = ?',
      (client_id, self.split),
    )
    return [_tokens_of(blob) for (blob,) in rows]


def load_stackoverflow(data_dir: str) -> dict[str, StackOverflowClients]:
  """The three splits of `<data_dir>/stackoverflow.sqlite`; never downloads."""
  path = sqlite_path(data_dir)
  return {split: StackOverflowClients(path, split) for split in SPLITS}


def has_client_index(path: str) -> bool:
  """Whether `examples` has an index whose first column is `client_id`."""
  with contextlib.closing(sqlite3.connect(f'file:{path}?mode=ro', uri=True)) as con:
    for _, name, *_ in con.execute('PRAGMA index_list(examples)'):
      cols = [r[2] for r in con.execute(f'PRAGMA index_info("{name}")')]
      if cols and cols[0] == 'client_id':
        return True
  return False


# --------------------------------------------------------------------------
# Vocabulary.
# --------------------------------------------------------------------------


def read_word_counts(
  data_dir: str, vocab_size: Optional[int] = None
) -> Optional['collections.OrderedDict[str, int]']:
  """Word counts from `<data_dir>/stackoverflow.word_count` (or its .tar.bz2), else from Keras's
  datasets directory (`keras_datasets_dir`).

  Same parsing as TFF's `stackoverflow.load_word_counts`: one `word count` per
  line, most frequent first, stop after `vocab_size` words. Returns None when
  neither file exists (the caller then counts the train split).
  """
  # Then where tff...stackoverflow.load_word_counts() leaves them: Keras's datasets directory.
  for directory in (data_dir, keras_datasets_dir()):
    text_path = os.path.join(directory, WORD_COUNT_NAME)
    archive = os.path.join(directory, WORD_COUNT_ARCHIVE)
    if os.path.isfile(text_path):
      with open(text_path, 'rb') as f:
        return _parse_word_counts(f, vocab_size)
    if os.path.isfile(archive):
      with tarfile.open(archive, 'r:bz2') as tar:
        member = tar.extractfile(WORD_COUNT_NAME)
        return _parse_word_counts(member, vocab_size)
  return None


def keras_datasets_dir() -> str:
  """`tf.keras.utils.get_file`'s default: $KERAS_HOME/datasets, else ~/.keras/datasets."""
  home = os.environ.get('KERAS_HOME') or os.path.join(os.path.expanduser('~'), '.keras')
  return os.path.join(home, 'datasets')


def _parse_word_counts(lines: Iterable[bytes], vocab_size: Optional[int]):
  counts = collections.OrderedDict()
  for line in lines:
    word, count = line.decode('utf-8').split()
    counts[word] = int(count)
    if vocab_size is not None and len(counts) >= vocab_size:
      break
  return counts


def count_client_words(
  path: str, split: str = 'train', max_clients: Optional[int] = None
) -> 'collections.Counter[str]':
  """Per word, the number of clients of `split` using it (TFF's definition).

  Reads the sqlite file with plain sqlite3 and protobuf (upb), in client order
  of the `examples` table; `max_clients` bounds the work on the full dataset.
  """
  counts = collections.Counter()
  with contextlib.closing(sqlite3.connect(f'file:{path}?mode=ro', uri=True)) as con:
    rows = con.execute(
      'SELECT client_id, serialized_example_proto FROM examples '
      'WHERE split_name = ? ORDER BY client_id',
      (split,),
    )
    current, words, seen = None, set(), 0
    for cid, blob in rows:
      if cid != current:
        counts.update(words)
        current, words, seen = cid, set(), seen + 1
        if max_clients is not None and seen > max_clients:
          words = set()
          break
      ex = tf.train.Example.FromString(blob)
      words.update(ex.features.feature['tokens'].bytes_list.value[0].decode().split())
    counts.update(words)
  return counts


def top_words(counts: Mapping[str, int], vocab_size: int = VOCAB_SIZE) -> list[str]:
  """The `vocab_size` most frequent words; ties broken by the word itself."""
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
  return [w for w, _ in ranked[:vocab_size]]


def build_vocab(
  data_dir: str, vocab_size: int = VOCAB_SIZE, max_clients: Optional[int] = None
) -> list[str]:
  """The word-count file's first `vocab_size` words, else counted from train.

  Like `create_word_prediction_task`: `list(load_word_counts(...))[:vocab_size]`.
  """
  counts = read_word_counts(data_dir, vocab_size)
  if counts is not None:
    return list(counts)[:vocab_size]
  return top_words(count_client_words(sqlite_path(data_dir), 'train', max_clients), vocab_size)


# --------------------------------------------------------------------------
# Preprocessing (TFF's baseline, unchanged).
# --------------------------------------------------------------------------


def special_tokens(vocab_size: int = VOCAB_SIZE, num_oov_buckets: int = NUM_OOV_BUCKETS):
  """TFF's layout: pad 0, words 1..V, OOV V+1.., bos V+#oov+1, eos V+#oov+2."""
  return so_pre.get_special_tokens(vocab_size, num_oov_buckets)


def preprocess(
  dataset: tf.data.Dataset,
  vocab: Sequence[str],
  *,
  seed: Optional[int] = None,
  shuffle_buffer: int = 1000,
  sequence_length: int = SEQUENCE_LENGTH,
  max_elements: int = MAX_ELEMENTS,
  batch_size: int = BATCH_SIZE,
  num_oov_buckets: int = NUM_OOV_BUCKETS,
) -> tf.data.Dataset:
  """`{'tokens': str}` dataset -> batches of `(x, y)` int64 [batch, seq_len].

  TFF's `word_prediction_preprocessing.create_preprocess_fn` with
  `ClientSpec(num_epochs=1, batch_size, max_elements, shuffle_buffer_size=1)`;
  the shuffle is done here with an explicit `seed` because TFF's is unseeded.
  `seed=None` keeps the SQL order (deterministic: the first 256 sentences).
  """
  if seed is not None and shuffle_buffer > 1:
    dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
  spec = client_spec.ClientSpec(
    num_epochs=1, batch_size=batch_size, max_elements=max_elements, shuffle_buffer_size=1
  )
  fn = so_pre.create_preprocess_fn(
    spec, list(vocab), sequence_length=sequence_length, num_out_of_vocab_buckets=num_oov_buckets
  )
  return fn(dataset)


class TokenIds:
  """Numpy twin of TFF's `build_to_ids_fn` + `batch_and_split` (1 OOV bucket).

  `word_prediction_preprocessing.build_to_ids_fn`: split on ' ' (empty strings
  between double spaces are words, hence OOV), keep the first
  `sequence_length` words, id = vocab index + 1 (unknown -> V + 1), append eos
  only if fewer than `sequence_length` words, prepend bos; `batch_and_split`
  pads to `sequence_length + 1` with 0 and returns x = ids[:, :-1],
  y = ids[:, 1:]. `test_stackoverflow_data.py` checks equality with TFF's.
  """

  def __init__(self, vocab: Sequence[str], sequence_length: int = SEQUENCE_LENGTH):
    self._lookup = {w.encode('utf-8'): i + 1 for i, w in enumerate(vocab)}
    tokens = special_tokens(len(vocab), 1)
    self.oov = tokens.out_of_vocab[0]
    self.bos = tokens.beginning_of_sentence
    self.eos = tokens.end_of_sentence
    self.sequence_length = sequence_length

  def sequences(self, sentences: Sequence[bytes]) -> np.ndarray:
    """int64 [len(sentences), sequence_length + 1]: bos, ids, eos, 0-padding."""
    length = self.sequence_length
    out = np.zeros((len(sentences), length + 1), np.int64)
    get = self._lookup.get
    for row, sentence in enumerate(sentences):
      words = sentence.split(b' ')[:length]
      ids = [self.bos] + [get(w, self.oov) for w in words]
      if len(words) < length:
        ids.append(self.eos)
      out[row, : len(ids)] = ids
    return out


def select_sentences(
  sentences: Sequence[bytes], max_elements: int = MAX_ELEMENTS, seed: Optional[int] = None
) -> list[bytes]:
  """At most `max_elements` sentences: the first ones (seed None) or a seeded
  uniform sample in random order (TFF instead takes the first `max_elements`
  of an unseeded `shuffle(1000)`)."""
  if seed is None or len(sentences) <= 1:
    return list(sentences[:max_elements])
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(sentences))[:max_elements]
  return [sentences[i] for i in order]


def client_arrays(
  sentences: Sequence[bytes],
  token_ids: TokenIds,
  *,
  max_elements: int = MAX_ELEMENTS,
  seed: Optional[int] = None,
) -> tuple[np.ndarray, np.ndarray]:
  """(x, y) int64 [n, sequence_length] for one client, n <= max_elements."""
  seq = token_ids.sequences(select_sentences(sentences, max_elements, seed))
  return seq[:, :-1], seq[:, 1:]


def as_batched_dataset(
  x: np.ndarray, y: np.ndarray, batch_size: int = BATCH_SIZE
) -> tf.data.Dataset:
  """`tf.data` of (x, y) batches, the element type TFF's `preprocess` yields (autotuning off for
  TFF's worker: `fedmf.tff.client_data`)."""
  return client_data.worker_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size))


# --------------------------------------------------------------------------
# The task.
# --------------------------------------------------------------------------


class StackOverflowTask(ArrayTask):
  """The `stackoverflow` task: train clients of the file, a seeded sample of test sentences."""

  name = "stackoverflow"

  def __init__(self, *, data_dir: str, num_clients: int, **settings: Any):
    """`settings`: the keywords of `ArrayTask` (preset, vocab_size, sequence_length, ...)."""
    super().__init__(**settings)
    path = sqlite_path(data_dir)
    try:
      # TFF's save_to_sql_client_data writes no index on client_id: the file is left as it is
      # (it may be read-only or shared) and its client rows are found by one cached scan.
      rows = None if has_client_index(path) else sqlite_rows.client_rows(path)
      self.train = StackOverflowClients(path, 'train', rows)
      self.test = StackOverflowClients(path, 'test', rows)
    except (sqlite3.Error, ValueError, tf.errors.OpError) as e:
      first = str(e).splitlines()[0] if str(e) else type(e).__name__
      raise MissingDataError(
        f"{path} is not a StackOverflow sqlite file in TFF's schema: {first}"
      ) from None
    if not self.train.client_ids:
      raise MissingDataError(f'{path} has no train clients')
    self._ids = self.train.client_ids[:num_clients]
    self.vocab = build_vocab(data_dir, self.vocab_size)
    self.token_ids = TokenIds(self.vocab, self.sequence_length)

  @property
  def num_clients(self) -> int:
    return len(self._ids)

  def client_id(self, index: int) -> str:
    return self._ids[int(index)]

  def client_arrays(self, index: int):
    sentences = self.train.fetch_sentences(self.client_id(index))
    return client_arrays(
      sentences,
      self.token_ids,
      max_elements=self.max_sentences,
      seed=None if self.seed is None else self.seed + int(index),
    )

  def test_arrays(self):
    """A seeded sample of `test_sentences` sentences from the test split's clients."""
    rng = np.random.default_rng([self.seed, 7])
    ids = list(self.test.client_ids)
    rng.shuffle(ids)
    rows = []
    for client in ids:
      rows.extend(self.test.fetch_sentences(client))
      if len(rows) >= self.test_sentences:
        break
    if not rows:
      raise MissingDataError('the StackOverflow file has no test sentences')
    seq = self.token_ids.sequences(rows[: self.test_sentences])
    return seq[:, :-1], seq[:, 1:]

  def describe(self):
    return {**super().describe(), 'train_clients_in_file': len(self.train.client_ids)}
