#!/usr/bin/env bash
# What an idle virtual client costs (BENCHMARKS.md "Scale", virtual clients):
# for each N, a real coordinator (CURVE) whose quorum is above N, so no round
# opens, and one fedmoe-client --virtual N host; once all N have joined (and 5 s
# more), the host's resident memory, split by kind from /proc/PID/smaps: the
# client threads' stacks (static TLS included), the main heap (libzmq's sockets
# and the sessions), the rest (the dataset's copy, the malloc arenas), and the
# host's threads. Then the memory per client between the first and the last N.
#   bench/virtual_idle.sh [BUILD=build] [NS="1200 2400"]
set -euo pipefail
build=${1:-build} ns=${2:-1200 2400}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/$build; [[ $build == /* ]] && bin=$build
work=$(mktemp -d /tmp/fedmoe-bench-idle-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait; rm -rf "$work"' EXIT
max=0
for n in $ns; do (( n > max )) && max=$n; done
ulimit -n $((2 * max + 1024)) 2>/dev/null || ulimit -n "$(ulimit -Hn)"
mkdir -m 700 "$work/keys" "$work/server"
"$bin/server/fedmoe-keygen" --out "$work/server" coordinator >/dev/null
"$bin/server/fedmoe-keygen" --out "$work/keys" $(seq -f "vh-%05g" 0 $((max - 1))) >/dev/null
port=$((20000 + RANDOM % 10000))
printf '| idle clients | host RSS | thread stacks | main heap | rest | host threads |\n|--:|--:|--:|--:|--:|--:|\n'
first= last=
for n in $ns; do
  mkdir -m 700 "$work/state-$n"
  "$bin/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$work/idle-$n.db" \
    --key "$work/server/coordinator.key" --allow "$work/keys" --rounds 1 --min-clients $((max + 1)) \
    --partitions "$n" --max-connections $((max + 64)) --pathological 2 > "$work/server-$n.log" 2>&1 &
  server=$!
  sleep 0.5
  "$bin/client/fedmoe-client" --connect "tcp://127.0.0.1:$port" --id vh --virtual "$n" --workers 2 \
    --keys "$work/keys" --server-key "$work/server/coordinator.pub" --partition "0/$n" \
    --state-dir "$work/state-$n" --pathological 2 > "$work/host-$n.log" 2>&1 &
  host=$!
  for _ in $(seq 600); do
    (( $(grep -c " joined " "$work/server-$n.log" || true) >= n )) && break
    kill -0 $host 2>/dev/null || { echo "the host failed:"; tail -5 "$work/host-$n.log"; exit 1; }
    sleep 0.5
  done
  (( $(grep -c " joined " "$work/server-$n.log" || true) >= n )) || { echo "N=$n: not all joined in 300 s"; exit 1; }
  sleep 5
  row=$(/usr/bin/python3 - "$host" "$n" <<'PY'
import sys
pid, n = sys.argv[1], int(sys.argv[2])
stacks = heap = total = 0
size = 0; name = ''
for line in open(f'/proc/{pid}/smaps'):
    f = line.split()
    if '-' in f[0] and len(f) >= 5 and ':' in f[3]:
        a, b = (int(x, 16) for x in f[0].split('-'))
        size, name = (b - a) >> 10, (f[5] if len(f) > 5 else '')
    elif f[0] == 'Rss:':
        kb = int(f[1]); total += kb
        if name == '[heap]': heap += kb
        elif not name and 2048 <= size <= 2048 + 64: stacks += kb  # a client thread's 2 MiB stack
print(total, stacks, heap)
PY
)
  read -r total stacks heap <<< "$row"
  threads=$(awk '/^Threads:/ { print $2 }' "/proc/$host/status")
  printf '| %s | %d MB | %d MB | %d MB | %d MB | %s |\n' "$n" $((total >> 10)) $((stacks >> 10)) $((heap >> 10)) $(((total - stacks - heap) >> 10)) "$threads"
  [[ -z $first ]] && first="$n $total $stacks $heap"
  last="$n $total $stacks $heap"
  kill $host $server 2>/dev/null || true
  wait $host $server 2>/dev/null || true
  port=$((port + 1))
done
read -r n0 t0 s0 h0 <<< "$first"
read -r n1 t1 s1 h1 <<< "$last"
if (( n1 > n0 )); then
  d=$((n1 - n0))
  echo "per idle client (N $n0 -> $n1): $(( (t1 - t0) / d )) KB in all, $(( (s1 - s0) / d )) KB stack, $(( (h1 - h0) / d )) KB heap"
fi
echo "(commit $(git -C "$root" describe --always --dirty))"
