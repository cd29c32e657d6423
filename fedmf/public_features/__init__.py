"""Private learning with public features (Krichene et al. 2023; docs/public-features.md).

Two-tower models u(x_priv) · v(x_pub) with user and item biases, trained by alternating
minimization where only the private side (a user's ratings, and which items they rated) is
protected: AM-SSP (sufficient statistics perturbation), the AM-DPSGD and DP-ALS baselines, the DP
bias model, user-level accounting of the whole run, the paper's protocol (validation, tuning,
seeds), and the federated SSP of the paper's Algorithm 8 as TFF computations.

Modules (one concept each): data (ratings, features, splits, synthetic data), movielens (the four
MovieLens layouts, streamed), encoder (the public item encoder), users (the closed-form
UserUpdate), model (the two-tower model with biases), statistics (count estimation, weights, the
sufficient statistics and their noise), accounting, item_updates, algorithms, evaluation,
baselines, tuning, cost (the run's estimate), federated (TFF), config and driver
(`fedmf public-features`; its run directory: fedmf.program.public_features), cli (its argparse
parser).

This package file imports nothing: `fedmf --help` registers the command without importing the rest.
"""
