"""Tiny sqlite files in TFF's schema, read back through the real loader (no TFF context needed)."""

import os
import tempfile

import numpy as np
import pytest

from fedmf.tasks import stackoverflow as sod

CLIENTS = {
  'train': {
    '1': ['how do i sort a list in python ?', 'use sorted ( ) .'],
    '2': [
      'the quick brown fox jumps over the lazy dog and then some '
      'more words to exceed twenty tokens in total'
    ],
    '3': ['edit :', 'thanks .', 'zzzunknownword here'],
  },
  'heldout': {'10': ['held out sentence']},
  'test': {'1': ['a test sentence from client one'], '4': ['another test .']},
}


def _write(clients):
  d = tempfile.mkdtemp()
  sod.write_tiny_stackoverflow_sqlite(os.path.join(d, sod.SQLITE_NAME), clients)
  return d


def test_round_trip():
  d = _write(CLIENTS)
  data = sod.load_stackoverflow(d)
  assert sod.has_client_index(os.path.join(d, sod.SQLITE_NAME))
  assert data['train'].client_ids == ['1', '2', '3']
  assert data['test'].client_ids == ['1', '4']  # client '1' is in two splits
  got = [t['tokens'].numpy().decode() for t in data['train'].sentences('3')]
  assert got == CLIENTS['train']['3']
  assert [s.decode() for s in data['train'].fetch_sentences('3')] == CLIENTS['train']['3']


def test_tff_parser_reads_our_file():
  """TFF's own `_add_proto_parsing` (what load_data maps) parses our examples."""
  from tensorflow_federated.python.simulation.datasets import stackoverflow as so

  data = sod.load_stackoverflow(_write(CLIENTS))
  ex = next(iter(so._add_proto_parsing(data['test'].raw_dataset('1'))))
  assert list(ex) == ['creation_date', 'score', 'tags', 'title', 'tokens', 'type']
  assert ex['tokens'].numpy().decode() == CLIENTS['test']['1'][0]


def test_missing_file_names_path():
  d = tempfile.mkdtemp()
  with pytest.raises(sod.MissingDataError, match=os.path.join(d, sod.SQLITE_NAME)):
    sod.load_stackoverflow(d)


def test_vocab_from_counts_file_or_train_split():
  d = _write(CLIENTS)
  counted = sod.build_vocab(d, vocab_size=3)
  assert counted == ['.', 'in', '(']  # clients using the word; ties by word
  with open(os.path.join(d, sod.WORD_COUNT_NAME), 'w') as f:
    f.write('the 10\n. 9\nsort 3\npython 2\n')
  assert sod.build_vocab(d, 3) == ['the', '.', 'sort']


def test_tff_preprocess_layout():
  vocab = ['the', '.', 'sort', 'python']
  data = sod.load_stackoverflow(_write(CLIENTS))
  ((x, y),) = list(sod.preprocess(data['train'].sentences('1'), vocab))
  t = sod.special_tokens(len(vocab))
  assert (t.padding, t.out_of_vocab, t.beginning_of_sentence, t.end_of_sentence) == (0, [5], 6, 7)
  assert x.shape == (2, 20) and y.shape == (2, 20)
  assert x[0, 0] == 6 and list(y.numpy()[1, :6]) == [5, 5, 5, 5, 2, 7]


def test_cap_and_seeded_shuffle():
  many = {'train': {'9': [f'w{i} the sort' for i in range(300)]}, 'heldout': {}, 'test': {}}
  clients = sod.load_stackoverflow(_write(many))['train']
  a = list(sod.preprocess(clients.sentences('9'), ['the'], seed=1))
  b = list(sod.preprocess(clients.sentences('9'), ['the'], seed=1))
  assert [int(v[0].shape[0]) for v in a] == [16] * 16
  assert all(np.array_equal(p[0], q[0]) for p, q in zip(a, b))


def test_fast_path_equals_tff():
  """sqlite3 + TokenIds reproduces TFF's create_preprocess_fn exactly (no shuffle)."""
  rng = np.random.default_rng(0)
  words = [f'w{i}' for i in range(50)]
  sents = [' '.join(rng.choice(words, size=rng.integers(0, 30))) for _ in range(300)]
  sents += ['double  space', ' leading', 'trailing ', '', 'ünïcödé w3']
  clients = sod.load_stackoverflow(_write({'train': {'7': sents}, 'heldout': {}, 'test': {}}))[
    'train'
  ]
  vocab = [f'w{i}' for i in range(30)] + ['ünïcödé']
  for cap in (256, 1000):
    ref = list(sod.preprocess(clients.sentences('7'), vocab, max_elements=cap))
    rx = np.concatenate([b[0].numpy() for b in ref])
    ry = np.concatenate([b[1].numpy() for b in ref])
    x, y = sod.client_arrays(clients.fetch_sentences('7'), sod.TokenIds(vocab), max_elements=cap)
    assert np.array_equal(rx, x) and np.array_equal(ry, y), cap


def _task(d, **kw):
  args = dict(
    data_dir=d,
    num_clients=10,
    vocab_size=5,
    preset='lstm-small',
    sequence_length=20,
    batch_size=2,
    max_sentences=256,
    test_sentences=10,
    seed=0,
  )
  args.update(kw)
  return sod.StackOverflowTask(**args)


def test_task_reads_clients_lazily_and_reads_unindexed_files_through_a_cached_scan(
  tmp_path, monkeypatch
):
  monkeypatch.setenv('FEDMF_CACHE_DIR', str(tmp_path / 'cache'))
  d = _write(CLIENTS)
  task = _task(d)
  assert task.num_clients == 3 and task.client_id(2) == '3'
  x, y = task.client_arrays(0)
  assert x.shape == (2, 20) and np.array_equal(x[:, 1:], y[:, :-1])
  tx, _ = task.test_arrays()
  assert tx.shape == (2, 20)
  assert _task(d, num_clients=2).num_clients == 2
  bare = tempfile.mkdtemp()
  sod.write_tiny_stackoverflow_sqlite(os.path.join(bare, sod.SQLITE_NAME), CLIENTS, index=False)
  bare_file = os.path.join(bare, sod.SQLITE_NAME)
  before = open(bare_file, 'rb').read()
  unindexed = _task(bare)  # Was refused (issue 26, B.6): the same clients, rows and order now.
  assert not sod.has_client_index(bare_file) and open(bare_file, 'rb').read() == before
  assert [unindexed.client_id(i) for i in range(3)] == ['1', '2', '3']
  for i in range(3):
    assert all(
      np.array_equal(a, b) for a, b in zip(unindexed.client_arrays(i), task.client_arrays(i))
    )
  assert np.array_equal(unindexed.test_arrays()[0], tx)
  assert len(list((tmp_path / 'cache' / 'stackoverflow-rows').glob('*.sqlite'))) == 1
  broken = tempfile.mkdtemp()
  with open(os.path.join(broken, sod.SQLITE_NAME), 'w') as f:
    f.write('not a database')
  with pytest.raises(sod.MissingDataError):
    _task(broken)
