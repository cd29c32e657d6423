"""The report as one document: every section, table, figure and number, built once from an audit.

One concept: decide what the privacy report says. `build_document` turns an
`fedmf.privacy.audit.AuditResult` (and, for a run, its `RunMetrics`) into a `ReportDocument` of
plain strings, tables and PNG figures; `fedmf.privacy.report_render` only lays it out as HTML or
markdown. The report leads with the one statement the log supports (`AuditResult.verdict()`: the
realized participation, never a declared schema the log violates), then the numbers, the plots and
the violating clients, and the statement in the structure of BLT App. C (after Ponomareva et al.
2023, Sec. 5.3). The numbers of a run (metrics.csv, summary.json) come in as `RunMetrics`, read by
the program that wrote them (`fedmf.program.run_dir.read_metrics`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from fedmf import __version__
from fedmf import display
from fedmf.privacy import audit_result
from fedmf.privacy import log_counts
from fedmf.privacy import report_words
from fedmf.privacy import report_measured

# The file of each plot, by key.
PLOT_FILES = {
  "epsilon": "epsilon_vs_rounds.png",
  "participations": "participations_per_client.png",
  "gaps": "gap_histogram.png",
  "violators": "violating_clients.png",
  "training": "training.png",
  "clip": "clip_norm.png",
  "checkins": "checkins.png",
  "canaries": "canary_statistics.png",
}


@dataclasses.dataclass(frozen=True)
class RunMetrics:
  """A run's per-round metrics (metrics.csv's columns) as float arrays (NaN where empty), and the
  test accuracy before training (None if unknown): the report's input, given by the program."""

  columns: dict[str, np.ndarray]
  initial_accuracy: Optional[float] = None
  # (rounds completed, accuracy) of the final model when it was evaluated after the last
  # evaluation round (a run stopped by its budget between two evaluations).
  final_accuracy: Optional[tuple[int, float]] = None

  def get(self, name: str) -> Optional[np.ndarray]:
    values = self.columns.get(name)
    if values is None or not np.isfinite(values).any():
      return None
    return values


@dataclasses.dataclass(frozen=True)
class Table:
  """A table: its header, its rows of cells, which columns hold numbers, which rows fail."""

  head: tuple[str, ...]
  rows: tuple[tuple[str, ...], ...]
  numeric: tuple[bool, ...]
  failing: tuple[bool, ...]


@dataclasses.dataclass(frozen=True)
class Figure:
  """A plot: its key, the section of the page it belongs to (anchor, heading), its title (the alt
  text), caption, file name and PNG bytes."""

  key: str
  section: tuple[str, str]
  title: str
  caption: str
  file: str
  png: bytes


@dataclasses.dataclass(frozen=True)
class ViolationRow:
  client_id: str
  reason: str
  rounds: str  # The first 20 rounds, then ", ...".


@dataclasses.dataclass(frozen=True)
class ReportDocument:
  """Everything the report shows, in page order, as plain values (nothing left to compute)."""

  log: str
  strategy: str
  rounds: int
  status: str  # 'ok' | 'warn' | 'bad': the statement box.
  headline: str
  statement: str
  strict: Optional[str]  # 'passes' or 'fails: ...', when a budget is given or the audit fails.
  facts: tuple[tuple[str, str], ...]
  notes: tuple[str, ...]
  warnings: tuple[str, ...]
  claims: Table
  noise_multiplier: float
  accountant: str
  sensitivity_algorithm: str
  figures: tuple[Figure, ...]
  no_refusals: Optional[str]  # Said in words when the run refused no check-in.
  violation_counts: tuple[tuple[str, int], ...]  # (reason, clients)
  violations: tuple[ViolationRow, ...]  # The first `max_violations`.
  more_violations: int  # Listed in audit.json only.
  statement_sections: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
  explanations: tuple[report_words.Paragraph, ...] = ()  # In plain words, with their docs.
  # Measured privacy (a run with canaries; `fedmf.privacy.report_measured`), else None.
  measured: Optional[Any] = None
  version: str = __version__


