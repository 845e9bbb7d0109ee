#!/usr/bin/env bash
# A virtual host against a real coordinator (BENCHMARKS.md "Scale", virtual
# clients): N clients in one fedmoe-client --virtual process (CURVE, a key each,
# state spilled to a folder between rounds), the coordinator selecting FRACTION
# of them per round, ROUNDS rounds, partition PART (e.g. "--pathological 2").
# Prints the host's and the coordinator's peak memory, the wall time per round and
# the rounds table (test accuracy over the selected clients).
#   bench/virtual.sh [BUILD=build] [N=1000] [FRACTION=0.1] [ROUNDS=5] [PART="--pathological 2"]
set -euo pipefail
build=${1:-build} n=${2:-1000} fraction=${3:-0.1} rounds=${4:-5} part=${5:---pathological 2}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/$build
work=$(mktemp -d /tmp/fedmoe-bench-virtual-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -m 700 "$work/keys" "$work/server" "$work/state"
"$bin/server/fedmoe-keygen" --out "$work/server" coordinator >/dev/null
"$bin/server/fedmoe-keygen" --out "$work/keys" $(seq -f 'vh-%05g' 0 $((n - 1))) >/dev/null
port=$((20000 + RANDOM % 10000))
quorum=$(python3 -c "import math; print(max(2, math.ceil($fraction * $n) // 2))")
# shellcheck disable=SC2086
"$bin/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$work/v.db" --key "$work/server/coordinator.key" \
  --allow "$work/keys" --rounds "$rounds" --min-clients "$quorum" --fraction "$fraction" --partitions "$n" \
  --max-connections $((n + 64)) $part > "$work/server.log" 2>&1 &
server=$!
sleep 0.5
start=$(date +%s.%N)
# shellcheck disable=SC2086
/usr/bin/time -f "%M" -o "$work/host.mem" "$bin/client/fedmoe-client" --connect "tcp://127.0.0.1:$port" --id vh \
  --virtual "$n" --keys "$work/keys" --server-key "$work/server/coordinator.pub" --partition "0/$n" \
  --state-dir "$work/state" $part > "$work/host.log" 2>&1 &
host=$!
wait $server || { echo "the coordinator failed:"; tail -5 "$work/server.log"; exit 1; }
wait $host || { echo "the host failed:"; tail -5 "$work/host.log"; exit 1; }
end=$(date +%s.%N)
echo "$n virtual clients, fraction $fraction, $rounds rounds ($part), commit $(git -C "$root" describe --always --dirty)"
echo "  host peak RSS $(( $(cat "$work/host.mem") / 1024 )) MB; coordinator $(sed -n 's/.*peak memory \([0-9]*\) KB.*/\1/p' "$work/server.log" | awk '{ printf "%d", $1 / 1024 }') MB; wall $(python3 -c "print(round($end - $start, 1))") s (start-up included)"
/usr/bin/python3 - "$work/v.db" <<'PY'
import sqlite3, sys
print("| round | selected | completed | seconds | test accuracy |\n|--:|--:|--:|--:|--:|")
for r in sqlite3.connect(sys.argv[1]).execute("SELECT round, selected, completed, seconds, test_accuracy FROM rounds ORDER BY round"):
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {100 * r[4]:.2f}% |")
PY
