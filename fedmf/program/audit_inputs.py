"""What `fedmf audit SOURCE` audits: the log and settings of a run directory or a log file.

A run directory gives its own strategy, σ, δ, released rounds, declared schema and sampling
(`fedmf.program.run_dir`); a value given explicitly replaces the run's, and one that differs from
it becomes a warning of the audit. A log file needs the strategy, σ and δ given.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from pathlib import Path
from typing import Any, Optional

from fedmf.errors import FedmfUserError


@dataclasses.dataclass(frozen=True)
class AuditInputs:
  log: str  # the participation log
  settings: dict[str, Any]  # keyword arguments of `fedmf.privacy.audit.audit_log`
  strategy_path: str  # the strategy file (the report names it)
  notes: tuple[str, ...]  # where the settings came from
  warnings: tuple[str, ...]  # given values that differ from the run's


def _same_number(a: Optional[float], b: Optional[float]) -> bool:
  return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def resolve(
  source: str | os.PathLike,
  *,
  strategy: Optional[str] = None,
  noise_multiplier: Optional[float] = None,
  delta: Optional[float] = None,
  rounds: Optional[int] = None,
  min_sep: Optional[int] = None,
  max_participations: Optional[int] = None,
  count_noise_multiplier: Optional[float] = None,
) -> AuditInputs:
  """What to audit: SOURCE's log and settings, the given values replacing the run's (said).

  The given values are the `fedmf audit` flags of the same names (None: not given).
  """
  # The audit_log settings the flags give (a log file's settings are these, as given).
  given = dict(
    strategy=strategy,
    noise_multiplier=noise_multiplier,
    delta=delta,
    rounds=rounds,
    min_sep=min_sep,
    max_participations=max_participations,
    count_noise_multiplier=count_noise_multiplier,
  )
  flags = types.SimpleNamespace(source=os.fspath(source), **given)
  from fedmf.mf import strategies  # pylint: disable=g-import-not-at-top
  from fedmf.program import run_dir  # pylint: disable=g-import-not-at-top

  source = Path(flags.source)
  if not source.exists():
    raise FedmfUserError(f"{flags.source}: no such participation log or run directory")
  if not source.is_dir():
    missing = [
      flag
      for flag, value in (
        ("--strategy", flags.strategy),
        ("--noise-multiplier", flags.noise_multiplier),
        ("--delta", flags.delta),
      )
      if value is None
    ]
    if missing:
      hint = (
        f", or audit the run directory: fedmf audit {source.parent}"
        if (source.parent / run_dir.PLAN_FILE).is_file()
        else ""
      )
      raise FedmfUserError(
        f"auditing a log file needs {', '.join(missing)}{hint} (see fedmf audit --help)"
      )
    return AuditInputs(str(source), given, flags.strategy, (), ())

  run = run_dir.read_run(source)
  warnings: list[str] = []

  def pick(flag: str, given, from_run, key: str, same) -> Any:
    """The flag's value if given (reporting a difference from the run's), else the run's."""
    if given is None:
      if from_run is None:
        raise FedmfUserError(
          f"{source} does not say its {key.replace('_', ' ')} ({run_dir.PLAN_FILE} is missing "
          f"or has no '{key}'): pass {flag}"
        )
      return from_run
    if from_run is not None and not same(given, from_run):
      warnings.append(
        f"{flag} {given:g} differs from the run's {from_run:g} ({run.sources.get(key, source)}): "
        f"the audit uses {given:g}"
      )
    return given

  sigma = pick(
    "--noise-multiplier",
    flags.noise_multiplier,
    run.noise_multiplier,
    "noise_multiplier",
    _same_number,
  )
  delta = pick("--delta", flags.delta, run.delta, "delta", _same_number)
  count_noise = flags.count_noise_multiplier
  if count_noise is None:
    count_noise = run.count_noise_multiplier  # (None: the run clipped at a fixed norm)
  elif run.count_noise_multiplier is not None and not _same_number(
    count_noise, run.count_noise_multiplier
  ):
    warnings.append(
      f"--count-noise-multiplier {count_noise:g} differs from the run's "
      f"{run.count_noise_multiplier:g} ({run.sources.get('count_noise_multiplier', source)}): "
      f"the audit uses {count_noise:g}"
    )
  rounds = flags.rounds if flags.rounds is not None else run.rounds
  if flags.rounds is not None and run.rounds is not None and flags.rounds != run.rounds:
    warnings.append(
      f"--rounds {flags.rounds} differs from the run's {run.rounds} ({run.rounds_source}): "
      f"the audit uses {flags.rounds}"
    )
  min_sep, max_participations = run.min_sep, run.max_participations
  for flag, given, from_run in (
    ("--min-sep", flags.min_sep, run.min_sep),
    ("--max-participations", flags.max_participations, run.max_participations),
  ):
    if given is not None and from_run is not None and given != from_run:
      warnings.append(
        f"{flag} {given} differs from the run's declared {from_run} ({run_dir.PLAN_FILE}): the "
        f"audit uses {given}"
      )
  if flags.min_sep is not None or flags.max_participations is not None:
    # A declaration given on the command line replaces the run's as a whole.
    min_sep, max_participations = flags.min_sep, flags.max_participations
  if flags.strategy is not None:
    strategy_path = flags.strategy
    if run.strategy is not None:
      given, own = strategies.load_strategy(flags.strategy), strategies.load_strategy(run.strategy)
      if given.to_dict() != own.to_dict():
        warnings.append(
          f"--strategy {flags.strategy} ({given.describe()}) differs from the run's "
          f"{run.strategy} ({own.describe()}): the audit uses {flags.strategy}"
        )
  elif run.strategy is not None:
    strategy_path = str(run.strategy)
  else:
    raise FedmfUserError(
      f"{source} has no {run_dir.STRATEGY_FILE} (runs from before it was saved): pass --strategy"
    )
  notes = (f"settings read from the run directory {source}",) + run.notes
  return AuditInputs(
    str(run.log),
    dict(
      strategy=strategy_path,
      noise_multiplier=sigma,
      delta=delta,
      rounds=rounds,
      min_sep=min_sep,
      max_participations=max_participations,
      # A declared cyclic Poisson sampling: checked against the log, amplified ε if it complies.
      sampling=run.sampling,
      # Adaptive clipping's count releases, composed into every claim.
      count_noise_multiplier=count_noise,
    ),
    strategy_path,
    notes,
    tuple(warnings),
  )
