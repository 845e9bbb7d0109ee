#!/usr/bin/env bash
# The accuracy benchmark of issue 3: the five strategies with the same seed on
# Fashion-MNIST, 20 clients, full participation, in PFLlib's two settings
# (Dirichlet 0.1 and pathological 2 classes per client), R rounds each.
# Writes OUT/accuracy.db, OUT/summary-<setting>.txt, one SVG plot per setting and
# OUT/machine.txt (commit, CPU, start time, flags).
#   bench/accuracy.sh [ROUNDS=100] [OUT=bench-results] [extra fedmoe-sim flags...]
# Environment: BUILD (default build), SETTINGS (default "dirichlet-0.1 pathological-2"),
#              STRATEGIES (default "local fedavg comigs pfedmoap full").
# The summary gives the best and final mean personalized accuracy on the test
# splits and, beside them, on the validation splits (what settings are chosen on).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-100}
out=${2:-bench-results}
shift $(( $# > 2 ? 2 : $# )) || true
settings=${SETTINGS:-dirichlet-0.1 pathological-2}
strategies=${STRATEGIES:-local fedavg comigs pfedmoap full}
mkdir -p "$out"
# Where and with what the numbers were made (bench/machine.sh).
{ bench/machine.sh
  echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), flags: $*"
} > "$out/machine.txt"
db="$out/accuracy.db"
build=${BUILD:-build}
sim=$build/client/fedmoe-sim
hist=$build/server/fedmoe-history
for tag in $settings; do
  setting=${tag/-/ }
  ids=() labels=()
  for strategy in $strategies; do
    echo "== $setting, $strategy, $rounds rounds ($*)" >&2
    $sim --clients 20 --rounds "$rounds" --strategy "$strategy" --$setting --seed 1 --db "$db" \
         --workdir "$out/work-$tag-$strategy" "$@" > "$out/sim-$tag-$strategy.txt"
    ids+=("$(grep -m1 '^run ' "$out/sim-$tag-$strategy.txt" | awk '{print $2}')")
    labels+=("$setting $strategy")
  done
  $hist --db "$db" plot --out "$out/accuracy-$tag.svg" "${ids[@]}" >&2
  for i in "${!ids[@]}"; do
    bench/run-summary.sh "$db" "${ids[$i]}" "${labels[$i]}"
  done | tee "$out/summary-$tag.txt"
done
