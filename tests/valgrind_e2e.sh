#!/usr/bin/env bash
# The end-to-end path under valgrind memcheck: a coordinator and two clients on
# loopback, each under valgrind, on a small CSV dataset (valgrind runs code ~50x
# slower), 2 rounds. Fails on any invalid access, uninitialised use or leak.
#   tests/valgrind_e2e.sh BUILD_DIR   (a build with -DFM_NATIVE=OFF: valgrind 3.19 knows no AVX-512)
set -euo pipefail
build=${1:-build}
work=$(mktemp -d /tmp/fedmoe-valgrind-XXXXXX)
trap 'rm -rf "$work"' EXIT
# 240 examples of 784 features, 10 classes
python3 - "$work/data.csv" <<'PY'
import random, sys
random.seed(1)
with open(sys.argv[1], "w") as f:
    for i in range(240):
        c = i % 10
        f.write(",".join([str(c)] + ["%.3f" % (random.gauss(0, 1) + (2.0 if j % 10 == c else 0.0)) for j in range(784)]) + "\n")
PY
vg=(valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect
    --show-leak-kinds=definite,indirect --track-origins=no)
port=$((30000 + RANDOM % 20000))
# real CURVE keys: the coordinator's pair, and the clients' in its allow-list
"$build/server/fedmoe-keygen" --out "$work/keys" coordinator > /dev/null
"$build/server/fedmoe-keygen" --out "$work/keys/clients" vg0 vg1 > /dev/null
"${vg[@]}" "$build/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$work/vg.db" --rounds 2 \
    --min-clients 2 --partitions 2 --iid --dataset "csv:$work/data.csv" --round-timeout 900 \
    --key "$work/keys/coordinator.key" --allow "$work/keys/clients" > "$work/server.log" 2>&1 &
server=$!
pids=()
for i in 0 1; do
  "${vg[@]}" "$build/client/fedmoe-client" --connect "tcp://127.0.0.1:$port" --key "$work/keys/clients/vg$i.key" \
      --server-key "$work/keys/coordinator.pub" --dataset "csv:$work/data.csv" --state-dir "$work" \
      > "$work/client$i.log" 2>&1 &
  pids+=($!)
done
status=0
wait "$server" || status=$?
for p in "${pids[@]}"; do wait "$p" || status=$?; done
if [[ $status -ne 0 ]]; then
  echo "valgrind_e2e: a process failed (status $status)"; for f in "$work"/*.log; do echo "== $f"; tail -n 30 "$f"; done; exit 1
fi
rounds=$("$build/server/fedmoe-history" --db "$work/vg.db" export | tail -n +2 | wc -l)
if [[ $rounds -ne 2 ]]; then echo "valgrind_e2e: expected 2 rounds, found $rounds"; exit 1; fi
echo "valgrind_e2e: coordinator and 2 clients (CURVE) clean under memcheck, 2 rounds"
