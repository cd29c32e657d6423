"""`fedmf audit`: the post-hoc min-separation auditor over a run directory or a participation log.

`fedmf audit RUN_DIR` reads the run's own strategy, noise multiplier, δ, rounds and declared schema
(`fedmf.program.audit_inputs`), so nothing is retyped; explicit flags override them, and a value that
differs from the run's is reported. `fedmf audit LOG --strategy ... --noise-multiplier ... --delta
...` audits any log. Exit codes: 0 audited, 1 `--strict` failed, 2 bad input (one line).

Notation as docs/architecture.md: --min-sep is the gap b (|i-j| >= b), never b-1.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from fedmf import jsonio
from fedmf.cli import common

DESCRIPTION = """\
Audit a participation log after training: the realized min-separation b and max participations k,
the violations of the declared schema, and the one privacy statement the log supports (sensitivity,
rho-zCDP, epsilon at delta for the realized participation; never a declared schema the log
violates).

SOURCE is a run directory written by `fedmf simulate` or `fedmf train` (its participation log,
strategy.json, plan.json, summary.json and config.json give the strategy, sigma, delta, the released
rounds and the declared schema; a flag overrides a value, and a value that differs from the run's is
reported), or a participation log file (.csv, .csv.gz, .jsonl, .jsonl.gz, .parquet with columns
round and client_id; docs/participation-log.md), which needs --strategy, --noise-multiplier and
--delta.

For CI and production pipelines, --strict makes the exit code the verdict: 0 when the log complies
with the declared schema, a privacy guarantee holds and epsilon is within --max-epsilon; 1 when any
of them fails (the reasons on stderr and in --json under "strict"); 2 for bad input.

