"""fedmf.participation: formats, validation errors, the atomic writer, round trips."""

import gzip
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as hs

from fedmf.privacy import log_reader, participation_log as P

EXTS = ["csv", "csv.gz", "jsonl", "jsonl.gz", "parquet"]


@pytest.mark.parametrize("ext", EXTS)
def test_roundtrip_with_extra_columns(tmp_path, ext):
  path = tmp_path / f"log.{ext}"
  with P.ParticipationLogWriter(path) as w:
    w.write_round(0, ["a", "b"], timestamp=1.5)
    w.flush()
    w.write_round(3, [7, "a"], timestamp=2.5)
    assert not path.exists()  # Atomic: only the partial file exists before close.
  assert path.exists() and not list(tmp_path.glob(".*partial*"))
  t = P.read_participation_log(path)
  assert t.column_names == ["round", "client_id", "timestamp"]
  assert t.column("round").to_pylist() == [0, 0, 3, 3]
  assert t.column("client_id").to_pylist() == ["a", "b", "7", "a"]
  assert t.column("timestamp").to_pylist() == [1.5, 1.5, 2.5, 2.5]
  arr = P.read_participation_arrays(path)
  assert arr.rows == 4
  assert [arr.client_ids[c].as_py() for c in arr.codes] == ["a", "b", "7", "a"]
  assert arr.rounds.tolist() == [0, 0, 3, 3]


def test_writer_aborts_on_exception(tmp_path):
  path = tmp_path / "log.csv"
  with pytest.raises(RuntimeError):
    with P.ParticipationLogWriter(path) as w:
      w.write_round(0, ["a"])
      raise RuntimeError("crash")
  assert not path.exists()
  assert not list(tmp_path.iterdir())


def test_writer_rejects_bad_rows(tmp_path):
  with P.ParticipationLogWriter(tmp_path / "log.csv") as w:
    with pytest.raises(ValueError):
      w.write_rows([-1], ["a"])
    with pytest.raises(ValueError):
      w.write_rows([1.5], ["a"])
    with pytest.raises(ValueError):
      w.write_rows([1], [""])


def _write(path, text):
  if str(path).endswith(".gz"):
    with gzip.open(path, "wt") as f:
      f.write(text)
  else:
    path.write_text(text)


@pytest.mark.parametrize(
  "name,text,match",
  [
    ("e.csv", "", "empty log"),
    ("h.csv", "round,client_id\n", "empty log"),
    ("m.csv", "round,client\n0,a\n", "missing column 'client_id'"),
    ("n.csv", "round,client_id\n0,a\n-1,b\n", "row 2: negative round -1"),
    ("f.csv", "round,client_id\n0,a\n1.5,b\n", "row 2: non-integer round 1.5"),
    ("i.csv", "round,client_id\n0,a\nnan,b\n", "row 2: non-finite round"),
    ("j.csv", "round,client_id\n0,a\ninf,b\n", "row 2: non-finite round"),
    ("x.csv", "round,client_id\n0,a\n1,\n", "row 2: missing client_id"),
    ("g.csv.gz", "round,client_id\n0,a\n-3,b\n", "negative round"),
    ("e.jsonl", "", "empty log"),
    ("m.jsonl", '{"round": 0}\n', "missing column 'client_id'"),
    ("n.jsonl", '{"round": 0, "client_id": "a"}\n{"round": -2, "client_id": "b"}\n', "negative"),
    ("f.jsonl", '{"round": 0.5, "client_id": "a"}\n', "non-integer round"),
    ("s.jsonl", '{"round": "x", "client_id": "a"}\n', "round"),
    ("b.jsonl", '{"round": 0, "client_id": "a"\n', "line 1"),
    ("u.txt", "round,client_id\n", "unknown participation log extension"),
  ],
)
def test_bad_input_one_line_errors(tmp_path, name, text, match):
  path = tmp_path / name
  _write(path, text)
  with pytest.raises(P.ParticipationLogError, match=match) as e:
    P.read_participation_log(path)
  assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
  with pytest.raises(P.ParticipationLogError, match="no such participation log"):
    P.read_participation_arrays(tmp_path / "nope.csv")


def test_parquet_missing_column_and_float_rounds(tmp_path):
  import pyarrow.parquet as pq

  pq.write_table(pa.table({"round": [0, 1], "who": ["a", "b"]}), tmp_path / "a.parquet")
  with pytest.raises(P.ParticipationLogError, match="missing column 'client_id'"):
    P.read_participation_log(tmp_path / "a.parquet")
  pq.write_table(
    pa.table({"round": [0.0, float("nan")], "client_id": ["a", "b"]}), tmp_path / "b.parquet"
  )
  with pytest.raises(P.ParticipationLogError, match="non-finite"):
    P.read_participation_log(tmp_path / "b.parquet")


@settings(max_examples=25, deadline=None)
@given(
  hs.lists(
    hs.tuples(hs.integers(0, 30), hs.sampled_from(["a", "b", "c", "7", "x y"])),
    min_size=1,
    max_size=40,
  ),
  hs.sampled_from(EXTS),
)
def test_random_roundtrip(tmp_path_factory, rows, ext):
  path = tmp_path_factory.mktemp("rt") / f"log.{ext}"
  P.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  arr = P.read_participation_arrays(path)
  assert list(zip(arr.rounds.tolist(), [arr.client_ids[c].as_py() for c in arr.codes])) == rows
  os.remove(path)