def _fmt(value: Optional[float], digits: int = 4) -> str:
  if value is None:
    return "not given"
  return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def privacy_statement(result: audit_result.AuditResult) -> list[tuple[str, list[tuple[str, str]]]]:
  """The statement as (section, [(item, text)]) in the structure of BLT App. C.

  Its formal statement is `AuditResult.verdict().statement`: what the log supports.
  """
  a = result.realized
  s = result.stats
  v = result.verdict()
  strategy = result.strategy.get("description", result.strategy["mechanism"])
  if result.no_noise:
    return [
      (
        "1. DP setting",
        [("Setting", "None: the noise multiplier is 0, so the run added no noise (a baseline).")],
      ),
      ("2. Formal DP statement", [("Formal DP statement", v.statement)]),
    ]
  uncovered = (
    ""
    if result.claim_covers_all_clients
    else f", except the {v.uncovered_clients} clients with duplicate (round, client_id) rows"
  )
  b_text = (
    f"at least {s.observed_min_sep} rounds between two consecutive participations of a client"
    if s.observed_min_sep is not None
    else "no client participated twice"
  )
  method_note = {
    "exact": "exact (a theorem applies to this strategy and schema)",
    "upper-bound": "a valid upper bound, so the guarantee holds (possibly loosely)",
    "lower-bound": "a LOWER bound: the stated epsilon is NOT a guarantee",
  }.get(a.sensitivity_method, a.sensitivity_method)
  acct = (
    "PLD accounting (dp_accounting) for (epsilon, delta)-DP"
    if a.accountant == "pld"
    else "the exact analytic Gaussian curve (Balle & Wang 2018) for (epsilon, delta)-DP"
  )
  if result.amplification_credited:  # The claim is the amplified event's: PLD its accountant.
    acct += (
      "; the amplified claim by PLD accounting (dp_accounting) of the Poisson-subsampled event, "
      "its only accountant"
    )
  rounds_source = (
    "given" if result.rounds_source == "given" else "inferred from the log: max round + 1"
  )
  return [
    (
      "1. DP setting",
      [
        (
          "Setting",
          "Central DP: the server is trusted to implement the mechanism correctly, including "
          "clipping every client update to norm 1 (in units of the clip norm) and adding the "
          "correlated Gaussian noise."
          + (
            " The clip norm is adaptive (Andrew et al. 2021): round t clips to and scales its "
            "noise by a clip norm computed from the noisy counts of earlier rounds, so the "
            "release divided by it is the unit-clip mechanism."
            if a.adaptive
            else ""
          ),
        ),
      ],
    ),
    (
      "2. Instantiating the DP definition",
      [
        (
          "Data accesses covered",
          f"All clients in the participation log of this single training run{uncovered}. "
          "Hyperparameter tuning and model selection are not covered.",
        ),
        (
          "Final mechanism output",
          f"The full sequence of {result.rounds} noisy aggregates; all intermediate models are "
          "post-processing and are protected.",
        ),
        (
          "Unit of privacy",
          "Device-level (one client_id is one device): adjacency is over a device's entire "
          "local dataset. For single-device users this is user-level DP.",
        ),
        (
          "Adjacency",
          "Zero-out: a neighboring run replaces all of one client's model updates with zeros"
          + (
            " (and its adaptive-clipping reports, centred at ±1/2, with 0)." if a.adaptive else "."
          ),
        ),
      ],
    ),
    (
      "3. Privacy accounting",
      [
        (
          "Type of accounting",
          f"rho-zCDP and {acct}. The matrix mechanism with noise multiplier "
          f"{a.noise_multiplier:g} and sensitivity {a.sensitivity:.6g}"
          + (
            f", composed with the {a.count_releases} noisy counts of adaptive clipping a "
            f"device is in (count noise multiplier {a.count_noise_multiplier:g}, sensitivity "
            "1/2 each),"
            if a.adaptive
            else ""
          )
          + f" is one Gaussian mechanism with noise multiplier {a.effective_noise_multiplier:.6g}.",
        ),
        (
          "Sensitivity",
          f"{a.sensitivity:.6g} for strategy {strategy} over n = {result.rounds} rounds, "
          f"b = {s.observed_min_sep if s.observed_min_sep is not None else 'none'}, "
          f"k = {s.observed_max_participations} ({a.sensitivity_algorithm}); {method_note}.",
        ),
        (
          "Accounting assumptions",
          f"The participation log is complete and accurate (every participation is recorded); "
          f"exactly {result.rounds} rounds were released ({rounds_source}); participation as "
          f"realized in the log: {b_text}, and at most {s.observed_max_participations} "
          "participations per client (enforced on devices by a timer and checked post hoc here).",
        ),
        ("Formal DP statement", v.statement),
      ],
    ),
  ]


