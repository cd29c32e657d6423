"""Determinism, laziness and layout of the synthetic next-word generator."""

import numpy as np

from fedmf.tasks import synthetic as sn


def test_deterministic_and_independent_of_order():
  cfg = sn.SyntheticNwpConfig(vocab_size=500, num_clients=100_000, seed=3)
  a, b = sn.SyntheticNwp(cfg), sn.SyntheticNwp(cfg)
  x1, _ = a.client_arrays(99_999)
  a.client_arrays(5)
  x2, _ = b.client_arrays(99_999)
  assert np.array_equal(x1, x2)
  other = sn.SyntheticNwp(sn.SyntheticNwpConfig(vocab_size=500, seed=4)).client_arrays(99_999)[0]
  assert not np.array_equal(x1[:5], other[:5])


def test_tff_layout():
  g = sn.SyntheticNwp(sn.SyntheticNwpConfig(vocab_size=500))
  seq = g.client_sequences(1)
  assert seq.shape[1] == 21 and (seq[:, 0] == g.bos).all()
  assert seq.max() <= g.eos and seq.min() >= 0
  for row in seq:
    words = row[1:]
    n = int((words != 0).sum())
    if n <= 20 and g.eos in words:  # short: eos right after the words, then pad
      assert words[n - 1] == g.eos and (words[n:] == 0).all()
  x, y = g.client_arrays(1, max_sentences=256)
  assert np.array_equal(x[:, 1:], y[:, :-1]) and len(x) <= 256


def test_long_tailed_sizes_and_signal():
  g = sn.SyntheticNwp(sn.SyntheticNwpConfig(vocab_size=2000))
  sizes = np.array([g.num_sentences(i) for i in range(3000)])
  assert sizes.min() >= 8 and sizes.max() <= 512 and sizes.mean() > np.median(sizes)
  assert sizes[0] == len(g.client_sequences(0))
  _, ty = g.test_arrays(num_clients=50)
  assert g.oracle_accuracy(30) > 1.5 * g.unigram_baseline(ty)
