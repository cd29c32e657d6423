"""The human privacy report of an audit: one self-contained HTML page, its markdown twin, PNG plots.

One concept: render an `fedmf.privacy.audit.AuditResult` as a report a privacy reviewer can read
offline. `report.html` is semantic HTML (sections, tables, figures) with its plots embedded as
base64 PNGs and its style inline: no network, no script. It leads with the one statement the log
supports (`AuditResult.verdict()`: the realized participation, never a declared schema the log
violates), then the numbers, the ε curve with the declared ε and the budget, the participation
histograms and the violating clients, the training curves when the run directory has metrics.csv,
and the statement in the structure of BLT App. C (after Ponomareva et al. 2023, Sec. 5.3).

Plots use linear axes unless the counts span more than three orders of magnitude. Notation:
docs/architecture.md (b is the gap).
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import html
import io
import json
import math
import os
import pathlib
from typing import Any, Optional

import numpy as np

from fedmf import atomic_files
from fedmf import jsonio
from fedmf import __version__
from fedmf.privacy import audit as audit_lib

# Every file `write_report` may write (`fedmf audit --report` refuses a directory holding one of
# them unless --force).
PLOT_FILES = {
  "epsilon": "epsilon_vs_rounds.png",
  "participations": "participations_per_client.png",
  "gaps": "gap_histogram.png",
  "violators": "violating_clients.png",
  "training": "training.png",
  "checkins": "checkins.png",
}
REPORT_FILES = (
  "report.html",
  "report.md",
  "audit.json",
  "epsilon_curve.csv",
  *PLOT_FILES.values(),
)

# Colors (matplotlib's tab palette) shared by the plots and the page.
_OK, _BAD, _MAIN, _DECLARED, _BUDGET = "#2ca02c", "#d62728", "#1f77b4", "#ff7f0e", "#9467bd"
_MAX_CURVE_POINTS = 4000  # Points drawn of a long ε curve (the CSV has them all).
_MAX_TIMELINE_CLIENTS = 30
_WIDTH = 7.6  # inches; at 120 dpi a plot is 912 pixels wide, the width of the page's text.


# ---------------------------------------------------------------------------------------------------
# Run metrics (metrics.csv of fedmf simulate / train), when the report is for a run directory.


@dataclasses.dataclass(frozen=True)
class RunMetrics:
  """Per-round columns of metrics.csv as float arrays (NaN where empty), and the test accuracy
  before training (summary.json's initial_test_accuracy; None if absent)."""

  columns: dict[str, np.ndarray]
  initial_accuracy: Optional[float] = None

  def get(self, name: str) -> Optional[np.ndarray]:
    values = self.columns.get(name)
    if values is None or not np.isfinite(values).any():
      return None
    return values


def read_metrics(run_dir: str | os.PathLike[str]) -> Optional[RunMetrics]:
  """A run directory's metrics.csv as columns, or None when absent or unreadable (the report goes
  on without the training plots)."""
  path = pathlib.Path(run_dir) / "metrics.csv"
  if not path.is_file():
    return None
  try:
    with open(path, newline="", encoding="utf-8") as f:
      rows = list(csv.DictReader(f))
  except (OSError, UnicodeDecodeError, csv.Error):
    return None
  if not rows or "round" not in rows[0]:
    return None

  def number(text: Optional[str]) -> float:
    try:
      return float(text) if text not in (None, "") else math.nan
    except ValueError:
      return math.nan

  names = [k for k in rows[0] if k is not None]
  initial = None
  try:
    summary = json.loads((pathlib.Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    value = summary.get("initial_test_accuracy") if isinstance(summary, dict) else None
    initial = float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
  except (OSError, ValueError):
    pass
  return RunMetrics({k: np.array([number(r.get(k)) for r in rows]) for k in names}, initial)


# ---------------------------------------------------------------------------------------------------
# Plots.


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  plt.rcParams.update(
    {
      "font.size": 10,
      "axes.titlesize": 11,
      "axes.spines.top": False,
      "axes.spines.right": False,
    }
  )
  return plt


def _png(fig) -> bytes:
  buf = io.BytesIO()
  fig.tight_layout()
  fig.savefig(buf, format="png", dpi=120)
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  plt.close(fig)
  return buf.getvalue()


def _count_axis(ax, counts: np.ndarray) -> None:
  """Linear counts, unless they span more than three orders of magnitude (then log)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  positive = counts[counts > 0]
  if positive.size and positive.max() / positive.min() > 1000:
    ax.set_yscale("log")
  else:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _bars(ax, values, counts, bad, label_bad: str, label_ok: str) -> None:
  colors = np.where(bad, _BAD, _MAIN)
  width = 0.8 if values.size < 2 else max(0.8, 0.8 * (values.max() - values.min() + 1) / 150)
  ax.bar(values, counts, width=width, color=colors)
  if values.size <= 25:  # Few bars: their counts are easier read as numbers.
    for x, c in zip(values, counts):
      ax.annotate(
        f"{int(c)}",
        (x, c),
        ha="center",
        va="bottom",
        fontsize=8,
        xytext=(0, 1),
        textcoords="offset points",
      )
  from matplotlib.patches import Patch  # pylint: disable=g-import-not-at-top

  handles = [Patch(color=_MAIN, label=label_ok)]
  if bad.any():
    handles.append(Patch(color=_BAD, label=label_bad))
  return handles


def _plot_participations(result: audit_lib.AuditResult) -> bytes:
  plt = _pyplot()
  s = result.stats
  k_declared = result.declared.max_participations if result.declared else None
  fig, ax = plt.subplots(figsize=(_WIDTH, 3.4))
  values, counts = s.participation_values, s.participation_counts
  bad = values > k_declared if k_declared is not None else np.zeros(values.shape, bool)
  handles = _bars(ax, values, counts, bad, "above the declared k (violating)", "clients")
  if k_declared is not None:
    line = ax.axvline(
      k_declared + 0.5, color=_DECLARED, ls="--", label=f"declared k = {k_declared}"
    )
    handles.append(line)
  ax.legend(handles=handles, frameon=False, loc="upper right")
  _count_axis(ax, counts)
  ax.set_xlabel("participations per client")
  ax.set_ylabel("clients")
  ax.set_title(f"Participations per client (realized k = {s.observed_max_participations})")
  ax.margins(y=0.15)
  return _png(fig)


def _plot_gaps(result: audit_lib.AuditResult) -> bytes:
  plt = _pyplot()
  s = result.stats
  b_declared = result.declared.min_sep if result.declared else None
  fig, ax = plt.subplots(figsize=(_WIDTH, 3.4))
  if s.gap_values.size:
    values, counts = s.gap_values, s.gap_counts
    bad = values < b_declared if b_declared is not None else np.zeros(values.shape, bool)
    handles = _bars(ax, values, counts, bad, "below the declared b (violating)", "gaps")
    if b_declared is not None:
      handles.append(
        ax.axvline(b_declared - 0.5, color=_DECLARED, ls="--", label=f"declared b = {b_declared}")
      )
    ax.legend(handles=handles, frameon=False, loc="upper right")
    _count_axis(ax, counts)
    ax.margins(y=0.15)
  else:
    ax.text(0.5, 0.5, "no client participated twice", ha="center", transform=ax.transAxes)
    ax.set_yticks([])
  ax.set_xlabel("gap between consecutive participations of a client (rounds)")
  ax.set_ylabel("count")
  realized = s.observed_min_sep if s.observed_min_sep is not None else "none"
  ax.set_title(f"Min-separation: gaps between participations (realized b = {realized})")
  return _png(fig)


def _plot_epsilon(result: audit_lib.AuditResult) -> bytes:
  plt = _pyplot()
  c = result.curve
  fig, ax = plt.subplots(figsize=(_WIDTH, 3.6))
  step = max(1, -(-c.rounds.shape[0] // _MAX_CURVE_POINTS))
  idx = np.unique(np.append(np.arange(0, c.rounds.shape[0], step), c.rounds.shape[0] - 1))
  ax.plot(c.rounds[idx], c.epsilon[idx], color=_MAIN, lw=2, label="realized: first r rounds")
  final = float(c.epsilon[-1])
  ax.plot([c.rounds[-1]], [final], "o", color=_MAIN)
  ax.annotate(
    f"ε = {final:.3g}",
    (c.rounds[-1], final),
    xytext=(-6, 6),
    textcoords="offset points",
    ha="right",
    color=_MAIN,
  )
  top = final
  if result.declared is not None and math.isfinite(result.declared.accounting.epsilon):
    eps_d = result.declared.accounting.epsilon
    holds = result.verdict().declared_holds
    ax.axhline(
      eps_d,
      color=_DECLARED if holds else _BAD,
      ls="--",
      label=f"declared ε = {eps_d:.4g}" + ("" if holds else " (does NOT hold)"),
    )
    top = max(top, eps_d)
  if result.max_epsilon is not None:
    ax.axhline(
      result.max_epsilon, color=_BUDGET, ls=":", lw=2, label=f"budget ε = {result.max_epsilon:g}"
    )
    top = max(top, result.max_epsilon)
  ax.set_ylim(0, top * 1.15 if top > 0 else 1)
  ax.set_xlim(0, c.rounds[-1] * 1.02)
  ax.set_xlabel("rounds released r")
  ax.set_ylabel(f"ε at δ = {c.delta:g}")
  ax.set_title("Privacy over rounds (realized participation of the first r rounds)")
  ax.grid(alpha=0.3)
  ax.legend(frameon=False, loc="lower right")
  return _png(fig)


def _plot_violators(result: audit_lib.AuditResult) -> Optional[bytes]:
  """Each listed violating client's participations on a row; too-close pairs joined in red."""
  listed = [v for v in result.violations[: 4 * _MAX_TIMELINE_CLIENTS]]
  if not listed:
    return None
  plt = _pyplot()
  by_client: dict[str, dict[str, Any]] = {}
  for v in listed:
    entry = by_client.setdefault(v.client_id, {"rounds": set(), "reasons": set()})
    entry["rounds"].update(v.rounds)
    entry["reasons"].add(v.reason)
    if len(by_client) >= _MAX_TIMELINE_CLIENTS:
      break
  b = result.declared.min_sep if result.declared else None
  rows = list(by_client.items())
  fig, ax = plt.subplots(figsize=(_WIDTH, 0.8 + 0.22 * len(rows)))
  for y, (_, entry) in enumerate(rows):
    rounds = np.array(sorted(entry["rounds"]))
    ax.plot(rounds, np.full(rounds.shape, y), "o", color=_MAIN, ms=4)
    if b is not None and rounds.size > 1:
      close = np.flatnonzero(np.diff(rounds) < b)
      for i in close:
        ax.plot(rounds[i : i + 2], [y, y], color=_BAD, lw=3)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels(
    [name if len(name) <= 24 else name[:21] + "..." for name, _ in rows], fontsize=7
  )
  ax.invert_yaxis()
  ax.set_xlim(-0.5, result.rounds - 0.5)
  ax.set_xlabel("round")
  extra = "" if b is None else f"; red: gaps below the declared b = {b}"
  ax.set_title(f"Violating clients (first {len(rows)}): their participations{extra}", fontsize=10)
  ax.grid(axis="x", alpha=0.3)
  return _png(fig)


def _plot_training(metrics: RunMetrics) -> Optional[bytes]:
  rounds = metrics.get("round")
  accuracy, test_loss, loss = metrics.get("accuracy"), metrics.get("test_loss"), metrics.get("loss")
  if rounds is None or (accuracy is None and test_loss is None and loss is None):
    return None
  plt = _pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(_WIDTH, 3.2))
  x = rounds + 1  # Rounds completed.
  if accuracy is not None:
    ok = np.isfinite(accuracy)
    xs, ys = x[ok], accuracy[ok]
    if metrics.initial_accuracy is not None:  # Before the first round.
      xs, ys = np.append(0, xs), np.append(metrics.initial_accuracy, ys)
    left.plot(xs, ys, "o-", color=_MAIN, ms=3)
    left.set_ylim(0, max(float(np.nanmax(ys)) * 1.15, 1e-3))
  left.set_title("Test accuracy")
  left.set_xlabel("rounds completed")
  left.grid(alpha=0.3)
  shown = []
  if loss is not None:
    ok = np.isfinite(loss)
    right.plot(x[ok], loss[ok], color="#7f7f7f", lw=1, label="training loss (cohort)")
    shown.append(loss[ok])
  if test_loss is not None:
    ok = np.isfinite(test_loss)
    right.plot(x[ok], test_loss[ok], "o-", color=_DECLARED, ms=3, label="test loss")
    shown.append(test_loss[ok])
  title = "Loss"
  values = np.concatenate(shown) if shown else np.zeros(0)
  if values.size >= 5:
    # One divergent round must not flatten the curve (issue 26, A.4): scale to the bulk of the
    # rounds and say what lies above.
    low, high = np.percentile(values, [0, 95])
    top = high + 0.25 * max(high - low, abs(high) * 0.05)
    above = values > top
    if above.any():
      right.set_ylim(min(low, 0) if low >= 0 else low, top)
      title += f" ({int(above.sum())} above the plot, up to {float(values.max()):.4g})"
  zeroed = metrics.get("zeroed")
  if zeroed is not None and np.nansum(zeroed) > 0:
    hit = np.nan_to_num(zeroed) > 0
    bottom = right.get_ylim()[0]
    right.plot(x[hit], np.full(int(hit.sum()), bottom), "x", color=_BAD, ms=6,
               label=f"rounds with zeroed updates ({int(np.nansum(zeroed))} updates)")  # fmt: skip
  right.set_title(title)
  right.set_xlabel("rounds completed")
  right.grid(alpha=0.3)
  right.legend(frameon=False)
  return _png(fig)


def _plot_checkins(metrics: RunMetrics) -> Optional[bytes]:
  rounds, refused = metrics.get("round"), metrics.get("refused_checkins")
  if rounds is None or refused is None or not np.nansum(refused):
    return None  # None refused: the page says so in words.
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(_WIDTH, 2.8))
  ax.bar(rounds, np.nan_to_num(refused), width=1.0, color=_BAD, label="refused check-ins")
  early = metrics.get("early_admitted")
  if early is not None and np.nansum(early) > 0:
    ax.bar(
      rounds,
      np.nan_to_num(early),
      width=1.0,
      color=_DECLARED,
      alpha=0.8,
      label="early check-ins admitted",
    )
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  total = int(np.nansum(refused))
  ax.set_title(f"Check-ins refused by the server per round (total {total})")
  ax.set_xlabel("round")
  ax.set_ylabel("devices")
  ax.legend(frameon=False, loc="upper right")
  return _png(fig)


def _plots(result: audit_lib.AuditResult, metrics: Optional[RunMetrics]) -> dict[str, bytes]:
  plots: dict[str, Optional[bytes]] = {}
  if result.curve is not None:
    plots["epsilon"] = _plot_epsilon(result)
  plots["participations"] = _plot_participations(result)
  plots["gaps"] = _plot_gaps(result)
  plots["violators"] = _plot_violators(result)
  if metrics is not None:
    plots["training"] = _plot_training(metrics)
    plots["checkins"] = _plot_checkins(metrics)
  return {k: v for k, v in plots.items() if v is not None}


# ---------------------------------------------------------------------------------------------------
# The statement (BLT App. C structure).


def _sha256(path: Optional[str]) -> Optional[str]:
  if not path or not os.path.isfile(path):
    return None
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def _fmt(value: Optional[float], digits: int = 4) -> str:
  if value is None:
    return "not given"
  return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def privacy_statement(result: audit_lib.AuditResult) -> list[tuple[str, list[tuple[str, str]]]]:
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
          "correlated Gaussian noise.",
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
          "Zero-out: a neighboring run replaces all of one client's model updates with zeros.",
        ),
      ],
    ),
    (
      "3. Privacy accounting",
      [
        (
          "Type of accounting",
          f"rho-zCDP and {acct}. The matrix mechanism with noise multiplier "
          f"{a.noise_multiplier:g} and sensitivity {a.sensitivity:.6g} is one Gaussian mechanism "
          f"with noise multiplier {a.effective_noise_multiplier:.6g}.",
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


# ---------------------------------------------------------------------------------------------------
# Markdown and HTML.


def _status(result: audit_lib.AuditResult) -> tuple[str, str]:
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


def _facts(result: audit_lib.AuditResult, hashes: dict[str, Any]) -> list[tuple[str, str]]:
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
        f"{audit_lib._declared_in_words(d.min_sep, d.max_participations)}: {holds}",
      )  # pylint: disable=protected-access
    )
  if result.max_epsilon is not None:
    facts.append(("Budget (--max-epsilon)", f"{result.max_epsilon:g}"))
  facts.append(("Log sha256", hashes.get("log") or "not available"))
  if hashes.get("strategy"):
    facts.append(("Strategy sha256", hashes["strategy"]))
  return facts


def _claims_rows(result: audit_lib.AuditResult) -> list[list[str]]:
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
      _fmt(a.epsilon),
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
        _fmt(d.epsilon),
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
        "-" if acc is None else _fmt(acc.epsilon),
        "yes" if result.amplification_credited and result.verdict().guarantee else "NO",
      ]
    )
  return rows