def _status(result: audit_result.AuditResult) -> tuple[str, str]:
  """(css class, short title) of the statement box."""
  v = result.verdict()
  if not v.guarantee:
    return "bad", "No privacy guarantee"
  if v.declared_holds is False:
    return "warn", "The log violates the declared schema: the realized guarantee holds"
  if v.uncovered_clients:
    return "warn", "Guarantee for all clients but those with duplicate rows"
  if result.partition_violations:
    return "warn", "The log violates the declared partitions: no amplification credited"
  if result.max_epsilon is not None and result.epsilon > result.max_epsilon:
    return "warn", "Guarantee holds, above the budget"
  return "ok", "Privacy guarantee holds"


def _facts(result: audit_result.AuditResult, hashes: dict[str, Any]) -> list[tuple[str, str]]:
  s = result.stats
  a = result.realized
  realized_b = (
    s.observed_min_sep if s.observed_min_sep is not None else "none (single participation)"
  )
  facts = [
    ("Participation log", f"{result.log}"),
    ("Strategy", result.strategy.get("description", result.strategy["mechanism"])),
    (
      "Noise multiplier σ",
      f"{a.noise_multiplier:g}" + (" (no DP)" if result.no_noise else " (applied to C as loaded)"),
    ),
    ("δ", f"{a.delta:g}"),
    (
      "Rounds released n",
      f"{result.rounds} ({'given' if result.rounds_source == 'given' else 'inferred'})",
    ),
    ("Clients / participations / log rows", f"{s.clients} / {s.participations} / {s.log_rows}"),
    ("Realized participation", f"b = {realized_b}, k = {s.observed_max_participations}"),
  ]
  if result.declared is not None:
    d = result.declared
    holds = "the log complies" if result.verdict().declared_holds else "VIOLATED by the log"
    facts.append(
      (
        "Declared participation",
        f"{audit_result.declared_in_words(d.min_sep, d.max_participations)}: {holds}",
      )  # pylint: disable=protected-access
    )
  if result.max_epsilon is not None:
    facts.append(("Budget ε (--max-epsilon; a run's budget.epsilon)", f"{result.max_epsilon:g}"))
  facts.append(("Log sha256", hashes.get("log") or "not available"))
  if hashes.get("strategy"):
    facts.append(("Strategy sha256", hashes["strategy"]))
  return facts


def _claims_rows(result: audit_result.AuditResult) -> list[list[str]]:
  s = result.stats
  a = result.realized
  rows = [
    [
      "realized (from the log)",
      str(s.observed_min_sep) if s.observed_min_sep is not None else "none",
      str(s.observed_max_participations),
      f"{a.sensitivity:.6g}",
      a.sensitivity_method,
      _fmt(a.rho),
      display.epsilon(a.epsilon),
      "yes" if result.verdict().guarantee else "no",
    ]
  ]
  if result.declared is not None:
    d = result.declared.accounting
    holds = result.verdict().declared_holds and result.verdict().guarantee
    rows.append(
      [
        "declared",
        "any" if result.declared.min_sep is None else f">= {result.declared.min_sep}",
        "any"
        if result.declared.max_participations is None
        else f"<= {result.declared.max_participations}",
        f"{d.sensitivity:.6g}",
        d.sensitivity_method,
        _fmt(d.rho),
        display.epsilon(d.epsilon),
        "yes" if holds else "NO",
      ]
    )
  if result.amplified is not None and not result.no_noise:
    acc = result.amplified.accounting
    c = result.amplified.compliance
    rows.append(
      [
        f"amplified ({c.partitions}-cyclic Poisson)",
        f"{c.partitions} partitions",
        "-" if acc is None else str(acc.sampling.steps(acc.n)),
        "-" if acc is None else f"{acc.max_column_norm:.6g}",
        "BandMF Thm 4",
        "-",
        "-" if acc is None else display.epsilon(acc.epsilon),
        "yes" if result.amplification_credited and result.verdict().guarantee else "NO",
      ]
    )
  return rows


