"""The audit report (issue 13): one self-contained semantic HTML page, plots that mark what matters
(linear axes on small counts, violating bars in red, the declared ε and the budget on the ε curve),
written all or nothing."""

import html.parser
import math
import os

import matplotlib
import numpy as np
import pytest

from fedmf import display
from fedmf.privacy import audit, participation_log, report, report_plots
from fedmf.privacy.report_model import RunMetrics

matplotlib.use("Agg")

BLT = {"mechanism": "blt", "buf_decay": [0.9, 0.5], "output_scale": [0.3, 0.2]}
RED = matplotlib.colors.to_rgba(report_plots._BAD)  # pylint: disable=protected-access


def _result(tmp_path, rows, **kwargs):
  path = tmp_path / "log.csv"
  participation_log.write_participation_log(path, [r for r, _ in rows], [c for _, c in rows])
  return audit.audit_log(path, BLT, 2.0, 1e-6, progress=False, **kwargs)


# a returns after 2 rounds (declared b = 3) and joins 4 times (declared k = 3).
ROWS = [(0, "a"), (2, "a"), (5, "a"), (8, "a"), (0, "b"), (4, "b"), (1, "c"), (9, "d")]


class _Page(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.tags: list[tuple[str, dict]] = []

  def handle_starttag(self, tag, attrs):
    self.tags.append((tag, dict(attrs)))


def test_the_html_is_semantic_and_self_contained(tmp_path):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3, max_participations=3, max_epsilon=5.0)
  report.write_report(res, tmp_path / "rep")
  text = (tmp_path / "rep" / "report.html").read_text()
  page = _Page()
  page.feed(text)
  tags = [t for t, _ in page.tags]
  for tag in ("main", "header", "section", "table", "thead", "th", "figure", "figcaption", "dl"):
    assert tag in tags, tag
  assert dict(page.tags)["html"]["lang"] == "en"
  images = [a["src"] for t, a in page.tags if t == "img"]
  assert len(images) == 4 and all(s.startswith("data:image/png;base64,") for s in images)
  assert all(a.get("alt") for t, a in page.tags if t == "img")
  assert "script" not in tags and "link" not in tags  # nothing to fetch, nothing to run
  assert "http://" not in text and "https://" not in text
  assert "}}" not in text and "<pre>" not in text
  # Highlighted: the counts of both reasons, and a's two entries (min-sep, max-participations).
  assert text.count('<tr class="violating">') == 4
  assert '<tr class="violating"><td><code>a</code></td><td>min-sep</td>' in text
  assert "None" not in text


def _capture(monkeypatch):
  figures = []
  monkeypatch.setattr(report_plots, "_png", lambda fig: figures.append(fig) or b"png")
  return figures


def test_small_counts_get_linear_axes_and_large_spans_log_axes():
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  for counts, scale in (([1, 61, 52], "linear"), ([3, 200_000], "log"), ([5000, 9000], "linear")):
    fig, ax = plt.subplots()
    report_plots._count_axis(ax, np.array(counts))  # pylint: disable=protected-access
    assert ax.get_yscale() == scale, counts
    plt.close(fig)


def test_violating_bars_are_red_and_the_declared_limits_drawn(tmp_path, monkeypatch):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3, max_participations=3)
  figures = _capture(monkeypatch)
  report_plots._plot_participations(res)  # pylint: disable=protected-access
  report_plots._plot_gaps(res)  # pylint: disable=protected-access
  participations, gaps = (f.axes[0] for f in figures)
  red = {
    int(round(p.get_x() + p.get_width() / 2))
    for p in participations.patches
    if p.get_facecolor() == RED
  }
  assert red == {4}  # a joined 4 times, above k = 3
  red = {
    int(round(p.get_x() + p.get_width() / 2)) for p in gaps.patches if p.get_facecolor() == RED
  }
  assert red == {2}  # a's gap of 2, below b = 3
  assert participations.get_yscale() == "linear" and gaps.get_yscale() == "linear"
  labels = [t.get_text() for f in figures for t in f.axes[0].get_legend().get_texts()]
  assert "declared k = 3" in labels and "declared b = 3" in labels


