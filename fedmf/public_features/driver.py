"""`fedmf public-features`: builds the dataset, trains (tuned or not, over the seeds), runs the
baselines and writes config.json, metrics.csv, summary.json (and tuning.csv) into a directory.

The run-directory contract (staging beside OUT, one atomic replacement, `--force`, run.json) is the
program's (`fedmf.program.public_features`); this module writes the files of one run.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

from fedmf import atomic_files
from fedmf import jsonio
from fedmf.public_features import accounting
from fedmf.public_features import algorithms
from fedmf.public_features import baselines
from fedmf.public_features import data
from fedmf.public_features import movielens
from fedmf.public_features import tuning
from fedmf.public_features.config import PublicFeaturesConfig
from fedmf.public_features.config import as_dict

NOT_COVERED = (
  "choosing hyper-parameters on the validation ratings (--tune) is not covered by this guarantee "
  "(as in the paper)"
)


def build_dataset(cfg: PublicFeaturesConfig) -> data.Dataset:
  rng = np.random.default_rng([cfg.split_seed, 0])  # data generation and splits
  if cfg.data == "synthetic":
    spec = data.SyntheticSpec(
      num_users=cfg.num_users,
      num_items=cfg.num_items,
      dim=cfg.dim or 1,
      num_people=cfg.num_people,
      mean_ratings_per_user=cfg.mean_ratings_per_user,
    )
    ratings, features = data.synthetic_ratings(spec, rng)
    num_users = spec.num_users
  else:
    ratings, features, num_users = movielens.load(cfg.data, cfg.data_dir, cfg.duplicates)
  if cfg.data == "movielens-20m":
    return data.heldout_user_split(
      cfg.data, ratings, features, num_users, cfg.heldout_users, rng, cfg.offset
    )
  return data.random_split(
    cfg.data,
    ratings,
    features,
    num_users,
    cfg.validation_fraction,
    cfg.test_fraction,
    rng,
    cfg.offset,
  )


def hyperparameters(cfg: PublicFeaturesConfig) -> algorithms.Hyperparameters:
  names = set(algorithms.Hyperparameters.__dataclass_fields__) & set(cfg.__dataclass_fields__)
  return algorithms.Hyperparameters(**{k: getattr(cfg, k) for k in names})


def _budget_cache():
  """Calibration once per (algorithm, ε, δ, hyper-parameters): DP-SGD's takes seconds."""
  cache: dict = {}

  def budget(algorithm, epsilon, delta, hyper):
    key = (algorithm, epsilon, delta, hyper)
    if key not in cache:
      cache[key] = algorithms.budget_of(algorithm, epsilon, delta, hyper)
    return cache[key]

  return budget


def _method(
  cfg: PublicFeaturesConfig,
  dataset: data.Dataset,
  algorithm: str,
  hyper: algorithms.Hyperparameters,
  releaser: algorithms.Releaser,
  say: Callable[[str], None],
  budget,
  step_line: Callable | None = None,
) -> dict:
  """One method at the run's ε over the seeds, tuned or not: its summary and results."""
  seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))

  def run(h, seed):
    return algorithms.train(
      dataset,
      algorithm,
      cfg.epsilon,
      cfg.delta,
      seed,
      h,
      releaser,
      step_line if not cfg.tune else None,
      budget=budget(algorithm, cfg.epsilon, cfg.delta, h),
    )

  if cfg.tune:
    # Without noise (ε = inf) reg_noise changes nothing: its points run once.
    same = tuning.no_noise_key if not cfg.private else (lambda h: h)
    tuned = tuning.tune(run, algorithm, hyper, seeds, dataset.protocol, say, same)
    hyper, results, table, choice = tuned.hyper, tuned.results, tuned.table, tuned.choice
  else:
    results, table, choice = [run(hyper, seed) for seed in seeds], [], {}
  last = [r.metrics[-1] for r in results]
  out = {"algorithm": algorithm}
  for key in last[0]:
    if key.startswith(("validation_", "test_")):
      values = [x[key] for x in last]
      out[key] = float(np.mean(values))
      if len(values) > 1:
        out[f"{key}_std"] = float(np.std(values, ddof=1))
  out["train_seconds"] = float(np.mean([r.train_seconds for r in results]))
  if cfg.tune:
    out["chosen"] = choice  # the grid point chosen on validation
  out["hyperparameters"] = {k: getattr(hyper, k) for k in tuning_keys(algorithm)}
  return {"summary": out, "results": results, "table": table, "hyper": hyper}


