"""Simulated canary projections (numpy only), outside the product's code paths: a correct
mechanism and deliberately broken ones, for the estimators' tests (tests/privacy/test_empirical*)."""

from __future__ import annotations

import numpy as np

from fedmf.privacy import canary_design
from fedmf.privacy import empirical


def simulate_record(
  noise_matrix: np.ndarray,
  sigma: float,
  patterns: np.ndarray,
  design: canary_design.CanaryDesign,
  rng: np.random.Generator,
  *,
  inserted_patterns: np.ndarray | None = None,
  client_sd: float = 0.0,
  final_model: bool = False,
) -> empirical.CanaryRecord:
  """p = 1_π·[inserted] + σ·P w (+ N(0, client_sd²) per entry: the real clients' projections).

  `patterns` are the rounds the record says each canary joined; `inserted_patterns` (default the
  same) where inserted canaries really were added (a test double for a canary that joins rounds
  the claim says it cannot).

  `final_model`: also the final model's change on every direction, for the `final_model` threat
  model, as a server that adds each released mean to the model (plain SGD, learning rate 1, no
  momentum) makes it: Δ's projection on u_c is Σ_t p[t, c]. Its norm, the cosine's denominator,
  is common to every canary, so neither estimator depends on it; the record takes Δ's norm within
  the canaries' directions (a lower bound of the whole model's).
  """
  n, m = patterns.shape
  actual = patterns if inserted_patterns is None else inserted_patterns
  w = rng.standard_normal((noise_matrix.shape[1], m))
  p = actual * design.inserted[None, :] + sigma * (noise_matrix @ w)
  if client_sd:
    p = p + client_sd * rng.standard_normal((n, m))
  if not final_model:
    return empirical.CanaryRecord(design.inserted, design.coins, patterns, p)
  final = p.sum(axis=0)
  return empirical.CanaryRecord(
    design.inserted, design.coins, patterns, p, final, float(np.linalg.norm(final))
  )


def pattern_matrix(rounds, n: int, m: int) -> np.ndarray:
  """(n, m) bool: every canary in the same rounds."""
  out = np.zeros((n, m), bool)
  out[list(rounds), :] = True
  return out
