"""`fedmf public-features` as a program: the run-directory contract of `fedmf simulate`.

One concept: a public-features run from a validated config to its files in OUT, written so that
OUT holds one whole finished run or what it held before:

1. before anything is written: OUT is checked (`outputs.check_output_dir`: a finished run is not
   replaced without `--force`, a directory of other files never) and the run's cost is estimated
   and refused above `--max-memory` / `--max-seconds` (`fedmf.public_features.cost`);
2. the run is written into a staging directory beside OUT (`.OUT.staging-RUNID`, with run.json
   saying it is running), by `fedmf.public_features.driver`;
3. run.json lists every file with its sha256, and the staging directory replaces OUT in one step
   (`run_manifest.replace_dir`). A refusal, a crash or an interrupt removes the staging directory:
   nothing is left, not even an empty OUT.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Callable

from fedmf.program import outputs
from fedmf.program import run_manifest
from fedmf.public_features import cost
from fedmf.public_features.config import PublicFeaturesConfig

logger = logging.getLogger("fedmf.public_features")

RUN_FILES = ("summary.json", "metrics.csv", "config.json", "tuning.csv")


def check(cfg: PublicFeaturesConfig, out: str | Path, force: bool) -> None:
  """Every refusal that can come before work: OUT, and the estimated cost."""
  outputs.check_output_dir(Path(out), force, RUN_FILES)
  cost.check(cfg)


def run(
  cfg: PublicFeaturesConfig,
  out: str | Path,
  *,
  force: bool = False,
  progress: Callable[[str], None] | None = None,
) -> dict:
  """Runs `cfg` into OUT (module docstring); returns the summary with the run id."""
  from fedmf.public_features import driver  # pylint: disable=g-import-not-at-top

  out = Path(out)
  check(cfg, out, force)
  real_out = Path(os.path.realpath(out))
  for leftover in run_manifest.leftover_staging(real_out):
    logger.warning("%s", run_manifest.leftover_message(leftover))
  run_id = run_manifest.new_run_id()
  stage = run_manifest.staging_path(real_out, run_id)
  created = _missing_parents(stage)
  stage.mkdir(parents=True)
  try:
    manifest = run_manifest.start(stage, "public-features", run_id, target=str(out))
    summary = driver.run(cfg, stage, progress)
    run_manifest.finish(stage, manifest)
    run_manifest.replace_dir(stage, real_out)
  except BaseException:
    shutil.rmtree(stage, ignore_errors=True)
    for directory in created:  # the parents this run made for OUT, innermost first
      try:
        directory.rmdir()
      except OSError:
        break
    raise
  return {"run_id": run_id, **summary}


def _missing_parents(path: Path) -> list[Path]:
  """The ancestors of `path` that do not exist yet, innermost first."""
  missing = []
  for parent in path.parents:
    if parent.exists():
      break
    missing.append(parent)
  return missing
