"""Measured privacy of a run directory: its canaries.npz estimated against the run's claim.

One concept: what `fedmf audit RUN_DIR` and the run's own audit add when the run had canaries
(`fedmf.program.canaries` wrote canaries.npz). It reads the canaries' record, the strategy and the
noise multiplier actually added in training (plan.json's `training_noise_multiplier`: in the papers'
cheap simulation the noise of a larger cohort's mean, not the accounted σ), chooses the analytic
claim the estimates are compared with, and calls `fedmf.privacy.empirical.estimate`:

  worst-case     the pattern's own sensitivity ‖C 1_π‖ over the training σ (exact where the
                 strategy's sensitivity is; the tree: its best lower bound, said so)
  participation  the audit's realized claim (every participant of the log, the canaries included)
                 over the training σ

A run without canaries.npz adds nothing.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fedmf.errors import FedmfUserError
from fedmf.program import canaries as canaries_lib
from fedmf.program.run_dir import finite_number

ARRAYS = ("inserted", "coins", "membership", "projections", "final_projections", "final_norm")


class CanaryFileError(FedmfUserError):
  """A canaries.npz that cannot be read (one line naming the file and the problem)."""


def read_record(path: Path) -> dict[str, Any]:
  """canaries.npz as plain values, validated (shapes, finiteness)."""
  try:
    with np.load(path, allow_pickle=False) as f:
      data = {k: f[k] for k in f.files}
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise CanaryFileError(f"{path}: not a readable canaries file ({type(e).__name__})") from None
  missing = [k for k in ("format", "pattern", *ARRAYS) if k not in data]
  if missing:
    raise CanaryFileError(f"{path}: not a fedmf canaries file (no {', '.join(missing)})")
  if int(data["format"]) != canaries_lib.FILE_FORMAT:
    raise CanaryFileError(f"{path}: format {int(data['format'])} is not {canaries_lib.FILE_FORMAT}")
  m = data["inserted"].shape[0] if data["inserted"].ndim == 1 else -1
  n = data["projections"].shape[0] if data["projections"].ndim == 2 else -1
  for key, shape in (
    ("coins", (m,)),
    ("membership", (n, m)),
    ("projections", (n, m)),
    ("final_projections", (m,)),
  ):
    if m < 0 or n < 0 or data[key].shape != shape:
      raise CanaryFileError(f"{path}: '{key}' has shape {data[key].shape}, expected {shape}")
  if n < 1:
    raise CanaryFileError(f"{path}: no round was recorded")
  for key in ("projections", "final_projections", "final_norm"):
    if not np.all(np.isfinite(data[key])):
      raise CanaryFileError(f"{path}: '{key}' holds NaN or Inf")
  return data


def _plan(directory: Path) -> dict[str, Any]:
  try:
    return json.loads((directory / "plan.json").read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise CanaryFileError(f"{directory / 'plan.json'}: unreadable ({type(e).__name__})") from None


def measured_privacy(directory: str | Path, result) -> tuple[Optional[Any], list[str]]:
  """(EmpiricalPrivacy or None, warnings) of run directory `directory`, whose log `result` audits.

  None without canaries.npz. An estimate that cannot be made (too few canaries with a statistic,
  say) is a warning, not an error: the rest of the audit stands.
  """
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  from fedmf.privacy import empirical  # pylint: disable=g-import-not-at-top

  directory = Path(directory)
  path = directory / canaries_lib.CANARIES_FILE
  if not path.is_file():
    return None, []
  data = read_record(path)
  plan = _plan(directory)
  # finite_number: plan.json is the user's file (a 400-digit integer must not reach `float()`).
  sigma = finite_number(plan.get("training_noise_multiplier", plan.get("noise_multiplier")))
  accounted = finite_number(plan.get("noise_multiplier"))
  delta = finite_number(plan.get("delta", result.realized.delta))
  if delta is None:
    delta = result.realized.delta
  if sigma is None or not sigma > 0:
    return None, [f"{path}: the run added no noise: nothing for its canaries to measure"]
  strategy = strategies.load_strategy(directory / "strategy.json")
  pattern = str(data["pattern"])
  notes = []
  if pattern == "worst-case":
    value = float(data["worst_value"])
    rounds = ", ".join(map(str, data["worst_rounds"][:8].tolist()))
    claim = (
      f"the worst-case pattern ({rounds}) with sensitivity {value:.6g} "
      f"({str(data['worst_method'])}) over the training noise multiplier {sigma:.6g}"
    )
    if str(data["worst_method"]) != "exact":
      notes.append(
        f"the strategy's sensitivity {float(data['worst_sensitivity']):.6g} is an "
        f"{str(data['worst_sensitivity_method'])}: the canaries take the pattern of its best lower "
        f"bound found, {value:.6g}, and are compared with that pattern's epsilon"
      )
  else:
    value = result.realized.sensitivity
    claim = (
      f"the audit's realized claim (sensitivity {value:.6g}, {result.realized.sensitivity_method};"
      f" every participant of the log, the canaries included) over the training noise multiplier "
      f"{sigma:.6g}"
    )
  if accounted is not None and abs(accounted - sigma) > 1e-12 * max(sigma, 1.0):
    notes.append(
      f"cheap simulation: the run trained with noise multiplier {sigma:.6g}, the noise of a "
      f"larger cohort's mean, and claims the epsilon of {accounted:.6g}; the canaries measure "
      "the noise actually added, so they are compared with the epsilon of the training noise"
    )
  inserted, coins = data["inserted"].astype(bool), data["coins"].astype(bool)
  record = empirical.CanaryRecord(
    inserted=inserted,
    coins=coins,
    patterns=data["membership"].astype(bool),
    projections=data["projections"].astype(np.float64),
    final_projections=data["final_projections"].astype(np.float64),
    final_norm=float(data["final_norm"]),
    clients_variance=(
      data["client_sq_norms"].astype(np.float64) / float(data["directions"])
      if "client_sq_norms" in data and "directions" in data
      else None
    ),
  )
  try:
    estimate = empirical.estimate(
      record,
      strategy,
      float(sigma),
      float(delta),
      analytic_mu=value / float(sigma),
      claim=claim,
      pattern=pattern,
      pattern_description=str(data.get("pattern_description", pattern)),
      notes=tuple(notes),
    )
  except ValueError as e:
    return None, [f"measured privacy not estimated from {path}: {e}"]
  return estimate, []
