"""The human privacy report of an audit: markdown + HTML with PNG plots (matplotlib, Agg backend).

One concept: render an ``fedmf.privacy.audit.AuditResult`` as a reproducible report whose privacy statement
follows the structure of BLT App. C (itself after Ponomareva et al. 2023, Sec. 5.3): DP setting,
instantiating the DP definition (data accesses, final output, unit of privacy, adjacency), accounting
details (type, assumptions, formal statement). Notation: docs/architecture.md (b is the gap).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import pathlib
from typing import Any, Optional

from fedmf.privacy import audit as audit_lib


def _plots(result: audit_lib.AuditResult, out: pathlib.Path) -> dict[str, str]:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  s = result.stats
  files: dict[str, str] = {}

  fig, ax = plt.subplots(figsize=(6.4, 3.6))
  if s.gap_values.size:
    ax.bar(
      s.gap_values,
      s.gap_counts,
      width=max(1.0, 0.8 * ((int(s.gap_values.max()) - int(s.gap_values.min())) + 1) / 200),
      color="tab:blue",
    )
    ax.set_yscale("log")
    if result.declared is not None and result.declared.min_sep is not None:
      ax.axvline(
        result.declared.min_sep - 0.5,
        color="tab:red",
        ls="--",
        label=f"declared B = {result.declared.min_sep}",
      )
      ax.legend()
  else:
    ax.text(0.5, 0.5, "no client participated twice", ha="center", transform=ax.transAxes)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("gap between consecutive participations (rounds)")
  ax.set_ylabel("count")
  ax.set_title(f"Gap histogram (observed min-sep b = {s.observed_min_sep})")
  fig.tight_layout()
  fig.savefig(out / "gap_histogram.png", dpi=110)
  plt.close(fig)
  files["gaps"] = "gap_histogram.png"

  fig, ax = plt.subplots(figsize=(6.4, 3.6))
  ax.bar(s.participation_values, s.participation_counts, color="tab:green")
  ax.set_yscale("log")
  if result.declared is not None and result.declared.max_participations is not None:
    ax.axvline(
      result.declared.max_participations + 0.5,
      color="tab:red",
      ls="--",
      label=f"declared K = {result.declared.max_participations}",
    )
    ax.legend()
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_xlabel("participations per client")
  ax.set_ylabel("clients")
  ax.set_title(f"Participations per client (observed max k = {s.observed_max_participations})")
  fig.tight_layout()
  fig.savefig(out / "participations_per_client.png", dpi=110)
  plt.close(fig)
  files["participations"] = "participations_per_client.png"

  if result.curve is not None:
    c = result.curve
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(c.rounds, c.epsilon, color="tab:purple", label="realized (b_r, k_r) of first r rounds")
    ax.set_xlabel("rounds released r")
    ax.set_ylabel(f"epsilon at delta = {c.delta:g}")
    ax.set_title("Privacy vs rounds (analytic Gaussian curve)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "epsilon_vs_rounds.png", dpi=110)
    plt.close(fig)
    files["epsilon"] = "epsilon_vs_rounds.png"
  return files


def _sha256(path: Optional[str]) -> Optional[str]:
  if not path or not os.path.isfile(path):
    return None
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


def privacy_statement(result: audit_lib.AuditResult) -> list[tuple[str, list[tuple[str, str]]]]:
  """The statement as (section, [(item, text)]) in the structure of BLT App. C."""
  a = result.realized
  s = result.stats
  b_text = (
    f"at least {s.observed_min_sep} rounds between two consecutive participations of a client"
    if s.observed_min_sep is not None
    else "no client participated twice"
  )
  dup = (
    ""
    if result.claim_covers_all_clients
    else f" EXCEPT the clients with duplicate (round, client_id) rows "
    f"({result.violation_counts()['duplicate']} clients), whose update may have been summed "
    "twice in a round and is not covered"
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
  return [
    (
      "1. DP setting",
      [
        (
          "Setting",
          "Central DP: the server is trusted to implement the mechanism correctly, "
          "including clipping every client update to norm 1 (in units of the clip "
          "norm) and adding the correlated Gaussian noise.",
        ),
      ],
    ),
    (
      "2. Instantiating the DP definition",
      [
        (
          "Data accesses covered",
          "All clients in the participation log of this single "
          f"training run{dup}. Hyperparameter tuning and model selection "
          "are not covered.",
        ),
        (
          "Final mechanism output",
          f"The full sequence of {result.rounds} noisy aggregates; all "
          "intermediate models are post-processing and are protected.",
        ),
        (
          "Unit of privacy",
          "Device-level (one client_id is one device): adjacency is over a "
          "device's entire local dataset. For single-device users this is "
          "user-level DP.",
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
          f"rho-zCDP and {acct}. The matrix mechanism with noise "
          f"multiplier {a.noise_multiplier:g} and sensitivity "
          f"{a.sensitivity:.6g} is one Gaussian mechanism with noise "
          f"multiplier {a.effective_noise_multiplier:.6g}.",
        ),
        (
          "Sensitivity",
          f"{a.sensitivity:.6g} for strategy "
          f"{result.strategy.get('description', result.strategy['mechanism'])} "
          f"over n = {result.rounds} rounds, b = {s.observed_min_sep}, k = "
          f"{s.observed_max_participations} ({a.sensitivity_algorithm}); "
          f"{method_note}.",
        ),
        (
          "Accounting assumptions",
          f"The participation log is complete and accurate (every "
          f"participation is recorded); exactly {result.rounds} rounds "
          f"were released ({'given' if result.rounds_source == 'given' else 'inferred from the log: max round + 1'}); "
          f"participation as realized in the log: {b_text}, and at most "
          f"{s.observed_max_participations} participations per client "
          "(enforced on devices by a timer and checked post hoc here).",
        ),
        (
          "Formal DP statement",
          f"The released sequence satisfies rho-zCDP with rho = "
          f"{a.rho:.4g}, and ({a.epsilon:.4g}, {a.delta:g})-DP, for "
          "device-level zero-out adjacency.",
        ),
      ],
    ),
  ]


def _markdown(
  result: audit_lib.AuditResult, plots: dict[str, str], hashes: dict[str, Any], max_violations: int
) -> str:
  s = result.stats
  a = result.realized
  lines = [
    "# Privacy audit report",
    "",
    f"- Log: `{result.log}` (sha256 `{hashes.get('log')}`)",
    f"- Strategy: {result.strategy.get('description', result.strategy['mechanism'])}",
    f"- Rounds released n: {result.rounds} ({result.rounds_source})",
    f"- Clients: {s.clients}; participations: {s.participations}; log rows: {s.log_rows}",
    f"- Observed min-separation b: {s.observed_min_sep}; observed max participations k: "
    f"{s.observed_max_participations}",
    f"- Claim covers all clients: {'yes' if result.claim_covers_all_clients else '**no**'}",
    "",
    "## Privacy claims",
    "",
    "| claim | b | k | sensitivity | method | rho-zCDP | epsilon | delta |",
    "|---|---|---|---|---|---|---|---|",
    f"| realized (from the log) | {s.observed_min_sep} | {s.observed_max_participations} | "
    f"{a.sensitivity:.6g} | {a.sensitivity_method} | {a.rho:.4g} | {a.epsilon:.4g} | "
    f"{a.delta:g} |",
  ]
  if result.declared is not None:
    d = result.declared.accounting
    lines.append(
      f"| declared | {result.declared.min_sep} | {result.declared.max_participations} | "
      f"{d.sensitivity:.6g} | {d.sensitivity_method} | {d.rho:.4g} | {d.epsilon:.4g} "
      f"| {d.delta:g} |"
    )
  lines += ["", f"Noise multiplier {a.noise_multiplier:g}; accountant: {a.accountant}.", ""]
  if result.warnings:
    lines += ["## Warnings", ""] + [f"- {w}" for w in result.warnings] + [""]
  lines += ["## Privacy statement (structure of BLT App. C)", ""]
  for section, items in privacy_statement(result):
    lines += [f"### {section}", ""] + [f"- **{k}.** {v}" for k, v in items] + [""]
  counts = result.violation_counts()
  lines += ["## Violations", "", ", ".join(f"{k}: {v} clients" for k, v in counts.items()), ""]
  if result.violations:
    lines += ["| client_id | reason | rounds |", "|---|---|---|"]
    for v in result.violations[:max_violations]:
      shown = ", ".join(map(str, v.rounds[:20])) + (", ..." if len(v.rounds) > 20 else "")
      lines.append(f"| `{v.client_id}` | {v.reason} | {shown} |")
    if len(result.violations) > max_violations:
      lines.append(f"\n{len(result.violations) - max_violations} more in `audit.json`.")
    lines.append("")
  lines += ["## Plots", ""]
  for key, title in (
    ("gaps", "Gap histogram"),
    ("participations", "Participations per client"),
    ("epsilon", "Epsilon vs rounds"),
  ):
    if key in plots:
      lines += [f"![{title}]({plots[key]})", ""]
  if result.curve is not None:
    lines += [
      "The per-round curve uses the realized (b_r, k_r) of the first r rounds and the exact "
      "analytic Gaussian (epsilon, delta) curve (data: `epsilon_curve.csv`).",
      "",
    ]
  return "\n".join(lines)


def _html(
  md_title: str, result: audit_lib.AuditResult, plots: dict[str, str], markdown_text: str
) -> str:
  # A faithful, dependency-free rendering: the markdown as preformatted text plus the images.
  imgs = "".join(
    f'<figure><img src="{html.escape(f)}" alt="{html.escape(k)}"></figure>'
    for k, f in plots.items()
  )
  return (
    "<!doctype html><html><head><meta charset='utf-8'><title>"
    f"{html.escape(md_title)}</title><style>body{{font-family:sans-serif;max-width:60em;"
    "margin:2em auto}} pre{white-space:pre-wrap}</style></head><body>"
    f"<pre>{html.escape(markdown_text)}</pre>{imgs}</body></html>"
  )


def write_report(
  result: audit_lib.AuditResult,
  out_dir: str | os.PathLike[str],
  *,
  strategy_path: Optional[str] = None,
  max_violations: int = 200,
) -> dict[str, str]:
  """Writes report.md, report.html, audit.json, epsilon_curve.csv and PNG plots into ``out_dir``.

  Returns:
    Mapping of artifact name to path.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  plots = _plots(result, out)
  hashes = {"log": _sha256(result.log), "strategy": _sha256(strategy_path)}
  md = _markdown(result, plots, hashes, max_violations)
  (out / "report.md").write_text(md, encoding="utf-8")
  (out / "report.html").write_text(
    _html("Privacy audit report", result, plots, md), encoding="utf-8"
  )
  data = result.to_dict()
  data["sha256"] = hashes
  (out / "audit.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
  paths = {
    "markdown": str(out / "report.md"),
    "html": str(out / "report.html"),
    "json": str(out / "audit.json"),
  }
  if result.curve is not None:
    c = result.curve
    with open(out / "epsilon_curve.csv", "w", encoding="utf-8") as f:
      f.write("rounds,min_sep,max_participations,sensitivity,sensitivity_method,rho,epsilon\n")
      for i in range(c.rounds.shape[0]):
        f.write(
          f"{c.rounds[i]},{c.min_sep[i] if c.min_sep[i] > 0 else ''},"
          f"{c.max_participations[i]},{c.sensitivity[i]:.12g},{c.sensitivity_method[i]},"
          f"{c.rho[i]:.12g},{c.epsilon[i]:.12g}\n"
        )
    paths["curve"] = str(out / "epsilon_curve.csv")
  for k, f in plots.items():
    paths[f"plot_{k}"] = str(out / f)
  return paths
