"""The report's plots: PNG bytes of matplotlib figures that mark what matters.

One concept: draw an audit (and a run's metrics) as figures a privacy reviewer reads at a glance:
linear axes unless the counts span more than three orders of magnitude, violating bars in red, the
declared ε and the budget on the ε curve. Notation: docs/architecture.md (b is the gap).
"""

from __future__ import annotations

import io
import math
from typing import Any, Optional

import numpy as np

from fedmf import display
from fedmf.privacy import audit_result
from fedmf.privacy.report_model import RunMetrics

# Colors (matplotlib's tab palette) of the plots.
_OK, _BAD, _MAIN, _DECLARED, _BUDGET = "#2ca02c", "#d62728", "#1f77b4", "#ff7f0e", "#9467bd"
_MAX_CURVE_POINTS = 4000  # Points drawn of a long ε curve (the CSV has them all).
_MAX_TIMELINE_CLIENTS = 30
_WIDTH = 7.6  # inches; at 120 dpi a plot is 912 pixels wide, the width of the page's text.


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


def _count_axis(ax, counts: np.ndarray, values: Optional[np.ndarray] = None) -> None:
  """Linear counts, unless they span more than three orders of magnitude (then log); whole
  numbers on the x axis (`values`, when few, are the ticks themselves: MaxNLocator falls back to
  fractional ticks when fewer than two integers are in view, e.g. one bar at 1)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  positive = counts[counts > 0]
  if positive.size and positive.max() / positive.min() > 1000:
    ax.set_yscale("log")
  else:
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
  if values is not None and 0 < values.size <= 12:
    ax.set_xticks([int(v) for v in values])
    ax.set_xlim(float(values.min()) - 1, float(values.max()) + 1)
  else:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


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


def _plot_participations(result: audit_result.AuditResult) -> bytes:
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
  _count_axis(ax, counts, values)
  if k_declared is not None:  # The declared k in view, beside the bars.
    low, high = ax.get_xlim()
    ax.set_xlim(min(low, k_declared - 0.5), max(high, k_declared + 1.5))
  ax.margins(y=0.3)
  ax.legend(handles=handles, frameon=False, loc="upper right", fontsize=8)
  ax.set_xlabel("participations per client")
  ax.set_ylabel("clients")
  ax.set_title(f"Participations per client (realized k = {s.observed_max_participations})")
  return _png(fig)


def _plot_gaps(result: audit_result.AuditResult) -> bytes:
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
    _count_axis(ax, counts, values)
    if b_declared is not None:  # The declared b in view, beside the bars.
      low, high = ax.get_xlim()
      ax.set_xlim(min(low, b_declared - 1.5), max(high, b_declared + 0.5))
    ax.margins(y=0.3)
    ax.legend(handles=handles, frameon=False, loc="upper right", fontsize=8)
  else:
    ax.text(0.5, 0.5, "no client participated twice", ha="center", transform=ax.transAxes)
    ax.set_yticks([])
  ax.set_xlabel("gap between consecutive participations of a client (rounds)")
  ax.set_ylabel("count")
  realized = s.observed_min_sep if s.observed_min_sep is not None else "none"
  ax.set_title(f"Min-separation: gaps between participations (realized b = {realized})")
  return _png(fig)


def _plot_epsilon(result: audit_result.AuditResult) -> bytes:
  plt = _pyplot()
  c = result.curve
  fig, ax = plt.subplots(figsize=(_WIDTH, 3.6))
  step = max(1, -(-c.rounds.shape[0] // _MAX_CURVE_POINTS))
  idx = np.unique(np.append(np.arange(0, c.rounds.shape[0], step), c.rounds.shape[0] - 1))
  ax.plot(c.rounds[idx], c.epsilon[idx], color=_MAIN, lw=2, label="realized: first r rounds")
  final = float(c.epsilon[-1])
  ax.plot([c.rounds[-1]], [final], "o", color=_MAIN)
  ax.annotate(
    f"ε = {display.epsilon(final)}",
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
      label=f"declared ε = {display.epsilon(eps_d)}" + ("" if holds else " (does NOT hold)"),
    )
    top = max(top, eps_d)
  if result.max_epsilon is not None:
    ax.axhline(
      result.max_epsilon, color=_BUDGET, ls=":", lw=2, label=f"budget ε = {result.max_epsilon:g}"
    )
    top = max(top, result.max_epsilon)
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  ax.set_ylim(0, top * 1.15 if top > 0 else 1)
  ax.set_xlim(0, c.rounds[-1] * 1.02)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
  ax.set_xlabel("rounds released r")
  ax.set_ylabel(f"ε at δ = {c.delta:g}")
  ax.set_title("Privacy over rounds (realized participation of the first r rounds)")
  ax.grid(alpha=0.3)
  ax.legend(frameon=False, loc="lower right")
  return _png(fig)


def _plot_violators(result: audit_result.AuditResult) -> Optional[bytes]:
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
  # The span of the plotted participations, not of every round audited: violations early in a
  # long run would otherwise crowd the left edge.
  plotted = [r for _, entry in rows for r in entry["rounds"]]
  pad = 0.03 * max(max(plotted) - min(plotted), 10) + 0.5
  ax.set_xlim(max(-0.5, min(plotted) - pad), max(plotted) + pad)
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
  xs, ys = np.zeros(0), np.zeros(0)
  if accuracy is not None:
    ok = np.isfinite(accuracy)
    xs, ys = x[ok], accuracy[ok]
  if metrics.initial_accuracy is not None:  # Before the first round.
    xs, ys = np.append(0, xs), np.append(metrics.initial_accuracy, ys)
  top = float(np.nanmax(ys)) if ys.size else 0.0
  if ys.size:
    left.plot(xs, ys, "o-", color=_MAIN, ms=4, label="evaluation rounds")
  final = metrics.final_accuracy
  if final is not None:  # The final model, evaluated after the run stopped between evaluations.
    if ys.size:
      left.plot([xs[-1], final[0]], [ys[-1], final[1]], ":", color=_MAIN)
    left.plot([final[0]], [final[1]], "D", color=_DECLARED, ms=6, label="final model")
    top = max(top, final[1])
  if ys.size or final is not None:
    left.set_ylim(0, max(top * 1.3, 1e-3))
    left.set_xlim(0, max(float(x.max()), final[0] if final else 0, 1.0) * 1.04)
    left.legend(frameon=False, loc="lower right", fontsize=8)
  else:
    left.text(0.5, 0.5, "not evaluated", ha="center", transform=left.transAxes)
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
  right.legend(frameon=False, loc="best", fontsize=8)
  return _png(fig)


def _plot_clip(metrics: RunMetrics) -> Optional[bytes]:
  """ζ_t per round (adaptive clipping) and the fraction of clients within it: the noisy one that
  moved ζ, and the exact one (clients neither clipped nor zeroed; metrics.csv)."""
  rounds, clip = metrics.get("round"), metrics.get("clip_norm")
  if rounds is None or clip is None:
    return None  # A fixed clip: nothing moves.
  plt = _pyplot()
  fig, (left, right) = plt.subplots(1, 2, figsize=(_WIDTH, 3.2))
  ok = np.isfinite(clip)
  left.plot(rounds[ok], clip[ok], color=_MAIN, lw=1.5)
  if np.nanmin(clip) > 0 and np.nanmax(clip) / np.nanmin(clip) > 20:
    left.set_yscale("log")
  left.set_title("Clip norm ζ_t (adaptive)")
  left.set_xlabel("round")
  left.grid(alpha=0.3)
  noisy = metrics.get("unclipped_fraction")
  if noisy is not None:
    ok = np.isfinite(noisy)
    right.plot(rounds[ok], noisy[ok], ".", color=_DECLARED, ms=4, label="noisy (released)")
  clients, clipped, zeroed = (metrics.get(k) for k in ("clients", "clipped", "zeroed"))
  if clients is not None and clipped is not None:
    with np.errstate(invalid="ignore", divide="ignore"):
      exact = (clients - clipped - np.nan_to_num(zeroed if zeroed is not None else 0)) / clients
    ok = np.isfinite(exact)
    right.plot(rounds[ok], exact[ok], color="#7f7f7f", lw=1, label="exact")
  right.set_ylim(-0.02, 1.02)
  right.set_title("Fraction of clients within ζ_t")
  right.set_xlabel("round")
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

  ax.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
  highest = float(np.nanmax(np.nan_to_num(refused)))
  ax.set_ylim(0, max(highest, 1.0) * 1.4)  # Room for the legend above the bars.
  total = int(np.nansum(refused))
  ax.set_title(f"Check-ins refused by the server per round (total {total})")
  ax.set_xlabel("round")
  ax.set_ylabel("devices")
  ax.legend(frameon=False, loc="upper right")
  return _png(fig)


def _plot_canaries(result: audit_result.AuditResult) -> Optional[bytes]:
  """Measured privacy: per threat model, the inserted and held-out canaries' statistics as
  histograms with their fitted Gaussians (Andrew et al.'s fit), and the claimed mean."""
  measured = result.empirical
  if measured is None:
    return None
  plt = _pyplot()
  names = [name for name in ("all_releases", "final_model") if name in measured.estimates]
  fig, axes = plt.subplots(1, len(names), figsize=(_WIDTH, 3.4), squeeze=False)
  inserted = measured.inserted_mask
  for ax, name in zip(axes[0], names):
    e = measured.estimates[name]
    scores = measured.scores[name]
    ok = np.isfinite(scores)
    held, ins = scores[ok & ~inserted], scores[ok & inserted]
    lo = min(held.min(), ins.min())
    hi = max(held.max(), ins.max())
    fit = e.fit
    # Bins of about a fifth of the null's sd, capped in number: both groups on one scale.
    width = max(fit.held_out_sd / 5, (hi - lo) / 120)
    bins = np.arange(lo, hi + width, width)
    ax.hist(held, bins=bins, color="#7f7f7f", alpha=0.6, label=f"held out ({held.size})")
    ax.hist(ins, bins=bins, color=_MAIN, alpha=0.6, label=f"inserted ({ins.size})")
    grid = np.linspace(lo - width, hi + width, 400)
    for mean, sd, count, color in (
      (fit.held_out_mean, fit.held_out_sd, held.size, "#404040"),
      (fit.inserted_mean, fit.inserted_sd, ins.size, _MAIN),
    ):
      pdf = np.exp(-0.5 * ((grid - mean) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
      ax.plot(grid, pdf * count * width, color=color, lw=1.5)
    if e.expected_mu is not None:
      claimed = e.expected_mu  # the statistic is in units of the claimed noise: N(μ, 1)
      ax.axvline(claimed, color=_DECLARED, ls="--", label=f"claimed mean (μ = {e.expected_mu:.3g})")
    ax.set_title(
      f"{name.replace('_', ' ')}\nμ̂ = {fit.mu:.3g}, ε̂ = {fit.epsilon:.3g} (analytic "
      f"{e.analytic_epsilon:.3g})",
      fontsize=9,
    )
    ax.set_xlabel(
      "decorrelated statistic" if name == "all_releases" else "cosine with the final change"
    )
    ax.set_ylabel("canaries")
    ax.legend(frameon=False, fontsize=7, loc="upper center")
    ax.margins(y=0.25)
  return _png(fig)


def draw(result: audit_result.AuditResult, metrics: Optional[RunMetrics]) -> dict[str, bytes]:
  """The PNG of every plot the audit (and the run's metrics, when given) calls for, by key."""
  plots: dict[str, Optional[bytes]] = {}
  if result.curve is not None:
    plots["epsilon"] = _plot_epsilon(result)
  plots["participations"] = _plot_participations(result)
  plots["gaps"] = _plot_gaps(result)
  plots["violators"] = _plot_violators(result)
  plots["canaries"] = _plot_canaries(result)
  if metrics is not None:
    plots["training"] = _plot_training(metrics)
    plots["clip"] = _plot_clip(metrics)
    plots["checkins"] = _plot_checkins(metrics)
  return {k: v for k, v in plots.items() if v is not None}