def test_the_epsilon_curve_shows_the_declared_epsilon_and_the_budget(tmp_path, monkeypatch):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3, max_participations=3, max_epsilon=7.5)
  figures = _capture(monkeypatch)
  report_plots._plot_epsilon(res)  # pylint: disable=protected-access
  ax = figures[0].axes[0]
  labels = [line.get_label() for line in ax.get_lines()]
  declared = res.declared.accounting.epsilon
  assert f"declared ε = {display.epsilon(declared)} (does NOT hold)" in labels  # violated
  assert "budget ε = 7.5" in labels
  budget = next(line for line in ax.get_lines() if line.get_label() == "budget ε = 7.5")
  assert budget.get_ydata()[0] == 7.5
  assert ax.get_yscale() == "linear" and ax.get_ylim()[1] >= max(7.5, declared)


def test_violating_clients_timeline_marks_the_close_pairs(tmp_path, monkeypatch):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3)
  figures = _capture(monkeypatch)
  report_plots._plot_violators(res)  # pylint: disable=protected-access
  ax = figures[0].axes[0]
  red = [line for line in ax.get_lines() if matplotlib.colors.to_rgba(line.get_color()) == RED]
  assert [list(line.get_xdata()) for line in red] == [[0, 2]]
  assert [t.get_text() for t in ax.get_yticklabels()] == ["a"]


def test_a_failed_write_leaves_no_report(tmp_path, monkeypatch):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3)
  written = []
  real = os.fsync

  def flaky(fd):  # The fourth file cannot be made durable: the disk is full.
    if len(written) == 3:
      raise OSError(28, "No space left on device")
    written.append(fd)
    return real(fd)

  monkeypatch.setattr(os, "fsync", flaky)
  with pytest.raises(OSError, match="No space left"):
    report.write_report(res, tmp_path / "rep")
  assert list((tmp_path / "rep").iterdir()) == []


def test_a_rewrite_drops_plots_the_new_report_does_not_draw(tmp_path):
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3)
  report.write_report(res, tmp_path / "rep")
  assert (tmp_path / "rep" / "violating_clients.png").exists()
  clean = _result(tmp_path, [(0, "a"), (5, "a")], rounds=10, min_sep=3)
  report.write_report(clean, tmp_path / "rep")
  assert not (tmp_path / "rep" / "violating_clients.png").exists()


def test_one_divergent_round_does_not_flatten_the_loss_plot(monkeypatch):
  # Issue 26 A.4: a round with loss 5720 among rounds near 3-5 is said, not scaled to.
  import numpy as np  # pylint: disable=import-outside-toplevel

  figures = []
  monkeypatch.setattr(report_plots, "_png", lambda fig: figures.append(fig) or b"png")
  n = 60
  loss = np.linspace(5.0, 3.0, n)
  loss[38] = 5720.65
  zeroed = np.zeros(n)
  zeroed[38] = 2
  metrics = report.RunMetrics(
    columns={"round": np.arange(n, dtype=float), "loss": loss, "zeroed": zeroed}
  )
  assert report_plots._plot_training(metrics) == b"png"  # pylint: disable=protected-access
  right = figures[0].axes[1]
  assert right.get_ylim()[1] < 10  # the bulk of the rounds fills the plot
  assert "1 above the plot, up to 5721" in right.get_title()
  labels = [h.get_label() for h in right.get_legend().legend_handles]
  assert any("zeroed updates (2 updates)" in label for label in labels)


