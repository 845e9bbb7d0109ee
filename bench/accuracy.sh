#!/usr/bin/env bash
# The accuracy benchmark of issue 3: all five strategies with the same seed on
# Fashion-MNIST, 20 clients, full participation, in PFLlib's two settings
# (Dirichlet 0.1 and pathological 2 classes per client), R rounds each.
# Writes OUT/accuracy.db, OUT/summary.txt and one SVG plot per setting.
#   bench/accuracy.sh [ROUNDS=100] [OUT=bench-results] [extra fedmoe-sim flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-100}
out=${2:-bench-results}
shift $(( $# > 2 ? 2 : $# )) || true
mkdir -p "$out"
db="$out/accuracy.db"
sim=build/client/fedmoe-sim
hist=build/server/fedmoe-history
for setting in "dirichlet 0.1" "pathological 2"; do
  tag=${setting// /-}
  ids=()
  for strategy in local fedavg comigs pfedmoap full; do
    echo "== $setting, $strategy, $rounds rounds" >&2
    $sim --clients 20 --rounds "$rounds" --strategy "$strategy" --$setting --seed 1 --db "$db" \
         --workdir "$out/work-$tag-$strategy" "$@" > "$out/sim-$tag-$strategy.txt"
    ids+=("$(grep -m1 '^run ' "$out/sim-$tag-$strategy.txt" | awk '{print $2}')")
  done
  $hist --db "$db" plot --out "$out/accuracy-$tag.svg" "${ids[@]}" >&2
  for id in "${ids[@]}"; do
    $hist --db "$db" export "$id" | awk -F, -v id="$id" -v setting="$setting" '
      NR > 1 { acc = $10 * 100; if (acc > best) { best = acc; at = $2 } final = acc; n = $2 }
      END { printf "%-16s %-28s rounds %3d  best %6.2f%% (round %3d)  final %6.2f%%\n", setting, id, n, best, at, final }'
  done
done | tee "$out/summary.txt"
$hist --db "$db" runs >> "$out/summary.txt"
