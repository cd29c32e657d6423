"""Client ids as dense integer codes: ``ClientIndex``, and a log read as (rounds, codes) arrays.

``ClientIndex`` is a hash table over the ids' bytes vectorized with numpy: codes number the clients
in order of first appearance (as ``pyarrow.compute.dictionary_encode`` would), so a second pass with
the same index gives the same codes. ``read_participation_arrays`` reads only (round, client_id): 12
bytes a row plus the distinct ids.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa

from fedmf.privacy.log_format import CLIENT_ID, REQUIRED_COLUMNS, ROUND
from fedmf.privacy.log_reader import LogTail, iter_log_batches


@dataclasses.dataclass(frozen=True)
class ParticipationArrays:
  """A log as flat arrays, for the auditor: row i is (rounds[i], client_ids[codes[i]]).

  Attributes:
    rounds: int64 [rows].
    codes: int32/int64 [rows], index into ``client_ids``.
    client_ids: pyarrow StringArray of the distinct client ids.
  """

  rounds: np.ndarray
  codes: np.ndarray
  client_ids: pa.Array
  cut_off_row: Optional[int] = None  # See LogTail.

  @property
  def rows(self) -> int:
    return int(self.rounds.shape[0])


def iter_participation_codes(
  path: str | os.PathLike[str],
  index: "ClientIndex",
  progress: bool = False,
  end: Optional[LogTail] = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """Streams a log as (rounds int64, codes int32) per batch; ``index`` maps ids to codes.

  New ids are added to ``index`` (codes number the clients in order of first appearance), so a
  second pass with the same index gives the same codes. Memory: one batch plus the index.
  """
  for table in iter_log_batches(path, columns=REQUIRED_COLUMNS, progress=progress, end=end):
    rounds = table.column(ROUND).to_numpy()
    chunks = table.column(CLIENT_ID).chunks
    codes = (
      index.codes(chunks[0])
      if len(chunks) == 1
      else np.concatenate([index.codes(chunk) for chunk in chunks])
    )
    yield rounds, codes


def read_participation_arrays(
  path: str | os.PathLike[str], progress: bool = False
) -> ParticipationArrays:
  """Reads only (round, client_id) into numpy rounds + codes (12 bytes/row + the distinct ids).

  ``codes`` number the clients in order of first appearance in the log and ``client_ids`` lists them
  in that order (as ``pyarrow.compute.dictionary_encode`` would), through ``ClientIndex``.
  """
  index = ClientIndex()
  end = LogTail()
  round_chunks: list[np.ndarray] = []
  code_chunks: list[np.ndarray] = []
  for rounds, codes in iter_participation_codes(path, index, progress=progress, end=end):
    round_chunks.append(rounds)
    code_chunks.append(codes)
  return ParticipationArrays(
    rounds=np.concatenate(round_chunks).astype(np.int64, copy=False),
    codes=np.concatenate(code_chunks),
    client_ids=index.client_ids(),
    cut_off_row=end.cut_off_row,
  )


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
  """(offsets [len+1], data uint8) of a string/large_string array, as zero-copy numpy views."""
  off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
  bufs = arr.buffers()
  offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset : arr.offset + len(arr) + 1]
  data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
  return offsets, data


# Masks keeping the first l bytes of a little-endian 64-bit word, l = 0..8.
_BYTE_MASKS = np.array([(1 << (8 * l)) - 1 for l in range(8)] + [(1 << 64) - 1], dtype=np.uint64)
# Odd multipliers: words of a long id are combined with the next ones, the hash is a multiply,
# xor-shift, multiply (splitmix64's constants; Steele, Lea & Flood 2014).
_WORD_MULTIPLIERS = (0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x9E3779B97F4A7C15)
_HASH_1 = np.uint64(0x9E3779B97F4A7C15)
_HASH_2 = np.uint64(0xBF58476D1CE4E5B9)


def _id_words(arr: pa.Array, num_words: int) -> tuple[list[np.ndarray], np.ndarray, bool]:
  """Each id's bytes, zero-padded to ``num_words`` little-endian 64-bit words (vectorized).

  Returns (words: ``num_words`` uint64 arrays, lengths, whether some id has a NUL byte). Ids longer
  than ``8 * num_words`` bytes are the caller's to widen (``lengths`` tells). Each word is one
  unaligned 8-byte load per id through a byte-strided view of arrow's data buffer, masked to the
  id's length: no copy of the strings.
  """
  offsets, data = _string_buffers(arr)
  lengths = np.diff(offsets)
  lo, hi = int(offsets[0]), int(offsets[-1])
  has_nul = bool(hi > lo and np.count_nonzero(data[lo:hi]) != hi - lo)
  size = data.shape[0]
  if size < 16:  # Tiny buffer: a zero-padded copy is simplest.
    data = np.concatenate([data, np.zeros(16, np.uint8)])
    size = data.shape[0]
  # words_at[p] = the 8 bytes data[p:p+8], for p <= size - 8.
  words_at = np.ndarray(shape=(size - 7,), dtype="<u8", buffer=data, strides=(1,))
  # Loads starting in the last 8 bytes of the buffer read a zero-padded copy of its tail instead.
  tail = np.zeros(24, dtype=np.uint8)
  tail[:8] = data[size - 8 :]
  tail_words = np.ndarray(shape=(17,), dtype="<u8", buffer=tail, strides=(1,))
  starts = offsets[:-1]
  words = []
  for j in range(num_words):
    # Starts increase, so the ids whose j-th load would run past the buffer are a suffix.
    cut = int(np.searchsorted(starts, size - 8 - 8 * j, side="right"))
    word = np.empty(starts.shape[0], dtype=np.uint64)
    word[:cut] = words_at[starts[:cut] + 8 * j if j else starts[:cut]]
    if cut < starts.shape[0]:
      pos = starts[cut:].astype(np.int64) + 8 * j - (size - 8)
      word[cut:] = tail_words[np.clip(pos, 0, 16)]
    if j:
      word &= _BYTE_MASKS[np.clip(lengths - 8 * j, 0, 8)]
    else:
      word &= _BYTE_MASKS[np.minimum(lengths, 8)]
    words.append(word)
  return words, lengths, has_nul


class ClientIndex:
  """Client id strings -> dense int32 codes, numbered in order of first appearance.

  A hash table over the ids' bytes, vectorized over a batch of ids (no Python per row). An id's key
  is its bytes zero-padded to whole 64-bit words: injective as long as no id contains a NUL byte;
  once one does, the id's length is prepended as a further key word (and the table rebuilt). Key
  word 0 is never 0 (a length >= 1, or a first byte that is not NUL), so 0 marks an empty slot.

  Open addressing with linear probing (Knuth, TAOCP vol. 3, 6.4) at load <= 1/4, without
  wrap-around (a spill area follows the last home slot). A slot is one row of ``_cells``: the key
  words, then the code, so a lookup touches one cache line; about 88% of the ids are found in their
  home slot, and a random memory access is most of the cost, hence the low load. Arrow's own hash
  kernels (dictionary_encode, unique) are 10-100x slower than this on 10M-row logs
  (docs/benchmarks.md, section 2).

  Memory: 4 x 8 x (key words + 1) bytes per distinct client (64 bytes for ids of <= 8 bytes).
  """

  _LOAD_SHIFT = 2  # At most 2^-2 of the home slots hold a key.
  _SPILL = 64  # Slots after the last home slot that probes may use before the table grows.
  _INSERT_ROWS = 1 << 16
  _SLICE_ROWS = 1 << 19

  def __init__(self):
    self._num_words = 1  # Byte words per key.
    self._with_length = False  # Keys start with a length word (an id had a NUL byte).
    self._size = 0
    self._allocate(10)

  def __len__(self) -> int:
    return self._size

  @property
  def _width(self) -> int:
    return self._num_words + self._with_length

  def _allocate(self, bits: int) -> None:
    """Empty cells: 2^bits home slots + spill + one slot never used (it ends every probe)."""
    self._bits = bits
    self._cells = np.zeros(((1 << bits) + self._SPILL + 1, self._width + 1), np.uint64)

  def _key_col(self, j: int) -> np.ndarray:
    return self._cells[:, j]

  def _code_col(self) -> np.ndarray:
    return self._cells[:, -1].view(np.int64)

  # -- keys and hashing --------------------------------------------------------------------------

  def _batch_keys(self, ids: pa.Array) -> list[np.ndarray]:
    """The key words of a batch of ids, widening the index first if the batch needs it."""
    offsets, _ = _string_buffers(ids)
    needed = max(1, -(-int(np.diff(offsets).max()) // 8))
    if needed > self._num_words:  # Zero words change neither keys nor hashes: add empty columns.
      cells = np.zeros(
        (self._cells.shape[0], self._width + 1 + needed - self._num_words), np.uint64
      )
      cells[:, : self._width] = self._cells[:, : self._width]
      cells[:, -1] = self._cells[:, -1]
      self._cells = cells
      self._num_words = needed
    words, lengths, has_nul = _id_words(ids, self._num_words)
    if has_nul and not self._with_length:
      self._add_length_word()
    if self._with_length:
      return [lengths.astype(np.uint64)] + words
    return words

  def _add_length_word(self) -> None:
    """Prepends each key's length (no id so far had a NUL byte: its nonzero bytes), rehashes."""
    keys, codes = self._entries()
    mat = np.stack(keys, axis=1).astype("<u8").view(np.uint8).reshape(codes.shape[0], 8 * len(keys))
    lengths = np.count_nonzero(mat, axis=1).astype(np.uint64)
    self._with_length = True
    self._rebuild(self._bits, [lengths] + keys, codes)

  def _hash(self, keys: list[np.ndarray]) -> np.ndarray:
    """64-bit hashes: multiply, xor-shift, multiply of the words (combined by odd multipliers)."""
    h = keys[0] * _HASH_1
    for j, word in enumerate(keys[1:]):
      h ^= word * np.uint64(_WORD_MULTIPLIERS[j % len(_WORD_MULTIPLIERS)])
    h ^= h >> np.uint64(29)
    h *= _HASH_2
    return h

  def _hash_slots(self, keys: list[np.ndarray], bits: Optional[int] = None) -> np.ndarray:
    """Home slots: the top ``bits`` bits of the hash."""
    h = self._hash(keys)
    h >>= np.uint64(64 - (self._bits if bits is None else bits))
    return h.view(np.int64)

  def _entries(self) -> tuple[list[np.ndarray], np.ndarray]:
    """(key words, codes) of the occupied slots."""
    used = np.nonzero(self._key_col(0))[0]  # (flatnonzero would copy the strided column)
    return [self._key_col(j)[used] for j in range(self._width)], self._code_col()[used]

  def _lookup(self, slot: np.ndarray, keys: list[np.ndarray], rows=None):
    """(whether slot i holds row i's key, the slot's code): one take of whole cells."""
    cells = np.take(self._cells, slot, axis=0)
    match = None
    for j, word in enumerate(keys):
      eq = cells[:, j] == (word if rows is None else word[rows])
      match = eq if match is None else np.logical_and(match, eq, out=match)
    return match, cells[:, -1].view(np.int64)

  # -- lookups and inserts -----------------------------------------------------------------------

  def _find(self, keys: list[np.ndarray]) -> np.ndarray:
    """Codes of the keys, -1 where absent."""
    hit, codes = self._lookup(self._hash_slots(keys), keys)
    if hit.all():
      return codes
    codes = codes.copy()
    miss = np.flatnonzero(~hit)
    # Linear probing from the home slot: a probe ends at the key or at an empty slot.
    codes[miss] = -1
    pending, slot = miss, self._hash_slots([k[miss] for k in keys])
    key0 = self._key_col(0)
    while pending.size:
      occupied = key0[slot] != 0
      pending, slot = pending[occupied], slot[occupied] + 1
      if not pending.size:
        break
      hit, found = self._lookup(slot, keys, pending)
      codes[pending[hit]] = found[hit]
      miss = ~hit
      pending, slot = pending[miss], slot[miss]
    return codes

  def _rebuild(self, bits: int, keys: list[np.ndarray], codes: np.ndarray) -> None:
    """A table of 2^bits home slots (or more, if the spill overflows) holding the given entries.

    Linear probing that inserts keys in order of home slot puts key i at
    pos_i = max(home_i, pos_(i-1) + 1), i.e. pos = maximum.accumulate(home - i) + i: one stable
    argsort (the old table is nearly in home order) and sequential writes, no probing.
    """
    h = self._hash(keys)
    while True:
      home = (h >> np.uint64(64 - bits)).view(np.int64)
      order = np.argsort(home, kind="stable")
      rank = np.arange(order.shape[0], dtype=np.int64)
      pos = np.maximum.accumulate(home[order] - rank) + rank if order.shape[0] else rank
      if not pos.shape[0] or pos[-1] < (1 << bits) + self._SPILL:
        break
      bits += 1
    self._allocate(bits)
    for j, word in enumerate(keys):
      self._key_col(j)[pos] = word[order]
    self._code_col()[pos] = codes[order]

  def _insert(self, keys: list[np.ndarray]) -> np.ndarray:
    """Adds absent keys (repeats allowed), numbered in order of first appearance; their codes.

    No sort: each row probes for its key or a free slot; a free slot is claimed by writing the
    row's key and provisional code -1 - row into it (one claimant wins it, the others see its key
    and either share the slot or probe on). The largest mark of a slot is its key's first row, and
    the first rows, in row order, receive the next codes. (A key already present resolves to its
    slot, whose code is >= 0, and keeps it.)
    """
    rows = keys[0].shape[0]
    if ((self._size + rows) << self._LOAD_SHIFT) > (1 << self._bits):
      self._rebuild(
        max(self._bits, (((self._size + rows) << self._LOAD_SHIFT) - 1).bit_length()),
        *self._entries(),
      )
    mark = -1 - np.arange(rows, dtype=np.int64)
    # Cell contents each row would claim: its key words, then its mark.
    claims = np.empty((rows, self._cells.shape[1]), np.uint64)
    for j, word in enumerate(keys):
      claims[:, j] = word
    claims[:, -1] = mark.view(np.uint64)
    row_slot = np.empty(rows, dtype=np.int64)
    pending = np.arange(rows)
    slot = self._hash_slots(keys)
    limit = (1 << self._bits) + self._SPILL
    key0, code_col = self._key_col(0), self._code_col()
    while pending.size:
      if slot.max() >= limit:  # Spill full: grow, drop the provisional entries, start over.
        self._rebuild(self._bits + 1, *self._entries_below(self._size))
        return self._insert(keys)
      # Free slots get a whole claimed cell (rows claiming one slot: the last write wins it);
      # a row is resolved when its slot then holds its key (its own claim or another row's).
      free = np.flatnonzero(key0[slot] == 0)
      self._cells[slot[free]] = claims[pending[free]]
      resolved, _ = self._lookup(slot, keys, pending)
      done = np.flatnonzero(resolved)
      row_slot[pending[done]] = slot[done]
      rest = ~resolved
      pending, slot = pending[rest], slot[rest] + 1
    np.maximum.at(code_col, row_slot, mark)  # The mark of each new key's first row.
    first = mark == code_col[row_slot]
    new = int(np.count_nonzero(first))
    code_col[row_slot[first]] = np.arange(self._size, self._size + new)
    self._size += new
    return code_col[row_slot].astype(np.int32)

  def _entries_below(self, size: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Entries with codes in [0, size): the table without provisional (negative) codes."""
    keys, codes = self._entries()
    keep = codes >= 0
    return [k[keep] for k in keys], codes[keep]

  def codes(self, ids: pa.Array) -> np.ndarray:
    """int32 codes of a string array of ids (non-null, non-empty), adding ids not seen before."""
    if len(ids) > self._SLICE_ROWS:  # Later slices then find what earlier ones added.
      return np.concatenate(
        [self.codes(ids.slice(lo, self._SLICE_ROWS)) for lo in range(0, len(ids), self._SLICE_ROWS)]
      )
    if not len(ids):
      return np.zeros(0, np.int32)
    keys = self._batch_keys(ids)
    codes = self._find(keys)
    missing = np.flatnonzero(codes < 0)
    # In slices, in row order (first appearance): a slice's probes stay short, and an id added by
    # an earlier slice just resolves to its slot.
    for lo in range(0, missing.shape[0], self._INSERT_ROWS):
      rows = missing[lo : lo + self._INSERT_ROWS]
      codes[rows] = self._insert([k[rows] for k in keys])
    return codes.astype(np.int32)

  # -- the dictionary ----------------------------------------------------------------------------

  def client_ids(self) -> pa.Array:
    """The distinct ids as a pyarrow string array, in code order."""
    count = self._size
    if not count:
      return pa.array([], pa.string())
    keys, codes = self._entries()
    by_code = np.empty((count, len(keys)), dtype="<u8")
    for j, k in enumerate(keys):
      by_code[codes, j] = k
    byte_words = by_code[:, 1:] if self._with_length else by_code
    mat = np.ascontiguousarray(byte_words).view(np.uint8).reshape(count, -1)
    if self._with_length:
      lengths = by_code[:, 0].astype(np.int64)
    else:
      lengths = np.count_nonzero(mat, axis=1)
    data = mat[np.arange(mat.shape[1]) < lengths[:, None]]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] < 2**31:
      return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)
      )
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
