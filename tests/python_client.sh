#!/usr/bin/env bash
# ctest python_client: the Python client of examples/python (Debian's pyzmq with
# CURVE, protobuf and NumPy; its message module made by protoc from
# proto/fedmoe.proto), written from the docs alone, trains beside a real
# fedmoe-client in real 3-round runs of every strategy (and comigs with
# --shared experts, full with --gating shared), with real keys. Passes when its backward pass agrees with
# finite differences (fedmoe_model.py's self-test), each run finishes with
# both clients' Updates accepted in every round, round 1's Task is, bit for bit,
# the initial state the Python side draws from the docs
# (examples/python/fedmoe_init.py), and the Python client learns: its training
# loss falls from round 1 to round 3 and its test accuracy ends above 50% (10
# classes).
#   tests/python_client.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
build=$1 src=$2 py=$3
tmp=$(mktemp -d /tmp/fedmoe-test-python-XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "== $f"; tail -20 "$f"; done; exit 1; }

protoc --python_out="$tmp" -I "$src/proto" "$src/proto/fedmoe.proto"
"$py" "$src/examples/python/fedmoe_model.py" || fail "the NumPy model's backward pass disagrees with finite differences"
"$build/server/fedmoe-keygen" --out "$tmp/server" coordinator > /dev/null
"$build/server/fedmoe-keygen" --out "$tmp/clients" c0 py0 > /dev/null
# one 3-round run a strategy (and one with --shared experts): the Python client
# trains, and (but under local, whose Tasks carry no state) checks that round
# 1's Task is the initial state it draws from the docs
run() {
  local tag=$1; shift
  local port ep server
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  ep="tcp://127.0.0.1:$port"
  "$build/server/fedmoe-server" --bind "$ep" --db "$tmp/$tag.db" --rounds 3 --min-clients 2 --partitions 8 \
    --client-examples 300 --key "$tmp/server/coordinator.key" --allow "$tmp/clients" "$@" > "$tmp/server-$tag.log" 2>&1 &
  server=$!; pids+=("$server")
  "$build/client/fedmoe-client" --connect "$ep" --id c0 --key "$tmp/clients/c0.key" \
    --server-key "$tmp/server/coordinator.pub" --state-dir "$tmp/state-$tag" > "$tmp/c0-$tag.log" 2>&1 &
  pids+=($!)
  timeout 180 "$py" "$src/examples/python/fedmoe_client.py" --connect "$ep" --id py0 --key "$tmp/clients/py0.key" \
    --server-key "$tmp/server/coordinator.pub" --pb-dir "$tmp" --train $([[ $tag == local ]] || echo --check-init) > "$tmp/py0-$tag.log" 2>&1 \
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
assert rows == [(c, r, "completed") for r in (1, 2, 3) for c in ("c0", "py0")]
py = db.execute("SELECT round, train_loss, test_accuracy FROM client_rounds WHERE client_id = 'py0' ORDER BY round").fetchall()
print("python client (round, train loss, test accuracy):", py)
assert py[2][1] < py[0][1], "its training loss did not fall"
assert py[2][2] > 0.5, "its test accuracy is not above 50%"
PY
  grep -q "shut down after 3 rounds" "$tmp/py0-$tag.log" || fail "$tag: the Python client did not hear the end of the run"
  if [[ $tag != local ]]; then
    grep -q "round 1's Task is the docs' draw, bit for bit" "$tmp/py0-$tag.log" || fail "$tag: no initial-state check"
    grep "initial state" "$tmp/py0-$tag.log"
  fi
}
run full --strategy full --seed 11
run fedavg --strategy fedavg --seed 12
run comigs-experts --strategy comigs --shared experts --seed 13
run comigs --strategy comigs --seed 14
run pfedmoap --strategy pfedmoap --seed 15
run local --strategy local --seed 16
run full-gating-shared --strategy full --gating shared --seed 17
rm -rf "$tmp"
echo "python client: trained 3 rounds of every strategy (and comigs --shared experts, full --gating shared) beside fedmoe-client"