def tuning_keys(algorithm: str) -> tuple[str, ...]:
  """The hyper-parameters a summary records for `algorithm`."""
  common = ("outer_steps", "weights", "reg_user", "reg_user_bias", "reg_item", "reg_noise")
  common += ("clip_label", "bias_scale")
  if algorithm == "am-dpsgd":
    return (*common, "clip_user", "dpsgd_steps", "item_id", "dpsgd_sampling", "dpsgd_clip") + (
      "dpsgd_learning_rate",
      "dpsgd_weight_decay",
      "dpsgd_optimizer",
    )
  if algorithm == "am-ssp":
    return (*common, "clip_user", "item_steps", "reg_params", "dim", "item_id")
  if algorithm == "dp-cmf":
    return (*common, "clip_user", "dim", "cmf_weight")
  if algorithm == "dp-als":
    return (*common, "clip_user", "dim")
  return common


def spent(cfg: PublicFeaturesConfig, algorithm: str, budget) -> dict:
  """The ε the accountants find for the run's noise multipliers."""
  if not cfg.private:
    return {"analytic": math.inf}
  if algorithm == "am-dpsgd":
    return {"rdp": accounting.dpsgd_epsilon(budget)}
  return accounting.ssp_epsilon(budget)


def run(
  cfg: PublicFeaturesConfig, out_dir: str | Path, progress: Callable[[str], None] | None = None
) -> dict:
  """Trains per the config and writes config.json, metrics.csv, summary.json (and tuning.csv)."""
  out = Path(out_dir)
  say = progress or (lambda _: None)
  dataset = build_dataset(cfg)
  if len(dataset.train) == 0:
    raise data.DataError("the training split is empty")
  reference = "" if cfg.private else " (the non-private reference: no noise)"
  say(
    f"{cfg.data}: {dataset.num_users} users, {dataset.features.num_items} items, "
    f"{len(dataset.train)} training ratings; {cfg.algorithm} at epsilon={cfg.epsilon:g}"
    f"{reference}" + (" (federated, TFF)" if cfg.federated else "")
  )
  releaser = algorithms.CENTRAL
  if cfg.federated:
    from fedmf.public_features import federated  # pylint: disable=g-import-not-at-top

    federated.use_own_context()
    releaser = federated.releaser(cfg.clients_per_call)

  def step_line(row: dict) -> None:
    shown = ", ".join(f"{k}={v:.4f}" for k, v in row.items() if k not in ("step", "seconds"))
    say(f"outer step {row['step']}/{cfg.outer_steps}: {shown} ({row['seconds']:.2f} s training)")

  budget = _budget_cache()
  hyper = hyperparameters(cfg)
  main = _method(cfg, dataset, cfg.algorithm, hyper, releaser, say, budget, step_line)
  chosen = budget(cfg.algorithm, cfg.epsilon, cfg.delta, main["hyper"])
  summary = {
    "algorithm": cfg.algorithm,
    "data": cfg.data,
    "epsilon": cfg.epsilon,  # inf is written as null in JSON: see "private"
    "private": cfg.private,
    "delta": cfg.delta,
    "dim": cfg.dim,
    "seed": cfg.seed,
    "seeds": cfg.seeds,
    "federated": cfg.federated,
    "tuned": cfg.tune,
    **{k: v for k, v in main["summary"].items() if k != "algorithm"},
  }
  privacy = {**main["results"][0].privacy, "user_level": True}
  privacy["epsilon_spent"] = spent(cfg, cfg.algorithm, chosen)
  if not cfg.private:
    privacy["guarantee"] = "none: epsilon inf runs without noise, a reference for comparison"
  if cfg.tune:
    privacy["not_covered"] = NOT_COVERED
  summary["privacy"] = privacy
  if cfg.baselines:
    summary["baselines"] = {
      "global_mean": baselines.global_mean(dataset),
      "item_mean": baselines.item_mean(dataset),
    }
    if cfg.algorithm != "dp-bias":
      say("baseline: the DP bias model (dp-bias) at the same epsilon")
      bias = _method(cfg, dataset, "dp-bias", replace(hyper, dim=0), releaser, say, budget)
      summary["baselines"]["dp_bias"] = bias["summary"]
  summary.update(
    num_users=dataset.num_users,
    num_items=dataset.features.num_items,
    num_train_ratings=len(dataset.train),
    num_validation_ratings=len(dataset.validation.target),
    num_test_ratings=len(dataset.test.target),
  )
  files = {
    out / "config.json": jsonio.json_text(as_dict(cfg)) + "\n",
    out / "metrics.csv": _metrics_csv(main["results"], cfg.seed),
    out / "summary.json": jsonio.json_text(summary) + "\n",
  }
  if main["table"]:
    files[out / "tuning.csv"] = _csv(main["table"])
  for path, text in files.items():
    # Owner-only, as the outputs have always been: config.json holds the seed of the noise.
    atomic_files.write_text(path, text, mode=0o600)
  return summary


def _csv(rows: list[dict]) -> str:
  names = list(dict.fromkeys(k for row in rows for k in row))
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  return buffer.getvalue()


def _metrics_csv(results: list, first_seed: int) -> str:
  rows = [
    {"seed": first_seed + k, **row} for k, result in enumerate(results) for row in result.metrics
  ]
  return _csv(rows)
