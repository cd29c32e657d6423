"""The argparse parser of `fedmf public-features` (only argparse here: the work is imported lazily,
and run by `fedmf.cli.public_features`)."""

from __future__ import annotations

import argparse

from fedmf import config_parse

DESCRIPTION = """\
Private learning with public features (Krichene et al. 2023): train a two-tower model
u(user) . v(item features) with user and item biases by alternating minimization at user-level
(epsilon, delta)-DP with AM-SSP (sufficient statistics perturbation), AM-DPSGD, DP-ALS (item ids
only) or the DP bias model, centralized or federated (Algorithm 8 through TFF), beside the
baselines (global mean, per-item mean, the DP bias model at the same epsilon). --set epsilon=inf
runs the non-private reference (no noise). --tune chooses each method's hyper-parameters on the
validation split from a small grid and reports test at that point (tuning is not covered by the
guarantee, as in the paper).

Outputs in OUT, written beside it and moved into place when the run has finished: config.json,
metrics.csv (one row per seed and outer step), summary.json, tuning.csv (with --tune) and run.json.

Config keys (YAML; see docs/public-features.md): data (synthetic | movielens-100k | movielens-1m |
movielens-10m | movielens-20m), algorithm (am-ssp | am-dpsgd | dp-als | dp-cmf | dp-bias), epsilon (or inf),
delta, dim, seed, seeds, federated, item_id, biases, duplicates (refuse | mean), and the training
recipe (outer_steps, item_steps, clip_user, clip_label, reg_item, reg_noise, ...). --set KEY= sets
KEY to null; a key given twice is refused."""


def add_parser(subparsers) -> argparse.ArgumentParser:
  parser = subparsers.add_parser(
    "public-features",
    help="train a two-tower model with public item features (AM-SSP, AM-DPSGD, DP-ALS)",
    description=DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--config", metavar="FILE", help="YAML config (default: synthetic AM-SSP)")
  parser.add_argument(
    "--set",
    metavar="KEY=VALUE",
    action="append",
    default=[],
    type=config_parse.override_argument,
    dest="overrides",
    help="override a config key (repeatable), e.g. --set epsilon=1",
  )
  parser.add_argument(
    "--data-dir",
    metavar="DIR",
    help="MovieLens directory: u.data and u.item (movielens-100k), ratings.dat and movies.dat "
    "(movielens-1m, -10m) or ratings.csv and movies.csv (movielens-20m)",
  )
  parser.add_argument(
    "--tune",
    action="store_true",
    help="choose the hyper-parameters on validation over the method's grid (docs/public-features.md)",
  )
  parser.add_argument("--out", metavar="DIR", required=True, help="output directory")
  parser.add_argument(
    "--force", action="store_true", help="replace an output directory that holds another run"
  )
  return parser
