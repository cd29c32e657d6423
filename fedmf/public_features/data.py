"""Datasets with public item features: MovieLens files (ML-10M/1M `::` format, ML-20M/25M CSV
format), a synthetic two-tower generator, and the two evaluation protocols of the paper's App. E.1.

A dataset holds ratings as parallel arrays (user, item, value) and the public item features as one
sparse row-normalized "bag" matrix per feature category (univalent features are one-hot; multivalent
ones are averaged bags of words, App. E.1 "Model Architecture").
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from fedmf.errors import FedmfUserError


class DataError(FedmfUserError):
  """A missing or malformed data file (one line naming the file and the row)."""


@dataclass(frozen=True)
class Ratings:
  """Rating triples; `users` and `items` are dense 0-based indices."""

  users: np.ndarray  # int64
  items: np.ndarray  # int64
  values: np.ndarray  # float64

  def __len__(self) -> int:
    return int(self.users.size)

  def subset(self, mask: np.ndarray) -> Ratings:
    return Ratings(self.users[mask], self.items[mask], self.values[mask])


@dataclass(frozen=True)
class ItemFeatures:
  """Public features: per category a (num_items x vocabulary) CSR matrix whose rows sum to 1."""

  names: tuple[str, ...]
  bags: tuple[sparse.csr_matrix, ...]

  @property
  def num_items(self) -> int:
    return int(self.bags[0].shape[0])


@dataclass(frozen=True)
class Dataset:
  """A split dataset. protocol 'rmse': random split of ratings (ML10M, App. E.1); 'recall': held-out
  users whose ratings are split into history (for their UserUpdate) and target (Recall@20)."""

  name: str
  num_users: int
  features: ItemFeatures
  train: Ratings
  test: Ratings
  protocol: str = "rmse"
  history: Ratings | None = None  # 'recall' only: held-out users' 80% history
  rating_offset: float = 0.0  # subtracted from ratings before training (a public constant)


def bags_from_tokens(tokens: list[list[str]]) -> sparse.csr_matrix:
  """Averaged bag of words (repetitions count as weight, App. E.1) over a sorted vocabulary."""
  vocabulary = {t: k for k, t in enumerate(sorted({t for row in tokens for t in row}))}
  rows, cols, vals = [], [], []
  for r, row in enumerate(tokens):
    for t in row:
      rows.append(r)
      cols.append(vocabulary[t])
      vals.append(1.0 / len(row))
  shape = (len(tokens), max(len(vocabulary), 1))
  return sparse.csr_matrix((vals, (rows, cols)), shape=shape, dtype=np.float64)


# ---------------------------------------------------------------------------------------------------
# MovieLens.

_YEAR = re.compile(r"\((\d{4})\)\s*$")
MOVIELENS_FILES = {
  "movielens-10m": ("movies.dat", "ratings.dat"),
  "movielens-20m": ("movies.csv", "ratings.csv"),
}


def _read_lines(path: Path) -> list[str]:
  raw = path.read_bytes()
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError:
    text = raw.decode("latin-1")  # ML-1M and ML-10M titles are Latin-1.
  return text.splitlines()


def _movie_tokens(title: str, genres: str) -> tuple[list[str], list[str]]:
  match = _YEAR.search(title.strip())
  year = [match.group(1) if match else "unknown"]
  return year, [g for g in genres.strip().split("|") if g] or ["(no genres listed)"]


def _parse_movies(path: Path, separated_by_colons: bool) -> dict[int, tuple[list[str], list[str]]]:
  movies: dict[int, tuple[list[str], list[str]]] = {}
  lines = _read_lines(path)
  rows = (line.split("::") for line in lines) if separated_by_colons else csv.reader(lines)
  for number, row in enumerate(rows, start=1):
    if not separated_by_colons and number == 1 and row and row[0] == "movieId":
      continue  # header
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    if len(row) != 3:
      raise DataError(f"{path}:{number}: expected movieId, title, genres; got {len(row)} fields")
    try:
      movie = int(row[0])
    except ValueError:
      raise DataError(f"{path}:{number}: movie id {row[0]!r} is not an integer") from None
    movies[movie] = _movie_tokens(row[1], row[2])
  if not movies:
    raise DataError(f"{path}: no movies")
  return movies


def _parse_ratings(path: Path, separated_by_colons: bool, movies) -> tuple[np.ndarray, ...]:
  users, items, values = [], [], []
  lines = _read_lines(path)
  rows = (line.split("::") for line in lines) if separated_by_colons else csv.reader(lines)
  for number, row in enumerate(rows, start=1):
    if not separated_by_colons and number == 1 and row and row[0] == "userId":
      continue
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    if len(row) != 4:
      raise DataError(
        f"{path}:{number}: expected userId, movieId, rating, timestamp; got {len(row)} fields"
      )
    try:
      user, movie, value = int(row[0]), int(row[1]), float(row[2])
    except ValueError:
      raise DataError(f"{path}:{number}: malformed rating row {','.join(row)!r}") from None
    if not np.isfinite(value):
      raise DataError(f"{path}:{number}: rating {row[2]!r} is not finite")
    if movie not in movies:
      raise DataError(f"{path}:{number}: movie {movie} is not in the movies file")
    users.append(user)
    items.append(movie)
    values.append(value)
  if not users:
    raise DataError(f"{path}: no ratings")
  return np.asarray(users), np.asarray(items), np.asarray(values, dtype=np.float64)


def load_movielens(data: str, data_dir: str | Path) -> tuple[Ratings, ItemFeatures, int]:
  """Ratings (dense indices), features (year, genres) and the number of users of a MovieLens dir."""
  if data not in MOVIELENS_FILES:
    raise DataError(f"unknown MovieLens format {data!r}; known: {', '.join(MOVIELENS_FILES)}")
  directory = Path(data_dir)
  movies_name, ratings_name = MOVIELENS_FILES[data]
  missing = [n for n in (movies_name, ratings_name) if not (directory / n).is_file()]
  if missing:
    raise DataError(f"{data} data not found: looked for {', '.join(missing)} in {directory}")
  colons = movies_name.endswith(".dat")
  movies = _parse_movies(directory / movies_name, colons)
  raw_users, raw_items, values = _parse_ratings(directory / ratings_name, colons, movies)
  movie_ids = sorted(movies)
  item_index = {m: k for k, m in enumerate(movie_ids)}
  _, users = np.unique(raw_users, return_inverse=True)
  items = np.fromiter((item_index[m] for m in raw_items.tolist()), np.int64, raw_items.size)
  features = ItemFeatures(
    ("year", "genres"),
    (
      bags_from_tokens([movies[m][0] for m in movie_ids]),
      bags_from_tokens([movies[m][1] for m in movie_ids]),
    ),
  )
  return Ratings(users.astype(np.int64), items, values), features, int(users.max()) + 1


# ---------------------------------------------------------------------------------------------------
# Splits (App. E.1, "Evaluation").


def random_split(
  name: str,
  ratings: Ratings,
  features: ItemFeatures,
  num_users: int,
  test_fraction: float,
  rng,
  rating_offset: float,
) -> Dataset:
  """The ML10M protocol: ratings split at random; metric RMSE on the test ratings."""
  test = rng.random(len(ratings)) < test_fraction
  return Dataset(
    name,
    num_users,
    features,
    ratings.subset(~test),
    ratings.subset(test),
    "rmse",
    None,
    rating_offset,
  )


def heldout_user_split(
  name: str,
  ratings: Ratings,
  features: ItemFeatures,
  num_users: int,
  heldout_fraction: float,
  rng,
  rating_offset: float,
  top_item_fraction: float = 0.1,
  history_fraction: float = 0.8,
) -> Dataset:
  """The ML20M protocol: training on the other users' ratings of the 10% most frequent movies;
  each held-out user's ratings split 80/20 into history and target (Recall@20 excludes history)."""
  heldout_users = rng.random(num_users) < heldout_fraction
  if not heldout_users.any() or heldout_users.all():
    raise DataError("the held-out user split is empty; use more users or change heldout_users")
  counts = np.bincount(ratings.items, minlength=features.num_items)
  keep = max(1, round(top_item_fraction * features.num_items))
  top_items = np.zeros(features.num_items, dtype=bool)
  top_items[np.argsort(-counts, kind="stable")[:keep]] = True
  in_heldout = heldout_users[ratings.users]
  train = ratings.subset(~in_heldout & top_items[ratings.items])
  heldout = ratings.subset(in_heldout)
  is_history = rng.random(len(heldout)) < history_fraction
  return Dataset(
    name,
    num_users,
    features,
    train,
    heldout.subset(~is_history),
    "recall",
    heldout.subset(is_history),
    rating_offset,
  )


