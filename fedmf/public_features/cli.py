"""The argparse parser of `fedmf public-features` (only argparse here: the work is imported lazily)."""

from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = """\
Private learning with public features (Krichene et al. 2023): train a two-tower model
u(user) . v(item features) by alternating minimization at user-level (epsilon, delta)-DP with AM-SSP
(sufficient statistics perturbation), AM-DPSGD or DP-ALS (item ids only), centralized or federated
(Algorithm 8 through TFF). Outputs in OUT: config.json, metrics.csv (one row per outer step) and
summary.json. Config keys (YAML; see docs/public-features.md): data (synthetic | movielens-10m |
movielens-20m), algorithm (am-ssp | am-dpsgd | dp-als), epsilon, delta, dim, seed, federated, and the
training recipe (outer_steps, item_steps, clip_user, clip_label, reg_item, ...)."""


def add_parser(subparsers) -> None:
  parser = subparsers.add_parser(
    "public-features",
    help="train a two-tower model with public item features (AM-SSP, AM-DPSGD, DP-ALS)",
    description=DESCRIPTION,
  )
  parser.add_argument("--config", metavar="FILE", help="YAML config (default: synthetic AM-SSP)")
  parser.add_argument(
    "--set",
    metavar="KEY=VALUE",
    action="append",
    default=[],
    dest="overrides",
    help="override a config key (repeatable), e.g. --set epsilon=1",
  )
  parser.add_argument("--data-dir", metavar="DIR", help="MovieLens directory (ratings and movies)")
  parser.add_argument("--out", metavar="DIR", required=True, help="output directory")
  parser.set_defaults(func=run)
  return parser


def run(args: argparse.Namespace, before_tff=None) -> int:
  """Runs the command; `before_tff()` is called before a federated run imports TensorFlow."""
  from fedmf.public_features import config  # pylint: disable=g-import-not-at-top
  from fedmf.public_features import driver  # pylint: disable=g-import-not-at-top

  cfg = config.load(args.config, args.overrides, args.data_dir)
  if cfg.federated and before_tff is not None:
    before_tff()
  summary = driver.run(cfg, args.out, lambda line: print(line, file=sys.stderr, flush=True))
  shown = {k: v for k, v in summary.items() if k != "privacy"}
  print(json.dumps(shown, indent=2))
  return 0
