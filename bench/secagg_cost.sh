#!/usr/bin/env bash
# Secure aggregation's cost against plaintext rounds. For each client count,
# one fedmoe-sim run of fedavg with --secure-aggregation and one without
# (--clip-norm off: the same mean, so the same model), ROUNDS rounds each,
# one after the other in this invocation. Prints per count and mode: the
# median seconds a round (rounds 2 and later), the coordinator's peak memory
# and CPU seconds, the bytes up and down per client a round, and the median
# seconds a client took to mask its input.
#   bench/secagg_cost.sh [OUT=bench-secagg] [extra fedmoe-sim flags...]
# Environment: CLIENTS ("10 50 100"), ROUNDS (3), BUILD (build).
# Every client runs on this machine: the round time is the sum of all the
# clients' work over its cores, not what one client of a real deployment
# waits (its own masking time, printed beside).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-secagg}
shift $(( $# > 1 ? 1 : $# )) || true
build=${BUILD:-build}
rounds=${ROUNDS:-3}
mkdir -p "$out"
{ bench/machine.sh; echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), rounds $rounds, flags: $*"; } >> "$out/machine.txt"
med() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "-" }'; }
printf "%-7s %-6s %12s %10s %10s %14s %14s %10s\n" clients mode "s/round" "coord MB" "coord CPU" "up B/client" "down B/client" "mask s"
for n in ${CLIENTS:-10 50 100}; do
  for mode in plain secagg; do
    flag=(); [[ $mode == secagg ]] && flag=(--secure-aggregation)
    wd="$out/work-$n-$mode"
    rm -rf "$wd"
    "$build/client/fedmoe-sim" --clients "$n" --strategy fedavg --clip-norm off --rounds "$rounds" "${flag[@]}" \
      --db "$out/cost.db" --workdir "$wd" "$@" > "$out/sim-$n-$mode.txt"
    id=$(grep -m1 '^run ' "$out/sim-$n-$mode.txt" | awk '{print $2}')
    secs=$(sqlite3 "$out/cost.db" "select seconds from rounds where run_id='$id' and round > 1" | med)
    per=$(sqlite3 "$out/cost.db" "select printf('%d %d', avg(bytes_up * 1.0 / completed), avg(bytes_down * 1.0 / selected)) from rounds where run_id='$id' and round > 1")
    mem=$(sed -n 's/.*peak memory \([0-9]*\) KB.*/\1/p' "$wd/server.log" | awk '{ printf "%d", $1 / 1024 }')
    cpu=$(sed -n 's/.*CPU \([0-9.]*\) s (user and system).*/\1/p' "$wd/server.log")
    mask=$(cat "$wd"/*.log | sed -n 's/.*input masked with [0-9]* others. pair masks in \([0-9.]*\) s.*/\1/p' | med)
    printf "%-7s %-6s %12s %10s %10s %14s %14s %10s\n" "$n" "$mode" "$secs" "$mem" "$cpu" ${per} "$mask"
  done
done | tee -a "$out/table.txt"