_CLAIM_HEAD = ["claim", "b", "k", "sensitivity", "method", "rho-zCDP", "epsilon", "holds"]
_FIGURES = (
  (
    "epsilon",
    "Privacy over rounds",
    "ε after r released rounds for the realized participation of the first r rounds; dashed: the declared ε; dotted (when a budget is given, --max-epsilon): the budget.",
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
    "Test accuracy and loss of the model on the evaluated rounds (metrics.csv).",
  ),
  (
    "checkins",
    "Check-ins refused",
    "Devices whose check-in the server refused because their timer had not expired (metrics.csv).",
  ),
)


def _no_refusals(metrics: RunMetrics) -> str:
  rounds = metrics.get("round")
  count = 0 if rounds is None else int(rounds.shape[0])
  return f"No check-in was refused in the {count} rounds (metrics.csv: refused_checkins)."


def _markdown(
  result: audit_lib.AuditResult,
  plots: dict[str, bytes],
  hashes: dict[str, Any],
  max_violations: int,
  metrics: Optional[RunMetrics] = None,
) -> str:
  v = result.verdict()
  _, title = _status(result)
  lines = ["# Privacy audit report", "", f"**{title}.** {v.statement}", ""]
  lines += [f"- {k}: {val}" for k, val in _facts(result, hashes)] + [""]
  if result.notes or result.warnings:
    lines += ["## Notes and warnings", ""]
    lines += [f"- Note: {n}" for n in result.notes] + [f"- Warning: {w}" for w in result.warnings]
    lines.append("")
  lines += [
    "## Privacy claims",
    "",
    "| " + " | ".join(_CLAIM_HEAD) + " |",
    "|" + "---|" * len(_CLAIM_HEAD),
  ]
  lines += ["| " + " | ".join(row) + " |" for row in _claims_rows(result)]
  lines += [
    "",
    f"Noise multiplier {result.realized.noise_multiplier:g}; accountant: {result.realized.accountant}.",
    "",
  ]
  for key, heading, caption in _FIGURES:
    if key in plots:
      lines += [f"## {heading}", "", f"![{heading}]({PLOT_FILES[key]})", "", caption, ""]
  if metrics is not None and "checkins" not in plots:
    lines += [_no_refusals(metrics), ""]
  counts = result.violation_counts()
  lines += [
    "## Violations",
    "",
    ", ".join(f"{k}: {counts[k]} clients" for k in audit_lib.REASONS),
    "",
  ]
  if len(result.violations):
    lines += ["| client_id | reason | rounds |", "|---|---|---|"]
    for viol in result.violations[:max_violations]:
      shown = ", ".join(map(str, viol.rounds[:20])) + (", ..." if len(viol.rounds) > 20 else "")
      lines.append(f"| `{viol.client_id}` | {viol.reason} | {shown} |")
    if result.violations.total > max_violations:
      lines.append(f"\n{result.violations.total - max_violations} more in `audit.json`.")
    lines.append("")
  lines += ["## Privacy statement (structure of BLT App. C)", ""]
  for section, items in privacy_statement(result):
    lines += [f"### {section}", ""] + [f"- **{k}.** {val}" for k, val in items] + [""]
  lines += [f"Generated by fedmf {__version__}.", ""]
  return "\n".join(lines)


