#!/bin/sh
# The cost of a change on the main job: fedmoe-sim on its defaults with the
# programs of two builds (before and after), alternating, RUNS times each.
# Prints one line per run: build, wall seconds, the median round's seconds
# (from the round log), the final accuracy line.
#   bench/builds_cost.sh BUILD_BEFORE BUILD_AFTER [RUNS=3]
set -eu
before=${1:?a build folder (before)}
after=${2:?a build folder (after)}
runs=${3:-3}
work=$(mktemp -d /tmp/fedmoe-builds-cost-XXXXXX)
i=1
while [ "$i" -le "$runs" ]; do
  for build in "$before" "$after"; do
    d="$work/$(basename "$build")-$i"
    mkdir -p "$d"
    s=$(date +%s.%N)
    "$build/client/fedmoe-sim" --db "$d/sim.db" --workdir "$d/w" > "$d/out.txt" 2>&1
    e=$(date +%s.%N)
    med=$(sqlite3 "$d/sim.db" "SELECT seconds FROM rounds ORDER BY seconds LIMIT 1 OFFSET (SELECT count(*)/2 FROM rounds)")
    echo "$build run $i: wall $(echo "$e - $s" | bc) s, median round $med s, $(grep 'best test' "$d/out.txt" | tr -s ' ')"
  done
  i=$((i + 1))
done
rm -rf "$work"
