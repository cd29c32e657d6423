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
) -> empirical.CanaryRecord:
  """p = 1_π·[inserted] + σ·P w (+ N(0, client_sd²) per entry: the real clients' projections).

  `patterns` are the rounds the record says each canary joined; `inserted_patterns` (default the
  same) where inserted canaries really were added (a test double for a canary that joins rounds
  the claim says it cannot).
  """
  n, m = patterns.shape
  actual = patterns if inserted_patterns is None else inserted_patterns
  w = rng.standard_normal((noise_matrix.shape[1], m))
  p = actual * design.inserted[None, :] + sigma * (noise_matrix @ w)
  if client_sd:
    p = p + client_sd * rng.standard_normal((n, m))
  return empirical.CanaryRecord(design.inserted, design.coins, patterns, p)


def pattern_matrix(rounds, n: int, m: int) -> np.ndarray:
  """(n, m) bool: every canary in the same rounds."""
  out = np.zeros((n, m), bool)
  out[list(rounds), :] = True
  return out
