#!/usr/bin/env bash
# The coordinator under load (BENCHMARKS.md "Scale"): for each N, a real
# fedmoe-server (CURVE, keys for N clients) and fedmoe-loadgen with N
# protocol-correct clients that answer every Task at once (or spread over
# SPREAD s), ROUNDS rounds of STRATEGY. Prints per N: the coordinator's peak
# RSS (VmHWM) and its ratio to the model's size, the median round wall time
# (the rounds table), the coordinator's CPU time per round (utime + stime
# from the first round's opening to the end, divided by the rounds), and the
# median time between rounds (a round's aggregation to the next one's opening:
# the commit to the round log, the selection) and its share of a round;
# then the peak RSS once round 1 had committed against the peak at the end
# (what grows with the rounds), and round 1's time between rounds against the
# median of the later ones (round 1 learns its clipping bound); and the
# connections the coordinator accepted and the handshakes that failed (its
# exit line): a burst of N joins that costs nothing extra is N and 0.
# INSECURE=1 runs both without CURVE (plain TCP, no allow-list): the
# coordinator's own cost per client, without the crypto's.
#   bench/scale.sh [BUILD=build] [NS="10 100 1000"] [ROUNDS=5] [STRATEGY=full] [SPREAD=0]
set -euo pipefail
build=${1:-build} ns=${2:-10 100 1000} rounds=${3:-5} strategy=${4:-full} spread=${5:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/$build; [[ $build == /* ]] && bin=$build
work=$(mktemp -d /tmp/fedmoe-bench-scale-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$work/keys" "$work/server"
chmod 700 "$work/keys" "$work/server"
"$bin/server/fedmoe-keygen" --out "$work/server" coordinator >/dev/null
if [[ ${INSECURE:-0} == 1 ]]; then
  server_auth=(--insecure) client_auth=(--insecure)
else
  server_auth=(--key "$work/server/coordinator.key" --allow "$work/keys")
  client_auth=(--keys "$work/keys" --server-key "$work/server/coordinator.pub")
fi
port=$((20000 + RANDOM % 10000)) # (below the ephemeral range, which thousands of clients use)
printf '| clients | peak RSS | RSS / model | median round | CPU per round | CPU per client-round | between rounds | peak after round 1, at the end | round 1 between rounds | accepted, failed handshakes |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n'
for n in $ns; do
  "$bin/bench/fedmoe-loadgen" --keys "$work/keys" --clients "$n" --make-keys
  db=$work/scale-$n.db
  "$bin/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$db" "${server_auth[@]}" --rounds "$rounds" --min-clients "$n" --partitions "$n" --client-dirichlet 0.3 --strategy "$strategy" \
    --max-connections $((n + 64)) > "$work/server-$n.log" 2>&1 &
  server=$!
  sleep 0.5
  # the clients in processes of at most 1,000 (one process polls all its sockets each turn)
  loadgens=()
  for ((first = 0; first < n; first += 1000)); do
    "$bin/bench/fedmoe-loadgen" --connect "tcp://127.0.0.1:$port" --first $first \
      --clients $((n - first < 1000 ? n - first : 1000)) "${client_auth[@]}" --spread "$spread" > "$work/loadgen-$n-$first.log" 2>&1 &
    loadgens+=($!)
  done
  hwm=0 cpu=0 cpu0= peaks=()
  tck=$(getconf CLK_TCK)
  while kill -0 $server 2>/dev/null; do
    # the peak when each round committed (read before the peak below: a peak
    # read after the commit line may be the next round's)
    committed=$(grep -c "clients, train loss" "$work/server-$n.log" || true)
    while ((${#peaks[@]} < committed)); do peaks+=("$hwm"); done
    h=$(awk '/^VmHWM/ { print $2 }' /proc/$server/status 2>/dev/null || echo 0)
    c=$(awk '{ print $14 + $15 }' /proc/$server/stat 2>/dev/null || echo 0)
    [[ -n $h && $h -gt $hwm ]] && hwm=$h
    [[ -n $c && $c -gt $cpu ]] && cpu=$c
    # the rounds' CPU: from the first round's opening (start-up and joining apart)
    [[ -z $cpu0 ]] && grep -q "round 1/.*selected" "$work/server-$n.log" && cpu0=$cpu
    sleep 0.1
  done
  cpu=$((cpu - ${cpu0:-0}))
  wait $server || { echo "N=$n: the coordinator failed:"; tail -5 "$work/server-$n.log"; exit 1; }
  for l in "${loadgens[@]}"; do wait $l || true; done
  model=$(sed -n 's/.*federated vector \([0-9]*\) floats.*/\1/p' "$work/loadgen-$n-0.log" | head -1)
  joins=$(sed -n 's/.*; \([0-9]*\) accepted since the start, \([0-9]*\) handshakes failed.*/\1, \2/p' "$work/server-$n.log" | tail -1)
  echo "N=$n: peak RSS (MB) when each round committed: $(for p in "${peaks[@]}"; do printf '%d ' $((p / 1024)); done)" >&2
  /usr/bin/python3 - "$db" "$n" "$hwm" "$cpu" "$tck" "$model" "$rounds" "${peaks[0]:-0}" "${joins:--}" <<'PY'
import sqlite3, statistics, sys
db, n, hwm, cpu, tck, model, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
hwm1, joins = int(sys.argv[8]), sys.argv[9]
rows = list(sqlite3.connect(db).execute("SELECT seconds, started_at, finished_at FROM rounds ORDER BY round"))
secs = [r[0] for r in rows]
from datetime import datetime
t = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
gaps = [t(rows[i + 1][1]) - t(rows[i][2]) for i in range(len(rows) - 1)]
assert len(secs) == rounds, f"{len(secs)} rounds of {rounds}"
mb = hwm / 1024
cpu_round = cpu / tck / rounds
gap = f"{1000 * statistics.median(gaps):.0f} ms ({100 * statistics.median(gaps) / statistics.median(secs):.1f}%)" if gaps else "-"
growth = f"{hwm1 / 1024:.0f} MB, {mb:.0f} MB ({100 * (hwm - hwm1) / hwm1:+.1f}%)" if hwm1 else "-"
first = f"{1000 * gaps[0]:.0f} ms ({gaps[0] / statistics.median(gaps[1:]):.1f}x)" if len(gaps) > 1 else "-"
print(f"| {n:,} | {mb:.0f} MB | {hwm * 1024 / (4 * model):.0f} | {statistics.median(secs):.2f} s | {cpu_round:.2f} s | {1000 * cpu_round / n:.1f} ms | {gap} | {growth} | {first} | {joins} |")
PY
  port=$((port + 1))
done
echo "(model: $(sed -n 's/.*federated vector \([0-9]*\) floats.*/\1/p' "$work"/loadgen-*.log | head -1) floats; strategy $strategy, $rounds rounds, spread ${spread} s; $([[ ${INSECURE:-0} == 1 ]] && echo "no CURVE" || echo CURVE); commit $(git -C "$root" describe --always --dirty))"
