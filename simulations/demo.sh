#!/usr/bin/env bash
# The main job (README): the most complete end-to-end fedmf run that exists so far.
# Output goes to out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=out/demo
mkdir -p "$out"
N=${N:-120}; B=${B:-20}; K=${K:-6}

echo "== 1. strategies for n=$N rounds, min-sep b=$B, at most k=$K participations"
fedmf strategy optimize --mechanism dpsgd --n "$N" --min-sep "$B" --max-participations "$K" --out "$out/dpsgd.json"
fedmf strategy optimize --mechanism tree --tree-variant online-honaker --n "$N" --min-sep "$B" --max-participations "$K" --out "$out/tree.json"

echo "== 2. evaluate (JSON for machines)"
fedmf strategy evaluate "$out/dpsgd.json" --n "$N" --min-sep "$B" --max-participations "$K" --json
