"""Datasets with public item features: ratings, features, splits (the two evaluation protocols of
the paper's App. E.1) and a synthetic two-tower generator (MovieLens files: `movielens.py`).

A dataset holds ratings as parallel arrays (user, item, value) and the public item features as one
sparse row-normalized "bag" matrix per feature category (univalent features are one-hot; multivalent
ones are averaged bags of words, App. E.1 "Model Architecture").
"""

from __future__ import annotations

from dataclasses import dataclass

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

  def merged(self) -> Ratings:
    """One row per (user, item) pair, in order of first occurrence, its value the mean of the
    pair's rows. The statistics are computed on merged ratings: their sensitivity (Thm. 2) holds
    for distinct items per user only (r copies of one rating would move A by √r·w̄Γ_u²)."""
    first, inverse = pair_index(self.users, self.items)
    if first.size == len(self):
      return self
    total = np.bincount(inverse, weights=self.values, minlength=first.size)
    copies = np.bincount(inverse, minlength=first.size)
    return Ratings(self.users[first], self.items[first], total / copies)


def pair_index(users: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(first, inverse): `first` holds the row of each distinct (user, item) pair's first
  occurrence, in row order; row i is pair `inverse[i]`."""
  users = np.asarray(users, dtype=np.int64)
  items = np.asarray(items, dtype=np.int64)
  if users.size == 0:
    return np.zeros(0, np.int64), np.zeros(0, np.int64)
  key = users * (int(items.max()) + 1) + items  # dense 0-based indices: no overflow below 2^63
  _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
  order = np.argsort(first, kind="stable")  # pairs in order of first occurrence
  rank = np.empty_like(order)
  rank[order] = np.arange(order.size)
  return first[order], rank[inverse.ravel()]


def first_repeat(users: np.ndarray, items: np.ndarray) -> tuple[int, int] | None:
  """(row, earlier row) of the first row repeating an earlier row's (user, item) pair, or None."""
  first, inverse = pair_index(users, items)
  if first.size == np.asarray(users).size:
    return None
  repeats = np.flatnonzero(first[inverse] != np.arange(inverse.size))
  row = int(repeats[0])
  return row, int(first[inverse[row]])


@dataclass(frozen=True)
class ItemFeatures:
  """Public features: per category a (num_items x vocabulary) CSR matrix whose rows sum to 1 (a
  row of zeros: an item without that feature)."""

  names: tuple[str, ...]
  bags: tuple[sparse.csr_matrix, ...]

  @property
  def num_items(self) -> int:
    return int(self.bags[0].shape[0])

  def with_item_ids(self) -> ItemFeatures:
    """These features and one more category, the item's id (one-hot): the paper's id and
    features+id variants (Fig. 2), letting the encoder learn what the features do not say."""
    ids = sparse.identity(self.num_items, dtype=np.float64, format="csr")
    return ItemFeatures((*self.names, "id"), (*self.bags, ids))


@dataclass(frozen=True)
class Heldout:
  """Ratings to evaluate on. `history` (the 'recall' protocol only): the held-out users' other
  ratings, from which each computes their embedding (UserUpdate) before `target` is ranked."""

  target: Ratings
  history: Ratings | None = None


@dataclass(frozen=True)
class Dataset:
  """A split dataset. protocol 'rmse': ratings split at random into train, validation and test
  (ML10M, App. E.1); 'recall': held-out users (validation and test) whose ratings are split into
  history and target (ML20M, Recall@20)."""

  name: str
  num_users: int
  features: ItemFeatures
  train: Ratings
  validation: Heldout
  test: Heldout
  protocol: str = "rmse"
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
# Splits (App. E.1, "Evaluation").


def random_split(
  name: str,
  ratings: Ratings,
  features: ItemFeatures,
  num_users: int,
  validation_fraction: float,
  test_fraction: float,
  rng,
  rating_offset: float,
) -> Dataset:
  """The ML10M protocol: ratings split at random into train, validation and test; RMSE."""
  draw = rng.random(len(ratings))
  test = draw < test_fraction
  validation = ~test & (draw < test_fraction + validation_fraction)
  return Dataset(
    name,
    num_users,
    features,
    ratings.subset(~test & ~validation),
    Heldout(ratings.subset(validation)),
    Heldout(ratings.subset(test)),
    "rmse",
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
  """The ML20M protocol: `heldout_fraction` of the users held out for test and as many for
  validation; training on the other users' ratings of the 10% most frequent movies; each held-out
  user's ratings split 80/20 into history and target (Recall@20 excludes the history)."""
  draw = rng.random(num_users)
  test_users = draw < heldout_fraction
  validation_users = ~test_users & (draw < 2 * heldout_fraction)
  if not test_users.any() or not validation_users.any() or (test_users | validation_users).all():
    raise DataError("the held-out user split is empty; use more users or change heldout_users")
  counts = np.bincount(ratings.items, minlength=features.num_items)
  keep = max(1, round(top_item_fraction * features.num_items))
  top_items = np.zeros(features.num_items, dtype=bool)
  top_items[np.argsort(-counts, kind="stable")[:keep]] = True
  heldout = test_users[ratings.users] | validation_users[ratings.users]
  train = ratings.subset(~heldout & top_items[ratings.items])
  is_history = rng.random(len(ratings)) < history_fraction

  def part(users: np.ndarray) -> Heldout:
    mine = users[ratings.users]
    return Heldout(ratings.subset(mine & ~is_history), ratings.subset(mine & is_history))

  return Dataset(
    name,
    num_users,
    features,
    train,
    part(validation_users),
    part(test_users),
    "recall",
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
  user_bias: float = 0.3  # std of the true user biases
  item_bias: float = 0.3  # std of the true item biases (features and an item-specific part)


def synthetic_ratings(spec: SyntheticSpec, rng) -> tuple[Ratings, ItemFeatures]:
  """Zipfian items, log-normal user counts, labels u*·v* + c*_k + e*_j + noise where v* and half
  of the item bias e* are functions of the item's public features (year, 1-3 genres, people), so a
  feature encoder can learn tail items."""
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
  # Biases (drawn last, so the rest of the data is that of the generator without them): the
  # item's half from its genres (public), half item-specific; the user's own.
  genre_bias = rng.normal(0.0, spec.item_bias / np.sqrt(2), spec.num_genres)
  item_bias = np.array([genre_bias[gs].mean() for gs in genre_lists])
  item_bias += rng.normal(0.0, spec.item_bias / np.sqrt(2), spec.num_items)
  user_bias = rng.normal(0.0, spec.user_bias, spec.num_users)
  values += item_bias[items_arr] + user_bias[users_arr]
  return Ratings(users_arr.astype(np.int64), items_arr.astype(np.int64), values), features
