"""What a `fedmf public-features` run will cost, estimated from its config before any work.

One concept: a `fedmf.mf.resources.Cost` (peak memory and seconds, by named step) computed from
the config and the sizes of the data files (not their contents), checked against `--max-memory`
and `--max-seconds` before anything is read or written, like every other fedmf command.

Sizes: D ratings (synthetic: users × 1.5 × mean ratings; MovieLens: the ratings file's bytes / 16,
above every release's 19-27 bytes a row), n users (MovieLens: D / 20, each user having at least 20
ratings in every release), m items (the movies file's lines), p = d + 1 item outputs, C feature
categories. Per outer step: every user's UserUpdate and the statistics (∝ D p²), the PSD
projection (m p³), the item update (T steps ∝ m (C d p + p²) for SSP; ∝ q D C d p per DP-SGD
step); times the seeds, the tuning grid and the DP bias baseline. The rates are this machine
class's, measured on MovieLens-100K (docs/benchmarks.md §5), rounded so the estimates lean high.
"""

from __future__ import annotations

from pathlib import Path

from fedmf.mf import resources
from fedmf.public_features import movielens
from fedmf.public_features import tuning
from fedmf.public_features.config import PublicFeaturesConfig

FLOAT = 8
SECONDS_PER_RATING_P2 = (
  1e-7  # a UserUpdate or a statistics pass, per rating and p² (≈ 0.3 s for ML-100K)
)
SECONDS_PER_ITEM_P3 = 3e-7  # the batched eigendecomposition of the PSD projection
# An L-BFGS step's forward and backward passes, per multiply-add. Was 2e-7, which put the docs'
# tuned AM-SSP run on MovieLens-100K (162 runs with the issue-34 grid) at 70 min against the 28 min
# it took at load 12 on 2 cores (5.1 s an outer step, evaluation included); 1e-7 gives 44 min.
SECONDS_PER_ENCODER_FLOP = 1e-7
SECONDS_PER_GRADIENT_ENTRY = 1e-6  # DP-SGD's sparse per-user gradients
SECONDS_PER_READ_ROW = 2e-6  # reading a ratings row (pyarrow; Python only on a bad block)
BYTES_PER_RATING = 160  # ratings, their merged copy, the sparse UserUpdate matrices, the weights
BYTES_PER_READ_ROW = 120  # parsed blocks, their concatenation and the id indexing


def sizes(cfg: PublicFeaturesConfig) -> dict[str, int]:
  """D, n, m, the feature categories C and the features' nonzeros, estimated before reading."""
  if cfg.data == "synthetic":
    ratings = int(1.5 * cfg.num_users * min(cfg.mean_ratings_per_user, cfg.num_items))
    users, items = cfg.num_users, cfg.num_items
    categories, nonzeros = 3, items * 20
  else:
    ratings = movielens.estimated_rows(cfg.data, cfg.data_dir)
    users = max(1, ratings // 20)
    movies = Path(cfg.data_dir) / movielens.LAYOUTS[cfg.data].movies
    items = max(1, _lines(movies))
    categories, nonzeros = 2, items * 8
  if cfg.item_id:
    categories, nonzeros = categories + 1, nonzeros + items
  return {
    "ratings": ratings,
    "users": users,
    "items": items,
    "categories": categories,
    "nonzeros": nonzeros,
  }


def _lines(path: Path) -> int:
  try:
    with open(path, "rb") as f:
      return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1
  except OSError:
    return 1


def _train_seconds(cfg: PublicFeaturesConfig, algorithm: str, s: dict, outer_steps: int) -> float:
  d = 0 if algorithm == "dp-bias" else cfg.dim
  p = d + 1
  big_d, m, c = s["ratings"], s["items"], s["categories"]
  users = 3 * big_d * p * p * SECONDS_PER_RATING_P2  # targets, statistics, the model's UserUpdate
  step = users
  if algorithm == "am-dpsgd":
    entries = cfg.dpsgd_sampling * big_d * (c * d * p + p + 8 * d)
    forward = (m * c * d * p + s["nonzeros"] * d) * SECONDS_PER_ENCODER_FLOP
    step += cfg.dpsgd_steps * (entries * SECONDS_PER_GRADIENT_ENTRY + forward)
  else:
    step += m * p**3 * SECONDS_PER_ITEM_P3 + m * p * p * 10 * SECONDS_PER_ENCODER_FLOP
    if algorithm == "am-ssp":
      flops = m * (c * d * p + p * p) + s["nonzeros"] * d
      step += cfg.item_steps * 1.5 * flops * SECONDS_PER_ENCODER_FLOP
  return outer_steps * step


def _runs(cfg: PublicFeaturesConfig, algorithm: str) -> list[int]:
  """The outer steps of every training run of `algorithm` (seeds × grid points)."""
  if not cfg.tune:
    return [cfg.outer_steps] * cfg.seeds
  return [p.get("outer_steps", cfg.outer_steps) for p in tuning.grid(algorithm)] * cfg.seeds


def estimate(cfg: PublicFeaturesConfig) -> resources.Cost:
  """The run's cost: reading, the training runs of the method (and the DP bias baseline)."""
  s = sizes(cfg)
  big_d, n, m = s["ratings"], s["users"], s["items"]
  p = cfg.dim + 1
  cost = resources.Cost.of(
    f"reading about {big_d:,} ratings",
    big_d * BYTES_PER_READ_ROW,
    big_d * SECONDS_PER_READ_ROW if cfg.data != "synthetic" else big_d * 1e-6,
  )
  statistics = (
    FLOAT * p * p * (5 * m + 3 * n)
  )  # A (exact, noise, noisy, projected), n outer products
  training = big_d * BYTES_PER_RATING + statistics
  if cfg.algorithm == "am-dpsgd":
    entries = cfg.dpsgd_sampling * big_d * (s["categories"] * cfg.dim * p + p + 8 * cfg.dim)
    training += 3 * 24 * entries
  algorithms_run = [cfg.algorithm] + (["dp-bias"] if cfg.baselines else [])
  for algorithm in algorithms_run:
    seconds = sum(_train_seconds(cfg, algorithm, s, steps) for steps in _runs(cfg, algorithm))
    runs = len(_runs(cfg, algorithm))
    cost += resources.Cost.of(
      f"{runs} training run{'s' if runs > 1 else ''} of {algorithm} (statistics of "
      f"{m:,} items x {p}x{p}, {big_d:,} ratings)",
      training,
      seconds,
    )
  return cost


def check(cfg: PublicFeaturesConfig) -> None:
  """Refuses the run (one line: the estimate, the limit, the flag) above the current limits."""
  resources.check(estimate(cfg), f"fedmf public-features ({cfg.algorithm} on {cfg.data})")