A run with canaries (config section `canaries`) also reports its measured privacy (--json: object
"empirical"): per threat model (all_releases, final_model) the epsilon estimate of Andrew et al.'s
Gaussian fit, the one-run lower bound at 95% confidence and the analytic epsilon they are compared
with; --strict then also fails when a lower bound exceeds the analytic epsilon
(docs/empirical-privacy.md).

  fedmf audit out/run                                  # the run's own settings
  fedmf audit out/run --strict --max-epsilon 8         # gate a pipeline on the audit
  fedmf audit out/run --report out/run/reaudit         # HTML report with plots (report.html)
  fedmf audit log.csv --strategy blt.json --noise-multiplier 7.4 --delta 1e-6 --rounds 2000 \\
    --min-sep 342"""


def add_parser(subparsers: Any) -> None:
  parser = subparsers.add_parser(
    "audit",
    help="audit a run directory or participation log: realized min-sep, violations, epsilon",
    description=DESCRIPTION,
    formatter_class=_Formatter,
  )
  parser.add_argument(
    "source",
    metavar="SOURCE",
    help="a run directory (fedmf simulate/train --out) or a participation log file",
  )
  parser.add_argument(
    "--strategy",
    metavar="FILE.json",
    help="strategy file (default: the run's strategy.json; required for a log file)",
  )
  parser.add_argument(
    "--noise-multiplier",
    type=common.non_negative_float,
    metavar="SIGMA",
    help=common.SIGMA_HELP + "; 0 audits a run without DP (no guarantee). Default: the run's "
    "plan.json; required for a log file",
  )
  parser.add_argument(
    "--delta",
    type=common.probability,
    help="delta in (0, 1) (default: the run's; required for a log file)",
  )
  parser.add_argument(
    "--rounds",
    type=common.positive_int,
    metavar="N",
    help="number of released rounds n (default: the run's completed rounds; for a log file, max "
    "round + 1, with a warning)",
  )
  parser.add_argument(
    "--min-sep",
    type=common.positive_int,
    metavar="B",
    help="declared b: minimum gap between two participations of a client, |i-j| >= b "
    "(default: the run's declared schema)",
  )
  parser.add_argument(
    "--max-participations",
    type=common.positive_int,
    metavar="K",
    help="declared k: maximum participations of a client (default: the run's declared schema)",
  )
  parser.add_argument(
    "--count-noise-multiplier",
    type=common.non_negative_float,
    metavar="Z_B",
    help="adaptive clipping's count noise multiplier z_b (clip_norm: adaptive; docs/mechanisms.md): "
    "every claim composes the matrix mechanism with the k noisy counts a device of the log is in. "
    "Default: the run's plan.json (none for a fixed clip); for a log file, none unless given",
  )
  common.add_method_args(
    parser,
    accountant_help="analytic: the exact epsilon of the Gaussian mechanism each claim is (Balle & "
    "Wang 2018, Thm. 8; solved to float64 precision, the same as the report's epsilon curve); "
    "pld: dp_accounting's PLD accountant, a pessimistic discretization of the same curve "
    "(epsilon_pld >= epsilon), as a cross-check (default: analytic; an amplified claim is "
    "accounted with PLD, its only accountant)",
  )
  parser.add_argument(
    "--strict",
    action="store_true",
    help="exit 1 unless the log complies with the declared schema (no duplicate rows either), a "
    "privacy guarantee holds (sigma > 0, no lower-bound sensitivity) and epsilon is within "
    "--max-epsilon: a gate for CI and production pipelines",
  )
  parser.add_argument(
    "--max-epsilon",
    type=common.positive_float,
    metavar="EPS",
    help="the privacy budget: reported, drawn on the report's epsilon curve, and checked by --strict",
  )
  parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
  parser.add_argument(
    "--report",
    metavar="DIR",
    help="write report.html (self-contained, with plots), report.md, audit.json, "
    "epsilon_curve.csv and the PNG plots into DIR",
  )
  parser.add_argument(
    "--force", action="store_true", help="overwrite a report already in the --report DIR"
  )
  parser.add_argument(
    "--max-violations",
    type=common.positive_int,
    default=10,
    metavar="M",
    help="violations listed in the text summary (--json and the report list more)",
  )
  parser.add_argument(
    "--no-progress",
    action="store_true",
    help="no progress (a bar on a terminal; elsewhere a line with the ETA every 30 s of reading)",
  )
  common.add_resource_args(parser)
  parser.set_defaults(func=run)


class _Formatter(common.HelpFormatter, argparse.RawDescriptionHelpFormatter):
  """The description as written (examples keep their lines); flags with their defaults once."""


def run(args: argparse.Namespace) -> int:
  from fedmf.privacy import accounting  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import audit  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import audit_result  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import report as report_lib  # pylint: disable=g-import-not-at-top
  from fedmf.program import audit_inputs  # pylint: disable=g-import-not-at-top

  # Everything that can be refused is refused before the log is read.
  if args.report is not None:
    common.check_output_dir(args.report, "--report", report_lib.REPORT_FILES, force=args.force)
  inputs = audit_inputs.resolve(
    args.source,
    strategy=args.strategy,
    noise_multiplier=args.noise_multiplier,
    delta=args.delta,
    rounds=args.rounds,
    min_sep=args.min_sep,
    max_participations=args.max_participations,
    count_noise_multiplier=args.count_noise_multiplier,
  )
  progress = not args.no_progress  # A bar on a terminal; elsewhere a line every 30 s of reading.
  run_dir_path = args.source if os.path.isdir(args.source) else None
  result = audit.audit_log(
    inputs.log,
    **inputs.settings,
    method=args.sensitivity,
    accountant=args.accountant or accounting.CLAIM_ACCOUNTANT,
    curve=args.report is not None,
    progress=progress,
    max_epsilon=args.max_epsilon,
    notes=inputs.notes,
  )
  if inputs.warnings:  # Reported with the audit's own warnings (summary, --json, report).
    result = dataclasses.replace(result, warnings=inputs.warnings + result.warnings)
  if run_dir_path is not None:  # A run with canaries: its measured privacy (nothing without).
    from fedmf.program import canary_audit  # pylint: disable=g-import-not-at-top

    measured, warnings = canary_audit.measured_privacy(run_dir_path, result)
    if measured is not None or warnings:
      result = dataclasses.replace(
        result, empirical=measured, warnings=result.warnings + tuple(warnings)
      )
  paths = None
  if args.report is not None:
    from fedmf.program import run_dir  # pylint: disable=g-import-not-at-top

    # The run's training curves; a log file's report plots those of a run in --report DIR, if any.
    metrics = run_dir.read_metrics(run_dir_path if run_dir_path is not None else args.report)
    paths = report_lib.write_report(
      result, args.report, strategy_path=inputs.strategy_path, metrics=metrics
    )
  verdict = result.verdict()
  if args.json:
    print(jsonio.json_text(result.to_dict(), indent=None))
    for w in result.warnings:
      print(f"fedmf audit: warning: {w}", file=sys.stderr)
  else:
    print(audit_result.format_summary(result, max_violations=args.max_violations))
    if paths is not None:
      print(f"report: {paths['html']}")
  if args.strict and not verdict.passed:
    print(f"fedmf audit: strict: FAILED: {'; '.join(verdict.failures)}", file=sys.stderr)
    return 1
  if args.strict:
    print("fedmf audit: strict: passed", file=sys.stderr)
  return 0