# Client ids of various shapes: decimal (packed raw or compact), long ids sharing prefixes (> 16 bytes,
# not packable when the alphabet is large), unicode (the non-ASCII packing path) and odd ASCII.
_ids = hs.one_of(
  hs.integers(0, 10**20).map(str),
  hs.text(alphabet="ab", min_size=1, max_size=24),
  hs.sampled_from(
    [
      "client-",
      "client-000000000000000000000",
      "é",
      "éé",
      "日本",
      "a b",
      "~",
      "x" * 40,
      "0",
      "00",
      "BandMF",
    ]
  ),
  hs.text(
    alphabet=hs.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters=',"'),
    min_size=1,
    max_size=20,
  ),
)


def _check_arrays(arr, rounds, ids):
  """Codes number the ids in order of first appearance, as dictionary_encode would."""
  expected_dict = list(dict.fromkeys(ids))
  assert arr.client_ids.to_pylist() == expected_dict
  index = {c: i for i, c in enumerate(expected_dict)}
  assert arr.codes.tolist() == [index[c] for c in ids]
  assert arr.rounds.tolist() == list(rounds)


@settings(max_examples=60, deadline=None)
@given(
  hs.lists(hs.tuples(hs.integers(0, 50), _ids), min_size=1, max_size=60),
  hs.sampled_from(["csv", "parquet", "jsonl"]),
  hs.booleans(),
)
def test_arrays_match_python_on_random_ids(tmp_path_factory, rows, ext, dup):
  if dup:  # Repeated (round, client) rows and repeated clients.
    rows = rows + rows[: len(rows) // 2]
  path = tmp_path_factory.mktemp("ids") / f"log.{ext}"
  P.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  arr = P.read_participation_arrays(path)
  _check_arrays(arr, [r for r, _ in rows], [c for _, c in rows])
  os.remove(path)


@pytest.mark.parametrize(
  "batches",
  [
    [["1", "12", "12345678", "007", "7", "12"]],
    [["123456789012", "1", "123456789012", "0000000000000000"]],  # Two key words.
    [["é", "éé", "a", "é", "aé"], ["日本", "é"]],  # Non-ASCII bytes.
    [["a", "b", "a"], ["a\x00", "a", "\x00", "a\x00"], ["a", "\x00\x00"]],  # NUL: length word.
    [["y"], ["x" * 39, "y", "x" * 38], ["x" * 100, "x" * 39]],  # Widening between batches.
    [[chr(i) for i in range(1, 128)] * 2],
    [["0123456789abcdef0123", "f"]],
  ],
)
def test_client_index_codes_in_first_appearance_order(batches):
  """Codes number ids by first appearance across batches; client_ids() inverts them."""
  for sliced in (False, True):
    index = P.ClientIndex()
    seen: dict[str, int] = {}
    for ids in batches:
      arr = pa.array(ids, pa.string())
      if sliced:  # Arrow arrays with an offset into shared buffers.
        arr = pa.concat_arrays([pa.array(["zz"]), arr]).slice(1)
      codes = index.codes(arr)
      assert codes.dtype == np.int32
      for i in ids:
        seen.setdefault(i, len(seen))
      assert codes.tolist() == [seen[i] for i in ids]
    assert len(index) == len(seen)
    assert index.client_ids().to_pylist() == list(seen)


def test_client_index_many_ids_and_table_growth():
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 50_000, 200_000).astype(str)
  index = P.ClientIndex()
  codes = np.concatenate(
    [index.codes(pa.array(ids[i : i + 30_000])) for i in range(0, 200_000, 30_000)]
  )
  _, first = np.unique(ids, return_index=True)
  expected_order = ids[np.sort(first)]
  assert index.client_ids().to_pylist() == expected_order.tolist()
  assert (index.client_ids().to_numpy(zero_copy_only=False)[codes] == ids).all()


def test_csv_integral_float_rounds_after_first_block(tmp_path, monkeypatch):
  """Rounds parse as int64 first; a later '3.0' re-reads as float64 without losing or repeating rows."""
  monkeypatch.setattr(log_reader, "_CSV_BLOCK_SIZE", 64)
  rows = [(i % 7, f"c{i % 13}") for i in range(200)]
  text = "round,client_id\n" + "".join(f"{r},{c}\n" for r, c in rows[:150])
  text += "".join(f"{r}.0,{c}\n" for r, c in rows[150:])
  path = tmp_path / "log.csv"
  path.write_text(text)
  t = P.read_participation_log(path)
  assert list(zip(t.column("round").to_pylist(), t.column("client_id").to_pylist())) == rows
  _check_arrays(P.read_participation_arrays(path), [r for r, _ in rows], [c for _, c in rows])
  path.write_text(text + "2.5,c1\n")
  with pytest.raises(P.ParticipationLogError, match="row 201: non-integer round 2.5"):
    P.read_participation_arrays(path)
