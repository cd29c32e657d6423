#!/usr/bin/env bash
# The main job (README, `python3 dev.py demo`): `fedmf simulate` with the default config
# (simulations/configs/default.yaml): DP federated next-word prediction on the built-in synthetic
# data with a BLT under a client timer, ending in an audit of its own participation log.
# Outputs in out/demo/ (report.html, summary.json, metrics.csv, participation.csv, ...).
# Extra arguments go to `fedmf simulate`, e.g. `python3 dev.py demo --set rounds=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/demo}
exec fedmf simulate --out "$out" --force "$@"
