#!/usr/bin/env bash
# The main job (README, `python3 dev.py demo`): optimize correlated-noise strategies, calibrate the
# noise for a target epsilon, simulate DP FedAvg on synthetic data under a client timer, and audit
# the participation log the run wrote. Everything lands in out/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out/demo}
mkdir -p "$out"
N=${N:-60}; B=${B:-15}; K=${K:-4}; EPS=${EPS:-8}; DELTA=${DELTA:-1e-6}
P=(--n "$N" --min-sep "$B" --max-participations "$K")

echo "== 1. strategies for n=$N rounds, min-sep b=$B, at most k=$K participations"
fedmf strategy optimize --mechanism dpsgd "${P[@]}" --out "$out/dpsgd.json" --force --no-progress > /dev/null
fedmf strategy optimize --mechanism tree --tree-variant online-honaker "${P[@]}" --out "$out/tree.json" --force --no-progress > /dev/null
fedmf strategy optimize --mechanism band-toeplitz "${P[@]}" --out "$out/band-toeplitz.json" --force --no-progress > /dev/null
fedmf strategy optimize --mechanism bandmf "${P[@]}" --out "$out/bandmf.json" --force --no-progress > /dev/null
fedmf strategy optimize --mechanism blt "${P[@]}" --out "$out/blt.json" --force --no-progress > /dev/null
for s in dpsgd tree band-toeplitz bandmf blt; do
  fedmf strategy evaluate "$out/$s.json" "${P[@]}"
done

echo; echo "== 2. noise multiplier for epsilon=$EPS at delta=$DELTA (BLT)"
fedmf account "$out/blt.json" "${P[@]}" --target-epsilon "$EPS" --delta "$DELTA"

echo; echo "== 3. DP FedAvg on synthetic data with the BLT aggregator, client timer b=$B"
fedmf simulate --strategy "$out/blt.json" --rounds "$N" --min-sep "$B" --max-participations "$K" \
  --clients 200 --clients-per-round 10 --target-epsilon "$EPS" --delta "$DELTA" --out "$out/sim" --no-progress

echo; echo "== 4. standalone audit of the participation log"
sigma=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['noise_multiplier'])" "$out/sim/summary.json")
fedmf audit "$out/sim/participation.csv" --strategy "$out/blt.json" --noise-multiplier "$sigma" --delta "$DELTA" \
  --rounds "$N" --min-sep "$B" --max-participations "$K" --report "$out/audit"
echo; echo "report: $out/audit/report.md"
