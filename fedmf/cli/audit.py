"""`fedmf audit`: the post-hoc min-separation auditor over a participation log (see fedmf.privacy.audit).

Notation as docs/architecture.md: --min-sep is the gap B (|i-j| ≥ B), never B-1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fedmf.cli import common


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "audit",
    help="audit a participation log: realized min-sep, violations, rho and epsilon",
    description="Read a participation log (.csv/.csv.gz/.jsonl/.jsonl.gz/.parquet with columns "
    "round, client_id), compute the realized min-separation b and max "
    "participations k, the violations of the declared limits, and the privacy "
    "claim (sensitivity, rho-zCDP, epsilon at delta) the log supports.",
    formatter_class=argparse.ArgumentDefaultsHelpFormatter,
  )
  parser.add_argument("log", metavar="LOG", help="participation log")
  parser.add_argument("--strategy", required=True, metavar="FILE.json", help="strategy file")
  parser.add_argument(
    "--noise-multiplier", type=common.positive_float, required=True, help="sigma used in training"
  )
  parser.add_argument("--delta", type=common.probability, required=True, help="delta in (0, 1)")
  parser.add_argument(
    "--rounds",
    type=common.positive_int,
    default=None,
    help="number of released rounds n (default: max round + 1, with a warning)",
  )
  parser.add_argument(
    "--min-sep",
    type=common.positive_int,
    default=None,
    help="declared B: minimum gap between participations (|i-j| >= B)",
  )
  parser.add_argument(
    "--max-participations",
    type=common.positive_int,
    default=None,
    help="declared K: maximum participations per client",
  )
  common.add_method_args(parser, accountant_help="accountant for the headline epsilon")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument(
    "--report",
    metavar="DIR",
    default=None,
    help="write report.md, report.html, audit.json and plots into DIR",
  )
  parser.add_argument(
    "--max-violations",
    type=common.positive_int,
    default=10,
    help="violations listed in the human summary",
  )
  parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
  from fedmf.privacy import audit  # pylint: disable=g-import-not-at-top

  if args.report is not None:
    common.check_writable(args.report.rstrip("/") + "/report.md") if _exists_dir(
      args.report
    ) else common.check_writable(args.report)
  progress = not args.no_progress and sys.stderr.isatty()
  result = audit.audit_log(
    args.log,
    args.strategy,
    args.noise_multiplier,
    args.delta,
    rounds=args.rounds,
    min_sep=args.min_sep,
    max_participations=args.max_participations,
    method=args.sensitivity,
    accountant=args.accountant,
    curve=args.report is not None,
    progress=progress,
  )
  if args.report is not None:
    from fedmf.privacy import report  # pylint: disable=g-import-not-at-top

    paths = report.write_report(result, args.report, strategy_path=args.strategy)
  if args.json:
    print(json.dumps(result.to_dict()))
  else:
    print(audit.format_summary(result, max_violations=args.max_violations))
    if args.report is not None:
      print(f"report: {paths['markdown']}")
  if args.json:
    for w in result.warnings:
      print(f"fedmf audit: warning: {w}", file=sys.stderr)
  return 0


def _exists_dir(path: str) -> bool:
  import os  # pylint: disable=g-import-not-at-top

  return os.path.isdir(path)