def test_the_report_plots_the_metrics_it_is_given_and_reads_no_run_file(tmp_path):
  # Issue 21 §2: the privacy layer does not read the program's files; the caller passes them.
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3)
  out = tmp_path / "rep"
  out.mkdir()
  (out / "metrics.csv").write_text("round,loss,accuracy\n0,2.0,0.5\n1,1.5,0.6\n")
  report.write_report(res, out)
  assert not (out / "training.png").exists()
  columns = {
    "round": np.arange(2.0),
    "loss": np.array([2.0, 1.5]),
    "accuracy": np.array([0.5, 0.6]),
  }
  metrics = report.RunMetrics(columns, 0.1)
  report.write_report(res, out, metrics=metrics)
  assert (out / "training.png").exists()
  assert "No check-in was refused in the 2 rounds" in (out / "report.md").read_text()


def test_one_value_per_axis_gets_whole_number_ticks(tmp_path, monkeypatch):
  """Issue 38 item 9: every client joining once gave the participations bar ticks 0.6-1.5
  (MaxNLocator falls back to fractions with fewer than two integers in view)."""
  rows = [(r, f"c{r}") for r in range(10)] + [(0, "a"), (5, "a")]
  res = _result(tmp_path, rows, rounds=10, min_sep=3, max_participations=3)
  figures = _capture(monkeypatch)
  report_plots._plot_participations(res)  # pylint: disable=protected-access
  report_plots._plot_gaps(res)  # pylint: disable=protected-access
  for fig in figures:
    ax = fig.axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    yticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert all(float(t).is_integer() for t in yticks), yticks


def test_the_violators_timeline_spans_their_rounds_not_every_round(tmp_path, monkeypatch):
  """Issue 38 item 9: violations in the first rounds of a long audit used 5% of the axis."""
  rows = [(0, "a"), (2, "a"), (4, "b"), (5, "b")] + [(r, f"c{r}") for r in range(6, 200)]
  res = _result(tmp_path, rows, rounds=200, min_sep=3)
  figures = _capture(monkeypatch)
  report_plots._plot_violators(res)  # pylint: disable=protected-access
  low, high = figures[0].axes[0].get_xlim()
  assert low <= 0 and 5 <= high <= 10


def test_the_final_model_evaluated_after_a_stop_is_on_the_accuracy_plot(monkeypatch):
  """Issue 38 item 9: a train run stopped by its budget between evaluations had an empty
  accuracy panel although its summary had a final accuracy."""
  rounds = np.arange(13.0)
  columns = {"round": rounds, "loss": 7 - rounds / 10, "accuracy": np.full(13, np.nan)}
  figures = _capture(monkeypatch)
  report_plots._plot_training(RunMetrics(columns, 0.001, (13, 0.05)))  # pylint: disable=protected-access
  accuracy = figures[0].axes[0]
  final = [line for line in accuracy.get_lines() if line.get_marker() == "D"]
  assert [(list(f.get_xdata()), list(f.get_ydata())) for f in final] == [([13], [0.05])]
  assert accuracy.get_ylim()[1] > 0.05 and accuracy.get_xlim()[1] >= 13


def test_the_report_says_in_plain_words_what_its_numbers_mean(tmp_path):
  """Issue 38 item 11: what epsilon and delta mean, what the mechanism is, what min-separation
  means for a device, each linked to its doc."""
  res = _result(tmp_path, ROWS, rounds=10, min_sep=3, max_participations=3)
  report.write_report(res, tmp_path / "rep")
  text = (tmp_path / "rep" / "report.html").read_text()
  words = text[text.index('<h2 id="words">') : text.index("</section>", text.index('id="words"'))]
  eps = res.realized.epsilon
  assert f"With ε = {display.epsilon(eps)} and δ = 1e-06" in words
  factor = math.exp(eps)
  assert (
    f"at most {display.epsilon(factor) if factor < 1000 else f'{math.ceil(factor):,}'} times"
    in words
  )
  assert "The mechanism: blt (2 buffers)" in words and "BLT (buffered linear Toeplitz" in words
  assert "at least 2 rounds after its previous round and took part at most 4 times" in words
  for doc in ("docs/mechanisms.md", "docs/participation-log.md"):
    assert f"<code>{doc}</code>" in words
  md = (tmp_path / "rep" / "report.md").read_text()
  assert "## In plain words" in md and "What ε and δ mean" in md
