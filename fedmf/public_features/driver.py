"""`fedmf public-features`: builds the dataset, trains, writes summary.json and metrics.csv.

Outputs are written to a temporary file and renamed, so an interrupted run leaves no half-written
file; config.json records the resolved config.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Callable

import numpy as np

from fedmf import atomic_files
from fedmf.public_features import accounting
from fedmf.public_features import algorithms
from fedmf.public_features import data
from fedmf.public_features import movielens
from fedmf.public_features.config import PublicFeaturesConfig


def build_dataset(cfg: PublicFeaturesConfig) -> data.Dataset:
  rng = np.random.default_rng([cfg.seed, 0])  # data generation and splits
  if cfg.data == "synthetic":
    spec = data.SyntheticSpec(
      num_users=cfg.num_users,
      num_items=cfg.num_items,
      dim=cfg.dim,
      num_people=cfg.num_people,
      mean_ratings_per_user=cfg.mean_ratings_per_user,
    )
    ratings, features = data.synthetic_ratings(spec, rng)
    return data.random_split(
      "synthetic", ratings, features, spec.num_users, cfg.test_fraction, rng, cfg.offset
    )
  ratings, features, num_users = movielens.load(cfg.data, cfg.data_dir, cfg.duplicates)
  if cfg.data != "movielens-20m":
    return data.random_split(
      cfg.data, ratings, features, num_users, cfg.test_fraction, rng, cfg.offset
    )
  return data.heldout_user_split(
    cfg.data, ratings, features, num_users, cfg.heldout_users, rng, cfg.offset
  )


def hyperparameters(cfg: PublicFeaturesConfig) -> algorithms.Hyperparameters:
  names = set(algorithms.Hyperparameters.__dataclass_fields__) & set(cfg.__dataclass_fields__)
  return algorithms.Hyperparameters(**{k: getattr(cfg, k) for k in names})


def _write_atomic(path: Path, text: str) -> None:
  # Owner-only, as the outputs have always been written (through mkstemp).
  atomic_files.write_text(path, text, mode=0o600)


def run(
  cfg: PublicFeaturesConfig, out_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
  """Trains per the config and writes config.json, metrics.csv and summary.json into out_dir."""
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  dataset = build_dataset(cfg)
  if len(dataset.train) == 0:
    raise data.DataError("the training split is empty")
  say = progress or (lambda _: None)
  say(
    f"{cfg.data}: {dataset.num_users} users, {dataset.features.num_items} items, "
    f"{len(dataset.train)} training ratings; {cfg.algorithm} at epsilon={cfg.epsilon:g}"
    + (" (federated, TFF)" if cfg.federated else "")
  )
  releaser = algorithms.CENTRAL
  if cfg.federated:
    from fedmf.public_features import federated  # pylint: disable=g-import-not-at-top

    federated.use_own_context()
    releaser = federated.releaser()

  def step_line(row: dict) -> None:
    shown = ", ".join(f"{k}={v:.4f}" for k, v in row.items() if k not in ("step", "seconds"))
    say(f"outer step {row['step']}/{cfg.outer_steps}: {shown} ({row['seconds']:.2f} s training)")

  result = algorithms.train(
    dataset,
    cfg.algorithm,
    cfg.epsilon,
    cfg.delta,
    cfg.seed,
    hyperparameters(cfg),
    releaser,
    step_line,
  )
  if cfg.algorithm == "am-dpsgd":
    budget = accounting.calibrate_dpsgd(
      cfg.epsilon, cfg.delta, cfg.outer_steps * cfg.item_steps, cfg.dpsgd_sampling
    )
    spent = {"rdp": accounting.dpsgd_epsilon(budget)}
  else:
    spent = accounting.ssp_epsilon(
      accounting.calibrate_ssp(cfg.epsilon, cfg.delta, cfg.outer_steps, cfg.count_fraction)
    )
  summary = {
    "algorithm": cfg.algorithm,
    "data": cfg.data,
    "epsilon": cfg.epsilon,
    "delta": cfg.delta,
    "dim": cfg.dim,
    "seed": cfg.seed,
    "federated": cfg.federated,
    "train_seconds": result.train_seconds,
    **{k: v for k, v in result.metrics[-1].items() if k.startswith("test_")},
    "privacy": {**result.privacy, "user_level": True, "epsilon_spent": spent},
    "num_users": dataset.num_users,
    "num_items": dataset.features.num_items,
    "num_train_ratings": len(dataset.train),
  }
  _write_atomic(out / "config.json", json.dumps(cfg.__dict__, indent=2) + "\n")
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=list(result.metrics[0]), lineterminator="\n")
  writer.writeheader()
  writer.writerows(result.metrics)
  _write_atomic(out / "metrics.csv", buffer.getvalue())
  _write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
  return summary