_CSS = """
:root { --ok: #1e7b34; --warn: #a15c00; --bad: #b42318; --line: #d0d7de; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
  max-width: 62rem; margin: 0 auto; padding: 1.5rem 1.25rem 3rem; }
h1 { font-size: 1.7rem; margin: 0 0 .25rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 .6rem; padding-bottom: .25rem; border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05rem; margin: 1.2rem 0 .4rem; }
header p { color: var(--muted); margin: 0; overflow-wrap: anywhere; }
.verdict { border-left: .4rem solid; border-radius: .3rem; padding: .8rem 1rem; margin: 1.2rem 0; }
.verdict h2 { border: 0; margin: 0 0 .3rem; padding: 0; font-size: 1.15rem; }
.verdict p { margin: 0; }
.ok { border-color: var(--ok); background: #eaf6ec; } .ok h2 { color: var(--ok); }
.warn { border-color: var(--warn); background: #fff4e0; } .warn h2 { color: var(--warn); }
.bad { border-color: var(--bad); background: #fdecea; } .bad h2 { color: var(--bad); }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1.2rem; margin: 0; }
dt { font-weight: 600; } dd { margin: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; font-size: .92rem; margin: .4rem 0; }
th, td { border: 1px solid var(--line); padding: .3rem .55rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.violating td { background: #fdecea; }
tr.fails td { color: var(--bad); font-weight: 600; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: .25rem; }
figcaption { color: var(--muted); font-size: .9rem; }
ul.notes li { margin: .25rem 0; }
.warning { color: var(--warn); }
code { font-size: .9em; background: #f6f8fa; padding: .05rem .25rem; border-radius: .2rem; }
footer { margin-top: 2.5rem; color: var(--muted); font-size: .85rem; }
"""


