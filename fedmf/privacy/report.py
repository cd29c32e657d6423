"""The human privacy report of an audit: one self-contained HTML page, its markdown twin, PNG plots.

One concept: write the report of an `fedmf.privacy.audit.AuditResult` a privacy reviewer can read
offline, all files or none. The plots come from `fedmf.privacy.report_plots`, what the report says
from one document (`fedmf.privacy.report_model.build_document`), its HTML and markdown from
`fedmf.privacy.report_render`. A run's training numbers are passed in (`RunMetrics`, read by
`fedmf.program.run_dir.read_metrics`): this layer never reads the program's files.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Optional

import numpy as np

from fedmf import atomic_files
from fedmf import jsonio
from fedmf.privacy import audit_result
from fedmf.privacy import report_plots
from fedmf.privacy import report_render
from fedmf.privacy.report_model import PLOT_FILES, RunMetrics, build_document

__all__ = ["PLOT_FILES", "REPORT_FILES", "RunMetrics", "write_report"]

# Every file `write_report` may write (`fedmf audit --report` refuses a directory holding one of
# them unless --force).
REPORT_FILES = (
  "report.html",
  "report.md",
  "audit.json",
  "epsilon_curve.csv",
  *PLOT_FILES.values(),
)


def _sha256(path: Optional[str]) -> Optional[str]:
  if not path or not os.path.isfile(path):
    return None
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()


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
  result: audit_result.AuditResult,
  out_dir: str | os.PathLike[str],
  *,
  strategy_path: Optional[str] = None,
  metrics: Optional[RunMetrics] = None,
  max_violations: int = 200,
) -> dict[str, str]:
  """Writes report.html, report.md, audit.json, epsilon_curve.csv and the PNG plots into `out_dir`.

  `metrics`: the run's per-round numbers, whose accuracy (with the accuracy before training), loss
  and refused check-ins are plotted when given. Every file is written to a temporary name first and
  renamed once all are ready, so a failure leaves no half-written report.

  Returns:
    Mapping of artifact name ('html', 'markdown', 'json', 'curve', 'plot_<name>') to path.
  """
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  plots = report_plots.draw(result, metrics)
  hashes = {"log": _sha256(result.log), "strategy": _sha256(strategy_path)}
  doc = build_document(result, plots, hashes, max_violations, metrics)
  data = result.to_dict()
  data["sha256"] = hashes
  files: dict[str, tuple[str, bytes]] = {
    "html": ("report.html", report_render.html(doc).encode("utf-8")),
    "markdown": ("report.md", report_render.markdown(doc).encode("utf-8")),
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
