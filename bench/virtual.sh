#!/usr/bin/env bash
# A virtual host against a real coordinator (BENCHMARKS.md "Scale", virtual
# clients): N clients in one fedmoe-client --virtual process (CURVE, a key each,
# state spilled to a folder between rounds), the coordinator selecting FRACTION
# of them per round, ROUNDS rounds, partition PART (e.g. "--pathological 2").
# Prints the host's and the coordinator's peak memory, the wall time per round and
# the rounds table (test accuracy over the selected clients); with OUT set, keeps
# the round log as OUT.db and its plot as OUT.svg.
#   [OUT=docs/results/NAME] bench/virtual.sh [BUILD=build] [N=1000] [FRACTION=0.1] [ROUNDS=5] [PART="--pathological 2"]
# A host holds two file descriptors per client; where the limit (ulimit -n, as
# far as it can be raised) is short the clients are spread over several hosts,
# the cores shared among them.
set -euo pipefail
build=${1:-build} n=${2:-1000} fraction=${3:-0.1} rounds=${4:-5} part=${5:---pathological 2}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/$build; [[ $build == /* ]] && bin=$build
work=$(mktemp -d /tmp/fedmoe-bench-virtual-XXXXXX)
# (the hosts run under time(1): their children are stopped too; KEEP_WORK=1 keeps the folder)
trap 'for j in $(jobs -p); do pkill -P "$j" 2>/dev/null; kill "$j" 2>/dev/null; done; wait;
      [ -n "${KEEP_WORK:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
ulimit -n $((2 * n + 1024)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
fds=$(ulimit -n) cores=$(nproc)
hosts=$(( (2 * n + 64 + fds - 129) / (fds - 128) ))
per=$(( (n + hosts - 1) / hosts )) workers=$(( cores / hosts > 0 ? cores / hosts : 1 ))
mkdir -m 700 "$work/keys" "$work/server" "$work/state"
"$bin/server/fedmoe-keygen" --out "$work/server" coordinator >/dev/null
"$bin/server/fedmoe-keygen" --out "$work/keys" $(seq -f "vh-%05g" 0 $((n - 1))) >/dev/null
port=$((20000 + RANDOM % 10000))
quorum=$(python3 -c "import math; print(max(2, math.ceil($fraction * $n) // 2))")
# shellcheck disable=SC2086
${SERVER_WRAP:-} "$bin/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$work/v.db" --key "$work/server/coordinator.key" \
  --allow "$work/keys" --rounds "$rounds" --min-clients "$quorum" --fraction "$fraction" --partitions "$n" \
  --max-connections $((n + 64)) $part > "$work/server.log" 2>&1 &
server=$!
sleep 0.5
start=$(date +%s.%N)
pids=()
for h in $(seq 0 $((hosts - 1))); do
  count=$(( n - h * per < per ? n - h * per : per ))
  # shellcheck disable=SC2086
  /usr/bin/time -f "%M" -o "$work/host$h.mem" "$bin/client/fedmoe-client" --connect "tcp://127.0.0.1:$port" \
    --id vh --virtual "$count" --workers "$workers" --keys "$work/keys" \
    --server-key "$work/server/coordinator.pub" --partition "$((h * per))/$n" --state-dir "$work/state" $part \
    > "$work/host$h.log" 2>&1 &
  pids+=($!)
done
wait $server || { echo "the coordinator failed:"; tail -5 "$work/server.log"; exit 1; }
# clients still connecting when the run ended wait for a coordinator (as any
# client does): after 15 s the hosts are asked to stop
for _ in $(seq 150); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
[ $alive = 1 ] && for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null || true; done
for h in $(seq 0 $((hosts - 1))); do
  wait "${pids[$h]}" || [ $alive = 1 ] || { echo "host $h failed:"; tail -5 "$work/host$h.log"; exit 1; }
done
end=$(date +%s.%N)
echo "$n virtual clients, fraction $fraction, $rounds rounds ($part), commit $(git -C "$root" describe --always --dirty)"
echo "  $hosts host(s) of up to $per clients, $workers training at once each (file-descriptor limit $fds)"
echo "  clients joined: $(grep -c ' joined (partition' "$work/server.log") of $n"
echo "  host peak RSS $(cat "$work"/host*.mem | awk '{ s += $1 } END { printf "%d", s / 1024 }') MB (all hosts); coordinator $(sed -n 's/.*peak memory \([0-9]*\) KB.*/\1/p' "$work/server.log" | awk '{ printf "%d", $1 / 1024 }') MB; wall $(python3 -c "print(round($end - $start, 1))") s (start-up included)"
/usr/bin/python3 - "$work/v.db" <<'PY'
import sqlite3, statistics, sys
rows = list(sqlite3.connect(sys.argv[1]).execute(
    "SELECT round, selected, completed, seconds, test_accuracy FROM rounds ORDER BY round"))
print("| round | selected | completed | seconds | test accuracy |\n|--:|--:|--:|--:|--:|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {100 * r[4]:.2f}% |")
secs = [r[3] for r in rows]
print(f"round seconds: median {statistics.median(secs):.1f}, total {sum(secs):.0f}")
for k in (1, 10):
    last = rows[-k * 10:] if len(rows) >= k * 10 else rows
    print(f"test accuracy, mean of the last {len(last)} rounds: {100 * statistics.mean(r[4] for r in last):.2f}%")
PY
if [ -n "${OUT:-}" ]; then
  cp "$work/v.db" "$OUT.db"
  "$bin/server/fedmoe-history" --db "$OUT.db" plot --out "$OUT.svg"
fi
