#!/usr/bin/env python3
"""Public features Theorem 3 at a small scale: excess empirical risk of SSP (public features) vs
noisy gradient descent (all features private) for linear regression, as m and p vary.

Linear encoder v_j = θᵀ x_j (θ ∈ R^{p×d}, ‖x_j‖ = Γ_x = 1), fixed unit user vectors u_i (Γ_u = 1),
labels clipped to Γ_y; one example per user (so user level = example level), at (ε, δ) = (2, 1e-5).
Loss L(θ) = ½ Σ_i (x_{j_i}ᵀ θ u_i − y_i)² + λ/2 ‖θ‖²; excess = (L(θ̂) − L(θ*)) / D.
- SSP2 (Alg. 3): A_j, b_j released once with noise σ Γ_u², σ Γ_u Γ_y, σ = √2/μ; θ̂ minimizes the
  noisy quadratic (Â_j projected on the PSD cone) with L-BFGS. Theorem 3: excess ~ √(m d).
- Noisy GD (Bassily et al. 2014, as in the paper's comparison): T full-batch steps, per-example
  gradients clipped to Γ = Γ_x Γ_u Γ_y, noise σ Γ N^{p×d}, σ = √T/μ. Excess ~ √(p d).
Writes OUT/theory.csv and OUT/theory.png.

  .venv/bin/python benchmarks/public_features_theory.py --out out/pf-theory
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
from scipy import optimize

from fedmf.privacy import gaussian_curve
from fedmf.public_features import statistics


def problem(m, p, d, num_examples, rng):
  x = rng.normal(size=(m, p))
  x /= np.linalg.norm(x, axis=1, keepdims=True)
  theta = rng.normal(size=(p, d)) * np.sqrt(m / p)  # item outputs of order 1 whatever p
  items = rng.integers(0, m, size=num_examples)
  u = rng.normal(size=(num_examples, d))
  u /= np.linalg.norm(u, axis=1, keepdims=True)
  y = np.einsum("nd,nd->n", x[items] @ theta, u) + 0.1 * rng.normal(size=num_examples)
  return x, items, u, np.clip(y, -1.0, 1.0)


def loss(theta, x, items, u, y, reg):
  r = np.einsum("nd,nd->n", x[items] @ theta, u) - y
  return 0.5 * r @ r + 0.5 * reg * np.sum(theta * theta)


def minimize_quadratic(x, a, b, reg, p, d):
  """argmin Σ_j ½ v_jᵀ A_j v_j − b_jᵀ v_j + λ/2 ‖θ‖², v_j = θᵀ x_j (L-BFGS)."""

  def f(flat):
    theta = flat.reshape(p, d)
    v = x @ theta
    av = np.einsum("mij,mj->mi", a, v)
    value = 0.5 * np.sum(v * av) - np.sum(b * v) + 0.5 * reg * flat @ flat
    return value, (x.T @ (av - b)).ravel() + reg * flat

  return optimize.minimize(f, np.zeros(p * d), jac=True, method="L-BFGS-B").x.reshape(p, d)


def run_one(m, p, d, num_examples, epsilon, steps, reg, seed):
  rng = np.random.default_rng(seed)
  x, items, u, y = problem(m, p, d, num_examples, rng)
  users = np.arange(num_examples)
  exact = statistics.sufficient_statistics(u, users, y, items, np.ones(num_examples), m)
  best = minimize_quadratic(x, exact.a, exact.b, reg, p, d)
  base = loss(best, x, items, u, y, reg)
  mu = gaussian_curve.gaussian_mu_for_epsilon(epsilon, 1e-5)
  # SSP2: two Gaussian releases with sensitivities Γ_u² = 1 and Γ_u Γ_y = 1.
  noisy = statistics.add_noise(
    exact, statistics.sample_noise(m, d, rng), np.sqrt(2.0) / mu, 1.0, 1.0, 1.0
  )
  ssp = minimize_quadratic(x, statistics.psd_projection(noisy.a), noisy.b, reg, p, d)

  # Noisy GD with step 1/L, L the smoothness of the loss (power iteration on the Hessian).
  def hess(theta):
    v = x @ theta
    return x.T @ np.einsum("mij,mj->mi", exact.a, v) + reg * theta

  z = rng.normal(size=(p, d))
  for _ in range(50):
    z = hess(z)
    z /= np.linalg.norm(z)
  smooth = np.sum(z * hess(z))
  sigma = np.sqrt(steps) / mu
  theta = np.zeros((p, d))
  for _ in range(steps):
    r = np.einsum("nd,nd->n", x[items] @ theta, u) - y
    clipped = np.clip(r, -1.0, 1.0)  # ‖g_i‖ = |r_i| ‖x‖ ‖u‖ = |r_i|; Γ = 1
    per_item = np.zeros((m, d))
    np.add.at(per_item, items, clipped[:, None] * u)
    grad = x.T @ per_item + sigma * rng.normal(size=(p, d)) + reg * theta
    theta -= grad / smooth
  return {
    "m": m,
    "p": p,
    "seed": seed,
    "ssp_excess": (loss(ssp, x, items, u, y, reg) - base) / num_examples,
    "noisy_gd_excess": (loss(theta, x, items, u, y, reg) - base) / num_examples,
  }


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--examples", type=int, default=20000)
  parser.add_argument("--dim", type=int, default=4)
  parser.add_argument("--epsilon", type=float, default=2.0)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--reg", type=float, default=1.0)
  args = parser.parse_args(argv)
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  grid = [(50, p) for p in (25, 100, 400, 1600)] + [(m, 100) for m in (25, 200, 800)]
  rows = []
  for m, p in grid:
    for seed in range(args.seeds):
      row = run_one(m, p, args.dim, args.examples, args.epsilon, args.steps, args.reg, seed)
      rows.append(row)
      print(", ".join(f"{k}={v:.4g}" for k, v in row.items()), file=sys.stderr, flush=True)
  with open(out / "theory.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  print("| m | p | SSP excess (mean) | noisy GD excess (mean) |\n|---|---|---|---|")
  means = {}
  for m, p in grid:
    sel = [r for r in rows if r["m"] == m and r["p"] == p]
    means[m, p] = (
      np.mean([r["ssp_excess"] for r in sel]),
      np.mean([r["noisy_gd_excess"] for r in sel]),
    )
    print(f"| {m} | {p} | {means[m, p][0]:.4g} | {means[m, p][1]:.4g} |")
  _plot(means, out / "theory.png")
  return 0


def _plot(means, path):
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  ps = sorted(p for m, p in means if m == 50)
  ms = sorted(m for m, p in means if p == 100)
  for k, name in ((0, "SSP (public features)"), (1, "noisy GD (all private)")):
    left.loglog(ps, [means[50, p][k] for p in ps], marker="o", label=name)
    right.loglog(ms, [means[m, 100][k] for m in ms], marker="o", label=name)
  left.set(xlabel="p (public feature dimension), m = 50", ylabel="excess empirical risk / D")
  right.set(xlabel="m (items), p = 100", ylabel="excess empirical risk / D")
  left.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  sys.exit(main())
