#!/bin/sh
# The cost of CURVE: the main job (fedmoe-sim on its defaults) with its keys and
# with --insecure, alternating, RUNS times each. Prints one line per run: mode,
# wall seconds, the median round's seconds (from the round log), final accuracy.
#   bench/curve_cost.sh [BUILD=build] [RUNS=3]
set -eu
build=${1:-build}
runs=${2:-3}
work=$(mktemp -d /tmp/fedmoe-curve-cost-XXXXXX)
i=1
while [ "$i" -le "$runs" ]; do
  for mode in secure insecure; do
    d="$work/$mode-$i"
    mkdir -p "$d"
    flag=""
    [ "$mode" = insecure ] && flag="--insecure"
    s=$(date +%s.%N)
    "$build/client/fedmoe-sim" $flag --db "$d/sim.db" --workdir "$d/w" > "$d/out.txt" 2>&1
    e=$(date +%s.%N)
    med=$(sqlite3 "$d/sim.db" "SELECT seconds FROM rounds ORDER BY seconds LIMIT 1 OFFSET (SELECT count(*)/2 FROM rounds)")
    echo "$mode run $i: wall $(echo "$e - $s" | bc) s, median round $med s, $(grep 'best test' "$d/out.txt" | tr -s ' ')"
  done
  i=$((i + 1))
done
rm -rf "$work"