# ---------------------------------------------------------------------------------------------------
# Synthetic two-tower data (no download).


@dataclass(frozen=True)
class SyntheticSpec:
  num_users: int = 2000
  num_items: int = 400
  dim: int = 8
  num_years: int = 12
  num_genres: int = 16
  num_people: int = 2000  # a wide multivalent feature (cast), as the paper's Wikidata persons
  zipf_exponent: float = 1.1  # item popularity ∝ rank^-s
  mean_ratings_per_user: float = 25.0
  item_residual: float = 0.3  # item-specific part of the true item vector, beyond its features
  label_noise: float = 0.3


def synthetic_ratings(spec: SyntheticSpec, rng) -> tuple[Ratings, ItemFeatures]:
  """Zipfian items, log-normal user counts, labels u*·v* + noise where v* is mostly a function of
  the item's public features (year, 1-3 genres), so a feature encoder can learn tail items."""
  years = rng.integers(spec.num_years, size=spec.num_items)
  genre_lists = [
    sorted(rng.choice(spec.num_genres, size=rng.integers(1, 4), replace=False).tolist())
    for _ in range(spec.num_items)
  ]
  people_lists = [
    rng.choice(spec.num_people, size=rng.integers(3, 13), replace=False).tolist()
    for _ in range(spec.num_items)
  ]
  features = ItemFeatures(
    ("year", "genres", "people"),
    (
      bags_from_tokens([[f"y{y}"] for y in years]),
      bags_from_tokens([[f"g{g}" for g in gs] for gs in genre_lists]),
      bags_from_tokens([[f"p{q}" for q in qs] for qs in people_lists]),
    ),
  )
  scale = 1.0 / np.sqrt(3 * spec.dim)
  year_vectors = rng.normal(0.0, scale, (spec.num_years, spec.dim))
  genre_vectors = rng.normal(0.0, scale, (spec.num_genres, spec.dim))
  people_vectors = rng.normal(0.0, scale, (spec.num_people, spec.dim))
  true_items = np.stack(
    [
      year_vectors[y] + genre_vectors[gs].mean(axis=0) + people_vectors[qs].mean(axis=0)
      for y, gs, qs in zip(years, genre_lists, people_lists)
    ]
  )
  true_items += rng.normal(0.0, spec.item_residual * scale, true_items.shape)
  true_users = rng.normal(0.0, 1.0, (spec.num_users, spec.dim))
  popularity = 1.0 / np.arange(1, spec.num_items + 1) ** spec.zipf_exponent
  popularity = popularity[rng.permutation(spec.num_items)]
  popularity /= popularity.sum()
  counts = np.clip(
    np.round(rng.lognormal(np.log(spec.mean_ratings_per_user), 0.7, spec.num_users)),
    2,
    spec.num_items // 2,
  ).astype(np.int64)
  users, items = [], []
  for k, c in enumerate(counts):
    chosen = rng.choice(spec.num_items, size=c, replace=False, p=popularity)
    users.append(np.full(c, k))
    items.append(chosen)
  users_arr, items_arr = np.concatenate(users), np.concatenate(items)
  values = np.einsum("nd,nd->n", true_users[users_arr], true_items[items_arr])
  values += rng.normal(0.0, spec.label_noise, values.shape)
  return Ratings(users_arr.astype(np.int64), items_arr.astype(np.int64), values), features
