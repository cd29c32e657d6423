"""The MovieLens readers: four layouts read the same, bad rows named by line, repeats never counted
twice (tests/public_features/movielens_files.py writes the files)."""

import numpy as np
import pytest

from fedmf.public_features import movielens
from fedmf.public_features.data import DataError
from tests.public_features import movielens_files as files

LAYOUTS = files.LAYOUTS


def _load(layout, directory, duplicates="refuse"):
  return movielens.load(layout, directory, duplicates)


def _same(a, b):
  (ra, fa, na), (rb, fb, nb) = a, b
  assert na == nb and fa.names == fb.names
  for x, y in zip(fa.bags, fb.bags):
    np.testing.assert_array_equal(x.toarray(), y.toarray())
  for k in ("users", "items", "values"):
    np.testing.assert_array_equal(getattr(ra, k), getattr(rb, k))


def test_the_four_layouts_give_the_same_ratings_and_features(tmp_path):
  rows = files.random_rows(np.random.default_rng(0))
  loaded = [_load(layout, files.write(layout, tmp_path / layout, rows)) for layout in LAYOUTS]
  for other in loaded[1:]:
    _same(loaded[0], other)
  ratings, features, num_users = loaded[0]
  assert num_users == 60 and len(ratings) == 240
  year, genres = features.bags
  assert year.shape == (6, 3)  # 1995, 2001 and unknown (a title without a year)
  np.testing.assert_allclose(np.asarray(genres.sum(axis=1)).ravel(), 1.0)  # averaged bags
  np.testing.assert_allclose(sorted(genres[0].data), [1 / 3] * 3)  # Toy Story: three genres


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bom_and_crlf_are_read_as_plain_files(tmp_path, layout):
  rows = files.random_rows(np.random.default_rng(1), num_users=8)
  plain = _load(layout, files.write(layout, tmp_path / "plain", rows))
  _same(plain, _load(layout, files.write(layout, tmp_path / "crlf", rows, "\r\n", bom=True)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_repeated_rating_is_refused_naming_its_line_or_merged_into_its_mean(tmp_path, layout):
  rows = [(1, 1, 4.0), (1, 2, 3.0), (2, 1, 5.0), (1, 1, 2.0), (1, 1, 3.0), (3, 7, 1.0)]
  directory = files.write(layout, tmp_path, rows)
  header = 1 if layout == "movielens-20m" else 0
  with pytest.raises(DataError) as refused:
    _load(layout, directory)
  message = str(refused.value)
  name = movielens.LAYOUTS[layout].ratings
  assert f"{name}:{4 + header}: user 1 rated movie 1 again (first at line {1 + header})" in message
  assert "duplicates=mean" in message and "\n" not in message
  ratings, _, _ = _load(layout, directory, "mean")
  # One row per pair, in order of first occurrence; the pair (1, 1) counted once at its mean.
  assert len(ratings) == 4
  np.testing.assert_array_equal(ratings.users, [0, 0, 1, 2])
  np.testing.assert_allclose(ratings.values, [3.0, 3.0, 5.0, 1.0])


BAD_ROWS = [
  ("7\t1\t4", "expected 4 fields"),
  ("7\t1\t4\t0\t9", "expected 4 fields"),
  ("x\t1\t4\t0", "user id 'x' is not an integer"),
  ("-3\t1\t4\t0", "user id -3 is not an integer in [0, 2^63)"),
  ("100000000000000000000000\t1\t4\t0", "user id 100000000000000000000000 is not an integer in"),
  ("7\t1.5\t4\t0", "movie id '1.5' is not an integer"),
  ("7\t1\tfive\t0", "rating 'five' is not a number"),
  ("7\t1\t1e308\t0", "rating 1e308 is not a finite number in [-1e6, 1e6]"),
  ("7\t1\tnan\t0", "rating nan is not a finite number"),
  ("7\t1\t\t0", "rating '' is not a number"),
  ("7\t99\t4\t0", "movie 99 is not in the movies file"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_a_bad_ratings_row_is_refused_with_its_file_and_line(tmp_path, layout, bad, message):
  rows = files.random_rows(np.random.default_rng(2), num_users=5)
  directory = files.write(layout, tmp_path, rows)
  path = directory / movielens.LAYOUTS[layout].ratings
  separator = movielens.LAYOUTS[layout].separator
  with open(path, "a", encoding="utf-8") as f:
    f.write(bad.replace("\t", separator) + "\n")
  with pytest.raises(DataError) as refused:
    _load(layout, directory)
  line = len(rows) + 1 + (layout == "movielens-20m")
  assert str(refused.value).startswith(f"{path}:{line}: ")
  assert message in str(refused.value)


def test_a_bad_row_in_a_later_block_is_named_by_its_line(tmp_path):
  rows = files.random_rows(np.random.default_rng(3), num_users=200)  # 800 rows, ~20 bytes each
  directory = files.write("movielens-100k", tmp_path, rows)
  whole = movielens.read_ratings(
    directory / "u.data", "movielens-100k", dict.fromkeys([1, 2, 3, 4, 5, 7])
  )
  blocks = movielens.read_ratings(
    directory / "u.data", "movielens-100k", dict.fromkeys([1, 2, 3, 4, 5, 7]), block_bytes=100
  )
  for x, y in zip(whole, blocks):
    np.testing.assert_array_equal(x, y)
  text = (directory / "u.data").read_text().splitlines()
  text[700] = "1\t1\tbad\t0"
  (directory / "u.data").write_text("\n".join(text) + "\n")
  with pytest.raises(DataError, match=r"u\.data:701: rating 'bad' is not a number"):
    movielens.read_ratings(
      directory / "u.data", "movielens-100k", dict.fromkeys([1, 2, 3, 4, 5, 7]), block_bytes=100
    )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_movie_listed_twice_is_refused_with_both_lines(tmp_path, layout):
  directory = files.write(layout, tmp_path, files.random_rows(np.random.default_rng(4), 3))
  path = directory / movielens.LAYOUTS[layout].movies
  lines = path.read_text(encoding="latin-1").splitlines()
  lines.append(lines[-1])
  path.write_text("\n".join(lines) + "\n", encoding="latin-1")
  with pytest.raises(DataError) as refused:
    _load(layout, directory)
  last = len(lines)
  assert f"{path}:{last}: movie 7 is listed again (first at line {last - 1})" in str(refused.value)


def test_ml100k_rows_need_all_nineteen_genre_flags(tmp_path):
  directory = files.write("movielens-100k", tmp_path, [(1, 1, 3.0)])
  path = directory / "u.item"
  lines = path.read_text(encoding="latin-1").splitlines()
  lines[2] = lines[2].rsplit("|", 1)[0]
  path.write_text("\n".join(lines) + "\n", encoding="latin-1")
  with pytest.raises(DataError, match=r"u\.item:3: expected 24 fields .* got 23"):
    _load("movielens-100k", directory)


def test_missing_files_are_named(tmp_path):
  with pytest.raises(DataError, match="looked for u.item, u.data"):
    _load("movielens-100k", tmp_path)