def _e(text: Any) -> str:
  return html.escape(str(text))


def _html(
  result: audit_lib.AuditResult,
  plots: dict[str, bytes],
  hashes: dict[str, Any],
  max_violations: int,
  metrics: Optional[RunMetrics] = None,
) -> str:
  v = result.verdict()
  css_class, title = _status(result)
  out = [
    "<!DOCTYPE html>",
    '<html lang="en">',
    "<head>",
    '<meta charset="utf-8">',
    '<meta name="viewport" content="width=device-width, initial-scale=1">',
    "<title>Privacy audit report</title>",
    f"<style>{_CSS}</style>",
    "</head>",
    "<body>",
    "<header>",
    "<h1>Privacy audit report</h1>",
    f"<p>{_e(result.log)} · {_e(result.strategy.get('description', result.strategy['mechanism']))}"
    f" · {result.rounds} rounds</p>",
    "</header>",
    "<main>",
    f'<section class="verdict {css_class}" aria-labelledby="statement">',
    f'<h2 id="statement">{_e(title)}</h2>',
    f"<p>{_e(v.statement)}</p>",
  ]
  if result.max_epsilon is not None or v.failures:
    strict = "passes" if v.passed else "fails: " + "; ".join(v.failures)
    out.append(
      f"<p><strong>Strict audit</strong> (<code>fedmf audit --strict</code>) {_e(strict)}.</p>"
    )
  out.append("</section>")
  out += ['<section aria-labelledby="summary">', '<h2 id="summary">Summary</h2>', "<dl>"]
  for k, val in _facts(result, hashes):
    out.append(f"<dt>{_e(k)}</dt><dd>{_e(val)}</dd>")
  out += ["</dl>", "</section>"]
  out += ['<section aria-labelledby="claims">', '<h2 id="claims">Privacy claims</h2>', "<table>"]
  out.append(
    "<thead><tr>"
    + "".join(f'<th scope="col">{_e(h)}</th>' for h in _CLAIM_HEAD)
    + "</tr></thead><tbody>"
  )
  for row in _claims_rows(result):
    cls = ' class="fails"' if row[-1] in ("no", "NO") else ""
    cells = [f'<th scope="row">{_e(row[0])}</th>'] + [
      f"<td>{_e(c)}</td>" if i in (4, 7) else f'<td class="num">{_e(c)}</td>'
      for i, c in enumerate(row[1:], start=1)
    ]
    out.append(f"<tr{cls}>" + "".join(cells) + "</tr>")
  out += [
    "</tbody></table>",
    f"<p>Accountant: {_e(result.realized.accountant)}. Sensitivity algorithm: "
    f"{_e(result.realized.sensitivity_algorithm)}.</p>",
    "</section>",
  ]
  if result.notes or result.warnings:
    out += [
      '<section aria-labelledby="notes">',
      '<h2 id="notes">Notes and warnings</h2>',
      '<ul class="notes">',
    ]
    out += [f"<li>{_e(n)}</li>" for n in result.notes]
    out += [f'<li class="warning">Warning: {_e(w)}</li>' for w in result.warnings]
    out += ["</ul>", "</section>"]
  groups = (
    ("privacy", "Privacy over rounds", ("epsilon",)),
    ("participation", "Participation", ("participations", "gaps", "violators")),
    ("training", "Training", ("training", "checkins")),
  )
  for anchor, heading, keys in groups:
    present = [k for k in keys if k in plots]
    if not present:
      continue
    out += [f'<section aria-labelledby="{anchor}">', f'<h2 id="{anchor}">{_e(heading)}</h2>']
    if anchor == "training" and "checkins" not in plots and metrics is not None:
      out.append(f"<p>{_e(_no_refusals(metrics))}</p>")
    for key in present:
      _, fig_title, caption = next(f for f in _FIGURES if f[0] == key)
      data = base64.b64encode(plots[key]).decode("ascii")
      out.append(
        f'<figure><img src="data:image/png;base64,{data}" alt="{_e(fig_title)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
      )
    out.append("</section>")
  counts = result.violation_counts()
  out += [
    '<section aria-labelledby="violations">',
    '<h2 id="violations">Violations</h2>',
    "<table>",
  ]
  out.append(
    "<thead><tr><th scope=\"col\">reason</th><th scope=\"col\">clients</th></tr></thead><tbody>"
  )
  for reason in audit_lib.REASONS:
    cls = ' class="violating"' if counts[reason] else ""
    out.append(f"<tr{cls}><td>{_e(reason)}</td><td class=\"num\">{counts[reason]}</td></tr>")
  out.append("</tbody></table>")
  if len(result.violations):
    out.append(
      "<table><thead><tr><th scope=\"col\">client_id</th><th scope=\"col\">reason</th><th scope=\"col\">rounds</th></tr></thead><tbody>"
    )
    for viol in result.violations[:max_violations]:
      shown = ", ".join(map(str, viol.rounds[:20])) + (", ..." if len(viol.rounds) > 20 else "")
      out.append(
        f'<tr class="violating"><td><code>{_e(viol.client_id)}</code></td><td>{_e(viol.reason)}</td>'
        f"<td>{_e(shown)}</td></tr>"
      )
    out.append("</tbody></table>")
    if result.violations.total > max_violations:
      out.append(
        f"<p>{result.violations.total - max_violations} more in <code>audit.json</code>.</p>"
      )
  else:
    out.append("<p>No client violates the declared schema, and no row is repeated.</p>")
  out.append("</section>")
  out += [
    '<section aria-labelledby="formal">',
    '<h2 id="formal">Privacy statement (structure of BLT App. C)</h2>',
  ]
  for section, items in privacy_statement(result):
    out += [f"<h3>{_e(section)}</h3>", "<dl>"]
    out += [f"<dt>{_e(k)}</dt><dd>{_e(val)}</dd>" for k, val in items]
    out.append("</dl>")
  out += [
    "</section>",
    "</main>",
    f"<footer>Generated by fedmf {_e(__version__)}: <code>audit.json</code> holds every number, "
    "<code>epsilon_curve.csv</code> the per-round curve.</footer>",
    "</body>",
    "</html>",
  ]
  return "\n".join(out) + "\n"


