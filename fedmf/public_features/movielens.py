"""MovieLens files as users have them: four layouts, read in a stream, refused row by row.

| data | files | layout |
|---|---|---|
| `movielens-100k` | `u.data`, `u.item` | tab-separated `user item rating timestamp`; `id|title|release date|video release date|IMDb URL|` then 19 genre flags |
| `movielens-1m`, `movielens-10m` | `ratings.dat`, `movies.dat` | `user::movie::rating::timestamp`; `movie::title::genres` (Latin-1 or UTF-8) |
| `movielens-20m` (also 25M) | `ratings.csv`, `movies.csv` | a header, then `userId,movieId,rating,timestamp`; `movieId,title,genres` with quoted titles |

Public item features: the release year (from the title, or ML-100K's release date) and the genres.

The ratings file is read in blocks (pyarrow's CSV parser on each block of whole lines), so memory
holds the parsed arrays, not the text. A UTF-8 byte order mark and CRLF line ends are accepted. A
bad row is refused with its file and line number: a wrong number of fields, an id that is not an
integer in [0, 2^63), a rating that is not a finite number of magnitude at most 1e6 (MAX_RATING),
a movie missing from the movies file, a movie listed twice in the movies file, and a user's second
rating of the same movie (`duplicates: refuse`, the default) — unless `duplicates: mean`, which
keeps the mean of a user's ratings of an item, counted once. A repeated rating would otherwise
enter the sufficient statistics once per copy while the privacy accounting counts it once
(Public features Thm. 2 assumes distinct items per user).
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from fedmf.public_features.data import DataError
from fedmf.public_features.data import ItemFeatures
from fedmf.public_features.data import Ratings
from fedmf.public_features.data import bags_from_tokens
from fedmf.public_features.data import first_repeat

MAX_RATING = 1e6  # |rating| above this is refused: no rating scale is that wide (1e308 was taken)
MAX_ID = 2**63 - 1
BLOCK_BYTES = 8 << 20  # ratings are parsed 8 MiB at a time
DUPLICATES = ("refuse", "mean")
# ML-100K's u.genre, in the order of u.item's 19 flags.
ML100K_GENRES = (
  *("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime"),
  *("Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance"),
  *("Sci-Fi", "Thriller", "War", "Western"),
)
NO_GENRES = "(no genres listed)"
_YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")
_YEAR_IN_DATE = re.compile(r"(\d{4})\s*$")


@dataclass(frozen=True)
class Layout:
  """How one MovieLens release writes its two files."""

  movies: str
  ratings: str
  separator: str  # between the fields of a ratings row
  header: str  # first field of the ratings file's header line ("" when it has none)


LAYOUTS = {
  "movielens-100k": Layout("u.item", "u.data", "\t", ""),
  "movielens-1m": Layout("movies.dat", "ratings.dat", "::", ""),
  "movielens-10m": Layout("movies.dat", "ratings.dat", "::", ""),
  "movielens-20m": Layout("movies.csv", "ratings.csv", ",", "userId"),
}


def files(data: str, data_dir: str | Path) -> tuple[Path, Path]:
  """(movies file, ratings file) of `data` in `data_dir`; missing ones are refused, naming them."""
  layout = LAYOUTS[data]
  directory = Path(data_dir)
  missing = [n for n in (layout.movies, layout.ratings) if not (directory / n).is_file()]
  if missing:
    raise DataError(f"{data} data not found: looked for {', '.join(missing)} in {directory}")
  return directory / layout.movies, directory / layout.ratings


def _decode(raw: bytes) -> str:
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    text = raw.decode("latin-1")  # ML-100K, ML-1M and ML-10M titles are Latin-1.
  return text[1:] if text.startswith("\ufeff") else text


def _movie_id(path: Path, number: int, text: str) -> int:
  try:
    movie = int(text.strip())
  except ValueError:
    raise DataError(f"{path}:{number}: movie id {text[:40]!r} is not an integer") from None
  if not 0 <= movie <= MAX_ID:
    raise DataError(f"{path}:{number}: movie id {text[:40]} is not an integer in [0, 2^63)")
  return movie


def _year(*texts: str) -> str:
  for pattern, text in zip((_YEAR_IN_TITLE, _YEAR_IN_DATE), texts):
    match = pattern.search(text.strip())
    if match:
      return match.group(1)
  return "unknown"


def _movie_rows(path: Path, data: str) -> Iterator[tuple[int, list[str]]]:
  """(line number, fields) of each non-empty line of a movies file (the CSV header skipped)."""
  text = _decode(path.read_bytes())
  lines = text.splitlines()
  if data == "movielens-20m":
    rows = csv.reader(lines)
  else:
    separator = "|" if data == "movielens-100k" else "::"
    rows = (line.split(separator) for line in lines)
  for number, row in enumerate(rows, start=1):
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    if data == "movielens-20m" and number == 1 and row[0].strip() == "movieId":
      continue
    yield number, row


def read_movies(path: Path, data: str) -> dict[int, tuple[list[str], list[str]]]:
  """{movie id: (year tokens, genre tokens)}; a malformed row or a repeated id is refused."""
  movies: dict[int, tuple[list[str], list[str]]] = {}
  lines: dict[int, int] = {}
  expected = 5 + len(ML100K_GENRES) if data == "movielens-100k" else 3
  for number, row in _movie_rows(path, data):
    if len(row) != expected:
      what = (
        "id|title|release date|video release date|IMDb URL|19 genre flags"
        if data == "movielens-100k"
        else "movieId, title, genres"
      )
      raise DataError(f"{path}:{number}: expected {expected} fields ({what}); got {len(row)}")
    movie = _movie_id(path, number, row[0])
    if movie in movies:
      raise DataError(
        f"{path}:{number}: movie {movie} is listed again (first at line {lines[movie]}); "
        "each movie must have one row"
      )
    if data == "movielens-100k":
      flags = row[5:]
      if any(f.strip() not in ("0", "1") for f in flags):
        raise DataError(f"{path}:{number}: the 19 genre flags must be 0 or 1")
      genres = [g for g, f in zip(ML100K_GENRES, flags) if f.strip() == "1"]
      year = _year(row[1], row[2])
    else:
      genres = [g for g in row[2].strip().split("|") if g]
      year = _year(row[1], "")
    movies[movie] = ([year], genres or [NO_GENRES])
    lines[movie] = number
  if not movies:
    raise DataError(f"{path}: no movies")
  return movies


# ---------------------------------------------------------------------------------------------
# Ratings, streamed.


def _blocks(path: Path, block_bytes: int) -> Iterator[tuple[int, bytes]]:
  """(number of the block's first line, whole lines of the block), a UTF-8 BOM dropped."""
  line = 1
  with open(path, "rb") as f:
    carry = f.read(3)
    if carry == b"\xef\xbb\xbf":
      carry = b""
    while True:
      chunk = f.read(block_bytes)
      data = carry + chunk
      if not chunk:
        if data.strip():
          yield line, data
        return
      cut = data.rfind(b"\n") + 1
      if cut == 0:
        carry = data
        continue
      yield line, data[:cut]
      line += data.count(b"\n", 0, cut)
      carry = data[cut:]


def _row_error(path: Path, number: int, fields: list[str], layout: Layout, movies) -> str | None:
  """What is wrong with one ratings row (None: nothing)."""
  if len(fields) != 4:
    return f"expected 4 fields (user, movie, rating, timestamp); got {len(fields)}"
  for name, text in (("user", fields[0]), ("movie", fields[1])):
    try:
      value = int(text.strip())
    except ValueError:
      return f"{name} id {text.strip()[:40]!r} is not an integer"
    if not 0 <= value <= MAX_ID:
      return f"{name} id {text.strip()[:40]} is not an integer in [0, 2^63)"
  try:
    rating = float(fields[2])
  except ValueError:
    return f"rating {fields[2].strip()[:40]!r} is not a number"
  if not math.isfinite(rating) or abs(rating) > MAX_RATING:
    return f"rating {fields[2].strip()[:40]} is not a finite number in [-1e6, 1e6]"
  if int(fields[1]) not in movies:
    return f"movie {int(fields[1])} is not in the movies file"
  return None


def _python_block(path: Path, first_line: int, block: bytes, layout: Layout, movies):
  """The rows of a block parsed in Python: the slow path that names the first bad line."""
  users, items, values = [], [], []
  text = _decode(block)
  rows = (
    csv.reader(text.splitlines())
    if layout.separator == ","
    else (line.split(layout.separator) for line in text.splitlines())
  )
  for number, fields in enumerate(rows, start=first_line):
    if not fields or (len(fields) == 1 and not fields[0].strip()):
      continue
    if number == 1 and layout.header and fields[0].strip() == layout.header:
      continue
    problem = _row_error(path, number, fields, layout, movies)
    if problem:
      raise DataError(f"{path}:{number}: {problem}")
    users.append(int(fields[0]))
    items.append(int(fields[1]))
    values.append(float(fields[2]))
  return (
    np.asarray(users, np.int64),
    np.asarray(items, np.int64),
    np.asarray(values, np.float64),
  )


def _arrow_block(block: bytes, layout: Layout, skip_header: bool):
  """The rows of a block parsed by pyarrow, or None when any row is not clean."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.csv as pa_csv  # pylint: disable=g-import-not-at-top

  if layout.separator == "::":
    block = block.replace(b"::", b"\t")
  names = ["user", "movie", "rating", "timestamp"]
  try:
    table = pa_csv.read_csv(
      io.BytesIO(block),
      read_options=pa_csv.ReadOptions(column_names=names, skip_rows=1 if skip_header else 0),
      parse_options=pa_csv.ParseOptions(delimiter="\t" if layout.separator != "," else ","),
      convert_options=pa_csv.ConvertOptions(
        column_types={"user": pa.int64(), "movie": pa.int64(), "rating": pa.float64()},
        include_columns=names[:3],
      ),
    )
  except (pa.ArrowInvalid, pa.ArrowTypeError):
    return None
  if any(table.column(n).null_count for n in names[:3]):
    return None
  return tuple(table.column(n).to_numpy() for n in names[:3])


def _clean(users, items, values, movie_ids: np.ndarray) -> bool:
  return bool(
    (users >= 0).all()
    and (items >= 0).all()
    and np.isfinite(values).all()
    and (np.abs(values) <= MAX_RATING).all()
    and np.isin(items, movie_ids).all()
  )


def read_ratings(path: Path, data: str, movies, block_bytes: int = BLOCK_BYTES):
  """(users, movies, ratings) as raw ids, streamed (module docstring); bad rows refused."""
  layout = LAYOUTS[data]
  movie_ids = np.fromiter(movies, np.int64, len(movies))
  parts = []
  for first_line, block in _blocks(path, block_bytes):
    skip = (
      first_line == 1 and bool(layout.header) and block.lstrip().startswith(layout.header.encode())
    )
    parsed = _arrow_block(block, layout, skip)
    if parsed is None or not _clean(*parsed, movie_ids):
      parsed = _python_block(path, first_line, block, layout, movies)  # names the bad line
    parts.append(parsed)
  if not parts or sum(p[0].size for p in parts) == 0:
    raise DataError(f"{path}: no ratings")
  return tuple(np.concatenate([p[k] for p in parts]) for k in range(3))


def _line_of_row(path: Path, layout: Layout, row: int) -> int:
  """The line number of data row `row` (0-based, blank lines and the header not counted)."""
  seen = -1
  with open(path, "rb") as f:
    for number, line in enumerate(f, start=1):
      text = line.strip()
      if number == 1:
        text = text.removeprefix(b"\xef\xbb\xbf")
        if layout.header and text.startswith(layout.header.encode()):
          continue
      if text:
        seen += 1
        if seen == row:
          return number
  return row + 1


def load(
  data: str, data_dir: str | Path, duplicates: str = "refuse"
) -> tuple[Ratings, ItemFeatures, int]:
  """Ratings (dense 0-based indices), features (year, genres) and the number of users of a
  MovieLens directory; repeated (user, movie) ratings refused or merged (`duplicates`)."""
  if data not in LAYOUTS:
    raise DataError(f"unknown MovieLens layout {data!r}; known: {', '.join(LAYOUTS)}")
  if duplicates not in DUPLICATES:
    raise DataError(f"duplicates must be one of {', '.join(DUPLICATES)}; got {duplicates!r}")
  movies_path, ratings_path = files(data, data_dir)
  movies = read_movies(movies_path, data)
  raw_users, raw_items, values = read_ratings(ratings_path, data, movies)
  movie_ids = sorted(movies)
  user_ids, users = np.unique(raw_users, return_inverse=True)
  users = users.astype(np.int64).ravel()
  items = np.searchsorted(np.asarray(movie_ids, np.int64), raw_items).astype(np.int64)
  repeat = first_repeat(users, items)
  if repeat is not None and duplicates == "refuse":
    layout = LAYOUTS[data]
    row, earlier = (_line_of_row(ratings_path, layout, r) for r in repeat)
    raise DataError(
      f"{ratings_path}:{row}: user {raw_users[repeat[0]]} rated movie {raw_items[repeat[0]]} "
      f"again (first at line {earlier}); the statistics would count it twice: remove the "
      "repeats, or set duplicates=mean to use the mean of a user's ratings of a movie"
    )
  features = ItemFeatures(
    ("year", "genres"),
    (
      bags_from_tokens([movies[m][0] for m in movie_ids]),
      bags_from_tokens([movies[m][1] for m in movie_ids]),
    ),
  )
  return Ratings(users, items, values).merged(), features, int(user_ids.size)


def estimated_rows(data: str, data_dir: str | Path) -> int:
  """An upper estimate of the ratings file's rows from its size, before reading it (MovieLens
  rows take 19-27 bytes; 16 leans high), for the cost check."""
  path = Path(data_dir) / LAYOUTS[data].ratings
  try:
    size = path.stat().st_size
  except OSError:
    return 0
  return size // 16 + 1
