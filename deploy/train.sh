#!/usr/bin/env bash
# Launch (or resume) the training program. Rerun the same command after a crash or a kill: it
# resumes from the last checkpoint in ROOT and releases exactly what an uninterrupted run would.
#   deploy/train.sh [ROOT] [--set KEY=VALUE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-runs/prod}
shift || true
exec fedmf train --config deploy/configs/train.yaml --root "$root" "$@"
