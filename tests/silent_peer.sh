#!/usr/bin/env bash
# A silently dead peer: a client whose machine is cut off without closing its
# connection (no FIN, no RST, no answer at all) has its connection closed by
# the coordinator, which sends no ZMTP heartbeats (docs/reliability.md), while
# the other clients finish the run. Real programs, CURVE keys and TCP, in a
# network namespace of its own (unshare -n, root): there a firewall rule makes
# the victim's packets vanish both ways and the victim is stopped (SIGSTOP), as
# when its machine loses power. Exits 77 (skipped) without namespaces.
#   tests/silent_peer.sh BUILD
set -uo pipefail
build=$(cd "${1:?build folder}" && pwd)
if [ -z "${FM_SILENT_PEER_NS:-}" ]; then
  for t in unshare iptables ss ip; do
    command -v "$t" >/dev/null || { echo "silent_peer: skipped, no $t (scripts/install-deps.sh installs it)"; exit 77; }
  done
  unshare -n true 2>/dev/null || { echo "silent_peer: skipped, cannot make a network namespace (needs root)"; exit 77; }
  FM_SILENT_PEER_NS=1 exec unshare -n "$0" "$@"
fi
ip link set lo up
work=$(mktemp -d /tmp/fedmoe-silent-XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
fail() { echo "silent_peer: FAIL: $*"; tail -n 20 "$work/server.log"; exit 1; }
port=5555 victim=2
"$build/server/fedmoe-keygen" --out "$work/keys" coordinator >/dev/null
"$build/server/fedmoe-keygen" --out "$work/keys/clients" c0 c1 c2 >/dev/null
# client timeout 3 s: a connection silent for max(2 x 3 s, 10 s) = 10 s is closed
"$build/server/fedmoe-server" --bind "tcp://127.0.0.1:$port" --db "$work/s.db" --rounds 1000 --min-clients 2 \
  --partitions 3 --client-timeout 3 --round-timeout 60 --key "$work/keys/coordinator.key" \
  --allow "$work/keys/clients" > "$work/server.log" 2>&1 &
server=$!
declare -a pid
for i in 0 1 2; do
  "$build/client/fedmoe-client" --connect "tcp://127.0.0.1:$port" --key "$work/keys/clients/c$i.key" \
    --server-key "$work/keys/coordinator.pub" --partition "$i/3" > "$work/client$i.log" 2>&1 &
  pid[$i]=$!
done
committed() { "$build/server/fedmoe-history" --db "$work/s.db" export 2>/dev/null | tail -n +2 | wc -l; }
for ((t = 0; t < 120; t++)); do (($(committed) >= 1)) && break; sleep 0.5; done
(($(committed) >= 1)) || fail "no round committed with all three clients in 60 s"
# the victim's end of its connection: the local port of its socket to the coordinator
vport=$(ss -tnpH state established "( dport = :$port )" | grep "pid=${pid[$victim]}," | awk '{print $3}' | sed 's/.*://' | head -1)
[ -n "$vport" ] || fail "no connection of the victim found"
held() { ss -tnpH "( sport = :$port and dport = :$vport )" | grep -c "pid=$server,"; }
(($(held) == 1)) || fail "the coordinator holds no connection from port $vport"
iptables -A INPUT -p tcp --sport "$vport" -j DROP
iptables -A INPUT -p tcp --dport "$vport" -j DROP
kill -STOP "${pid[$victim]}"
cut_at=$SECONDS
for ((t = 0; t < 80 && $(held) > 0; t++)); do sleep 0.5; done
took=$((SECONDS - cut_at))
kill -0 "$server" 2>/dev/null || fail "the coordinator is gone"
(($(held) == 0)) || fail "the coordinator still holds the dead peer's connection after $took s"
((took >= 8)) || fail "the connection was closed after $took s, before its 10 s of silence"
grep -q "closed: nothing received for" "$work/server.log" || fail "the coordinator did not say why it closed it"
echo "silent_peer: the dead peer's connection closed after $took s"
# the live clients go on; nothing else is cut; the coordinator stops cleanly
before=$(committed)
for ((t = 0; t < 120 && $(committed) < before + 2; t++)); do sleep 0.5; done
(($(committed) >= before + 2)) || fail "no two rounds committed after the cut in 60 s"
kill -TERM "$server"; wait "$server"; rc=$?
((rc == 0)) || fail "the coordinator exited with $rc"
n=$(grep -c "closed: nothing received for" "$work/server.log")
((n == 1)) || fail "$n connections closed for silence; only the victim's was silent"
echo "silent_peer: ok: the dead peer's connection closed after $took s; $(committed) rounds by the live clients"