def _curve_csv(curve) -> str:
  min_sep = np.where(curve.min_sep > 0, curve.min_sep.astype(str), "")
  lines = ["rounds,min_sep,max_participations,sensitivity,sensitivity_method,rho,epsilon"]
  for i in range(curve.rounds.shape[0]):
    lines.append(
      f"{curve.rounds[i]},{min_sep[i]},{curve.max_participations[i]},{curve.sensitivity[i]:.12g},"
      f"{curve.sensitivity_method[i]},{curve.rho[i]:.12g},{curve.epsilon[i]:.12g}"
    )
  return "\n".join(lines) + "\n"


def write_report(
  result: audit_lib.AuditResult,
  out_dir: str | os.PathLike[str],
  *,
  strategy_path: Optional[str] = None,
  run_dir: Optional[str | os.PathLike[str]] = None,
  max_violations: int = 200,
  initial_accuracy: Optional[float] = None,
) -> dict[str, str]:
  """Writes report.html, report.md, audit.json, epsilon_curve.csv and the PNG plots into `out_dir`.

  `run_dir` (default `out_dir`) is searched for the run's metrics.csv, whose accuracy, loss and
  refused check-ins are plotted when present (with the accuracy before training: summary.json's,
  or `initial_accuracy`). Every file is written to a temporary name first and
  renamed once all are ready, so a failure leaves no half-written report.

  Returns:
    Mapping of artifact name ('html', 'markdown', 'json', 'curve', 'plot_<name>') to path.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  metrics = read_metrics(run_dir if run_dir is not None else out)
  if metrics is not None and initial_accuracy is not None:
    metrics = dataclasses.replace(metrics, initial_accuracy=float(initial_accuracy))
  plots = _plots(result, metrics)
  hashes = {"log": _sha256(result.log), "strategy": _sha256(strategy_path)}
  data = result.to_dict()
  data["sha256"] = hashes
  files: dict[str, tuple[str, bytes]] = {
    "html": ("report.html", _html(result, plots, hashes, max_violations, metrics).encode("utf-8")),
    "markdown": (
      "report.md",
      _markdown(result, plots, hashes, max_violations, metrics).encode("utf-8"),
    ),
    "json": ("audit.json", (jsonio.json_text(data) + "\n").encode("utf-8")),
  }
  if result.curve is not None:
    files["curve"] = ("epsilon_curve.csv", _curve_csv(result.curve).encode("utf-8"))
  for key, png in plots.items():
    files[f"plot_{key}"] = (PLOT_FILES[key], png)
  atomic_files.write_files({out / name: payload for name, payload in files.values()})
  # Plots of an earlier report that this one does not draw would describe another audit.
  for key, name in PLOT_FILES.items():
    if f"plot_{key}" not in files and (out / name).exists():
      (out / name).unlink()
  return {key: str(out / name) for key, (name, _) in files.items()}
