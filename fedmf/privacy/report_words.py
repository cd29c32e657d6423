"""The report's plain-words paragraphs: what ε and δ mean, what the mechanism does, what
min-separation means for a device (issue 38 item 11).

One concept: say the audit's numbers to a reader who is not a privacy researcher, each paragraph
with the document that says more (`docs/...`, linked in the HTML report). The numbers come from
the audit; the sentences are fixed, so they are tested once (tests/test_report.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from fedmf import display


@dataclasses.dataclass(frozen=True)
class Paragraph:
  """A short explanation: its title, its text and the document that says more."""

  title: str
  text: str
  doc: str  # A path in the fedmf repository, e.g. 'docs/mechanisms.md'.


# What each mechanism does to the noise, in one or two sentences (docs/mechanisms.md).
_MECHANISMS = {
  "dpsgd": (
    "DP-SGD (DP-FedAvg): every round gets fresh, independent Gaussian noise. It is the baseline "
    "the correlated-noise mechanisms improve on."
  ),
  "blt": (
    "BLT (buffered linear Toeplitz, a matrix factorization): each round's noise is correlated "
    "with earlier rounds' through a few decaying buffers, so that much of it cancels in the "
    "model, which sums the rounds. The model ends up less noisy than with independent noise at "
    "the same ε."
  ),
  "bandmf": (
    "BandMF (banded matrix factorization): each round's noise is correlated with the noise of the "
    "previous few rounds (the bands), so that much of it cancels in the model, which sums the "
    "rounds. The model ends up less noisy than with independent noise at the same ε."
  ),
  "band-toeplitz": (
    "Banded Toeplitz matrix factorization: BandMF with the same correlation in every round, "
    "cheap to optimize for long runs. Much of the noise cancels in the model, which sums the "
    "rounds."
  ),
  "tree": (
    "TreeAgg (tree aggregation): the rounds are summed along a binary tree and each tree node "
    "gets its own noise, so the model's noise grows only with the logarithm of the rounds."
  ),
  "dense": (
    "A general matrix factorization (a dense strategy matrix C): the noise of each round is a "
    "fixed combination of independent Gaussian draws, chosen so that much of it cancels in the "
    "model."
  ),
}


def paragraphs(
  *,
  epsilon: Optional[float],
  delta: float,
  mechanism: str,
  description: str,
  min_sep: Optional[int],
  max_participations: Optional[int],
  no_noise: bool,
) -> tuple[Paragraph, ...]:
  """The paragraphs of a report whose realized guarantee is (`epsilon`, `delta`)-DP, for the
  mechanism named `mechanism` (`description`: e.g. 'blt (4 buffers)') under the participation
  (`min_sep`, `max_participations`) the log shows."""
  out = []
  if no_noise:
    out.append(
      Paragraph(
        "What ε and δ mean",
        "This run added no noise (noise multiplier 0), so no ε holds: the released models may "
        "reveal any device's data. It is a baseline, to compare accuracy with the private runs.",
        "docs/noise-multiplier.md",
      )
    )
  else:
    factor = _factor(epsilon)
    out.append(
      Paragraph(
        "What ε and δ mean",
        f"Differential privacy limits what the released models can reveal about any one device. "
        f"With ε = {display.epsilon(epsilon)} and δ = {delta:g}: whatever anyone concludes from "
        f"everything this run released, that conclusion is at most {factor} times more likely "
        "with a given device's data than without it, except with probability at most δ. A "
        "smaller ε is a stronger guarantee; δ is a small chance that the bound fails.",
        "docs/mechanisms.md",
      )
    )
    text = _MECHANISMS.get(mechanism, f"The mechanism {description} adds correlated noise.")
    out.append(
      Paragraph(
        f"The mechanism: {description}",
        f"{text} The noise multiplier sets how much noise; the accountant turns it, the "
        "participation below and the strategy's sensitivity into ε.",
        "docs/mechanisms.md",
      )
    )
  if min_sep is not None:
    k = (
      f" and took part at most {max_participations} times" if max_participations is not None else ""
    )
    sep = (
      f"In this log a device took part again at least {min_sep} rounds after its previous "
      f"round{k}. "
    )
  else:
    sep = "In this log no device took part twice. "
  out.append(
    Paragraph(
      "Min-separation, for a device",
      "A device may join a round only when its timer allows: at least b rounds after its "
      "previous participation (the min-separation b), which bounds how often, and how close "
      "together, one device's data enters what is released. "
      + sep
      + "The guarantee above is computed from what the log shows, not from what was declared: "
      "a device that came back too early counts as a violation and weakens ε.",
      "docs/participation-log.md",
    )
  )
  return tuple(out)


def _factor(epsilon: Optional[float]) -> str:
  """e^ε in words: '2,981' (ε = 8), 'about 3.0e+08', 'unbounded'."""
  if epsilon is None or not math.isfinite(epsilon):
    return "unboundedly many"
  value = math.exp(min(epsilon, 700.0))
  if value < 1000:
    return display.epsilon(value)  # Rounded up, as every bound fedmf shows.
  if value < 1e9:
    return f"{math.ceil(value):,}"
  return f"about {value:.1e}"


def doc_link(doc: str) -> Optional[str]:
  """A file:// link to `doc` in the fedmf checkout the report was made with, or None when the
  docs are not there (an installed package without them)."""
  from pathlib import Path  # pylint: disable=g-import-not-at-top

  import fedmf  # pylint: disable=g-import-not-at-top

  path = Path(fedmf.__file__).resolve().parents[1] / doc
  return path.as_uri() if path.is_file() else None


def for_result(result: Any) -> tuple[Paragraph, ...]:
  """`paragraphs` of an `fedmf.privacy.audit_result.AuditResult`."""
  s = result.stats
  return paragraphs(
    epsilon=result.realized.epsilon,
    delta=result.realized.delta,
    mechanism=result.strategy["mechanism"],
    description=result.strategy.get("description", result.strategy["mechanism"]),
    min_sep=s.observed_min_sep,
    max_participations=s.observed_max_participations,
    no_noise=result.no_noise,
  )