_CLAIM_HEAD = ["claim", "b", "k", "sensitivity", "method", "rho-zCDP", "epsilon", "holds"]
_FIGURES = (
  (
    "epsilon",
    "Privacy over rounds",
    "ε after r released rounds for the realized participation of the first r rounds; dashed: the declared ε; dotted: the budget, when there is one (fedmf audit --max-epsilon; fedmf train's budget.epsilon).",
  ),
  (
    "participations",
    "Participations per client",
    "Clients by the number of rounds they joined; red bars exceed the declared k.",
  ),
  (
    "gaps",
    "Gaps between participations",
    "Gaps between consecutive participations of a client; red bars fall below the declared b.",
  ),
  (
    "violators",
    "Violating clients",
    "The first violating clients, one per row: dots are their rounds, red segments gaps below the declared b.",
  ),
  (
    "training",
    "Training",
    "Test accuracy and loss of the model on the evaluated rounds (metrics.csv); a diamond: the final model, evaluated when the run stopped between two evaluation rounds.",
  ),
  (
    "canaries",
    "Canary statistics",
    "Per threat model, the statistics of the inserted canaries against the held-out ones (the "
    "null), with the Gaussians fitted to each (Andrew et al. 2024); dashed: where the inserted ones "
    "would sit if the mechanism is exactly as analyzed.",
  ),
  (
    "clip",
    "Adaptive clip norm",
    "The clip norm ζ_t of each round (adaptive clipping, Andrew et al. 2021) and the fraction of clients whose update was within it: the noisy fraction released to move ζ (dots) and the exact one (line; metrics.csv).",
  ),
  (
    "checkins",
    "Check-ins refused",
    "Devices whose check-in the server refused because their timer had not expired (metrics.csv).",
  ),
)


# The section of the page each figure belongs to (anchor, heading).
_SECTIONS = {
  "epsilon": ("privacy", "Privacy over rounds"),
  "participations": ("participation", "Participation"),
  "gaps": ("participation", "Participation"),
  "violators": ("participation", "Participation"),
  "training": ("training", "Training"),
  "clip": ("training", "Training"),
  "checkins": ("training", "Training"),
  "canaries": ("measured", "Measured privacy"),
}


def _no_refusals(metrics: RunMetrics) -> str:
  rounds = metrics.get("round")
  count = 0 if rounds is None else int(rounds.shape[0])
  return f"No check-in was refused in the {count} rounds (metrics.csv: refused_checkins)."


def build_document(
  result: audit_result.AuditResult,
  plots: dict[str, bytes],
  hashes: dict[str, Any],
  max_violations: int,
  metrics: Optional[RunMetrics] = None,
) -> ReportDocument:
  """The report of `result`: `plots` by key (`fedmf.privacy.report_plots.draw`), the sha256 of
  the log and the strategy file, the first `max_violations` violations listed."""
  v = result.verdict()
  status, headline = _status(result)
  strict = None
  if result.max_epsilon is not None or v.failures:
    strict = "passes" if v.passed else "fails: " + "; ".join(v.failures)
  claims = tuple(tuple(row) for row in _claims_rows(result))
  figures = tuple(
    Figure(key, _SECTIONS[key], title, caption, PLOT_FILES[key], plots[key])
    for key, title, caption in _FIGURES
    if key in plots
  )
  counts = result.violation_counts()
  violations = tuple(
    ViolationRow(
      viol.client_id,
      viol.reason,
      ", ".join(map(str, viol.rounds[:20])) + (", ..." if len(viol.rounds) > 20 else ""),
    )
    for viol in result.violations[:max_violations]
  )
  return ReportDocument(
    log=str(result.log),
    strategy=result.strategy.get("description", result.strategy["mechanism"]),
    rounds=result.rounds,
    status=status,
    headline=headline,
    statement=v.statement,
    strict=strict,
    facts=tuple(_facts(result, hashes)),
    notes=tuple(result.notes),
    warnings=tuple(result.warnings),
    claims=Table(
      head=tuple(_CLAIM_HEAD),
      rows=claims,
      numeric=tuple(i not in (0, 4, 7) for i in range(len(_CLAIM_HEAD))),
      failing=tuple(row[-1] in ("no", "NO") for row in claims),
    ),
    noise_multiplier=result.realized.noise_multiplier,
    accountant=result.realized.accountant,
    sensitivity_algorithm=result.realized.sensitivity_algorithm,
    figures=figures,
    no_refusals=(
      _no_refusals(metrics) if metrics is not None and "checkins" not in plots else None
    ),
    violation_counts=tuple((reason, counts[reason]) for reason in log_counts.REASONS),
    violations=violations,
    more_violations=max(result.violations.total - max_violations, 0) if violations else 0,
    statement_sections=tuple(
      (section, tuple(items)) for section, items in privacy_statement(result)
    ),
    explanations=report_words.for_result(result),
    measured=report_measured.section(result.empirical),
  )
