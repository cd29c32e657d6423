"""Tiny MovieLens directories in the four layouts users have (the real formats, made-up ratings).

`write(layout, directory, rows)` writes the same movies and the given (user, movie, rating) rows in
one layout: `movielens-100k` (u.data, u.item), `movielens-1m` / `movielens-10m` (ratings.dat,
movies.dat) or `movielens-20m` (ratings.csv, movies.csv).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedmf.public_features import movielens

# (id, title, release date, genres)
MOVIES = (
  (1, "Toy Story (1995)", "01-Jan-1995", ("Adventure", "Animation", "Children's")),
  (2, "Jumanji (1995)", "01-Jan-1995", ("Adventure", "Children's", "Fantasy")),
  (3, "Heat (1995)", "15-Dec-1995", ("Action", "Crime", "Thriller")),
  (4, "American President, The (1995)", "01-Jan-1995", ("Comedy", "Drama", "Romance")),
  (5, "No Year", "", ()),  # no year, no genres: an item without public features
  (7, "Some Film (2001)", "01-Jan-2001", ("Drama",)),
)
LAYOUTS = ("movielens-100k", "movielens-1m", "movielens-10m", "movielens-20m")


def random_rows(rng, num_users: int = 60, per_user: int = 4) -> list[tuple[int, int, float]]:
  """Distinct (user, movie) pairs, user ids from 1, MovieLens half-star ratings."""
  ids = [m[0] for m in MOVIES]
  rows = []
  for user in range(1, num_users + 1):
    for movie in rng.choice(ids, size=per_user, replace=False):
      rows.append((user, int(movie), float(rng.integers(1, 11)) / 2))
  return rows


def _item_line(movie) -> str:
  mid, title, date, genres = movie
  flags = ["1" if g in genres else "0" for g in movielens.ML100K_GENRES]
  if not genres:
    flags[0] = "0"  # not even 'unknown'
  url = "http://us.imdb.com/M/title-exact?" + title.replace(" ", "%20")
  return "|".join([str(mid), title, date, "", url, *flags])


def _csv_title(title: str) -> str:
  return f'"{title}"' if "," in title else title


def write(layout: str, directory: Path, rows, newline: str = "\n", bom: bool = False) -> Path:
  """`rows` in `layout` under `directory` (created); `newline` '\\r\\n' and `bom` as some editors
  save files."""
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  prefix = "\ufeff" if bom else ""
  if layout == "movielens-100k":
    movies = [_item_line(m) for m in MOVIES]
    ratings = [f"{u}\t{m}\t{r:g}\t881250949" for u, m, r in rows]
  elif layout in ("movielens-1m", "movielens-10m"):
    movies = [f"{m}::{t}::{'|'.join(g) or '(no genres listed)'}" for m, t, _, g in MOVIES]
    ratings = [f"{u}::{m}::{r:g}::978300760" for u, m, r in rows]
  else:
    movies = ["movieId,title,genres"] + [
      f"{m},{_csv_title(t)},{'|'.join(g) or '(no genres listed)'}" for m, t, _, g in MOVIES
    ]
    ratings = ["userId,movieId,rating,timestamp"] + [f"{u},{m},{r},1112486027" for u, m, r in rows]
  names = movielens.LAYOUTS[layout]
  encoding = "latin-1" if layout != "movielens-20m" else "utf-8"
  for name, lines in ((names.movies, movies), (names.ratings, ratings)):
    text = prefix + newline.join(lines) + newline
    (directory / name).write_bytes(text.encode("utf-8" if bom else encoding))
  return directory


def rating_arrays(rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  return tuple(np.array([r[k] for r in rows]) for k in range(3))
