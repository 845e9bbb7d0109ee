#!/usr/bin/env bash
# ctest python_client: the Python client of examples/python (Debian's pyzmq with
# CURVE and protobuf; its message module made by protoc from proto/fedmoe.proto)
# joins real 2-round runs (full, fedavg, comigs --shared experts) beside a real
# fedmoe-client, with real keys. Passes when each run finishes, both clients
# completed both rounds, and round 1's Task is, bit for bit, the initial state
# the Python side draws from the docs alone (examples/python/fedmoe_init.py).
#   tests/python_client.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 py=$3
tmp=$(mktemp -d /tmp/fedmoe-test-python-XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }

protoc --python_out="$tmp" -I "$src/proto" "$src/proto/fedmoe.proto"
"$build/server/fedmoe-keygen" --out "$tmp/server" coordinator > /dev/null
"$build/server/fedmoe-keygen" --out "$tmp/clients" c0 py0 > /dev/null
# one 2-round run a strategy (and one with --shared experts): the Python client
# also checks that round 1's Task is the initial state it draws from the docs
run() {
  local tag=$1; shift
  local port ep server
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  ep="tcp://127.0.0.1:$port"
  "$build/server/fedmoe-server" --bind "$ep" --db "$tmp/$tag.db" --rounds 2 --min-clients 2 --partitions 2 \
    --key "$tmp/server/coordinator.key" --allow "$tmp/clients" "$@" > "$tmp/server-$tag.log" 2>&1 &
  server=$!; pids+=("$server")
  "$build/client/fedmoe-client" --connect "$ep" --id c0 --key "$tmp/clients/c0.key" \
    --server-key "$tmp/server/coordinator.pub" --state-dir "$tmp/state-$tag" > "$tmp/c0-$tag.log" 2>&1 &
  pids+=($!)
  timeout 180 "$py" "$src/examples/python/fedmoe_client.py" --connect "$ep" --id py0 --key "$tmp/clients/py0.key" \
    --server-key "$tmp/server/coordinator.pub" --pb-dir "$tmp" --check-init > "$tmp/py0-$tag.log" 2>&1 \
    || fail "$tag: the Python client failed"
  timeout 60 tail --pid="$server" -f /dev/null || fail "$tag: the coordinator did not finish"
  wait "$server" || fail "$tag: the coordinator exited with an error"
  "$py" - "$tmp/$tag.db" <<'PY' || fail "$tag: the round log is not as expected"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
status, = db.execute("SELECT status FROM runs").fetchone()
rows = db.execute("SELECT client_id, round, status FROM client_rounds ORDER BY round, client_id").fetchall()
print("run", status, rows)
assert status == "finished"
assert rows == [("c0", 1, "completed"), ("py0", 1, "completed"), ("c0", 2, "completed"), ("py0", 2, "completed")]
PY
  grep -q "shut down after 2 rounds" "$tmp/py0-$tag.log" || fail "$tag: the Python client did not hear the end of the run"
  grep -q "round 1's Task is the docs' draw, bit for bit" "$tmp/py0-$tag.log" || fail "$tag: no initial-state check"
  grep "initial state" "$tmp/py0-$tag.log"
}
run full --strategy full --seed 11
run fedavg --strategy fedavg --seed 12
run comigs-experts --strategy comigs --shared experts --seed 13
rm -rf "$tmp"
echo "python client: 2 rounds of full, fedavg and comigs --shared experts completed beside fedmoe-client"
