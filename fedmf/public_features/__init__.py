"""Private learning with public features (Krichene et al. 2023; docs/public-features.md).

Two-tower models u(x_priv) · v(x_pub) trained by alternating minimization where only the private
side (a user's ratings, and which items they rated) is protected: AM-SSP (sufficient statistics
perturbation), the AM-DPSGD and DP-ALS baselines, user-level accounting of the whole run, and the
federated SSP of the paper's Algorithm 8 as TFF computations.

Modules (one concept each): data (MovieLens and synthetic datasets, splits), encoder (the public
item encoder), users (the closed-form UserUpdate), statistics (count estimation, weights, the
sufficient statistics and their noise), accounting, item_updates, algorithms, evaluation,
federated (TFF), config and driver (`fedmf public-features`), cli (its argparse parser).

This package file imports nothing: `fedmf --help` registers the command without importing the rest.
"""
