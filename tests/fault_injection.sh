#!/usr/bin/env bash
# Fault injection: a federated run while clients are killed and stalled, the
# coordinator is killed (SIGKILL) and stopped (SIGTERM) and restarted, and a
# hostile peer sends bad messages. Prints a Markdown table of what was injected
# and what the round log holds at the end. Exits non-zero if a round was lost or
# duplicated, the database is damaged, or the daemon crashed.
#   tests/fault_injection.sh [ROUNDS=12] [CLIENTS=6] [BUILD=build] [SEED=1]
set -uo pipefail
rounds=${1:-12}
clients=${2:-6}
build=${3:-build}
seed=${4:-1}
RANDOM=$seed
work=$(mktemp -d /tmp/fedmoe-faults-XXXXXX)
port=$((30000 + RANDOM % 20000))
ep="tcp://127.0.0.1:$port"
db="$work/fi.db"
# real CURVE keys: the coordinator's pair, one per client and one for the hostile
# peer (an authenticated client that misbehaves), all in the allow-list
ids=(); for ((i = 0; i < clients; i++)); do ids+=("c$i"); done
"$build/server/fedmoe-keygen" --out "$work/keys" coordinator > /dev/null
"$build/server/fedmoe-keygen" --out "$work/keys/clients" "${ids[@]}" badpeer > /dev/null
server_args=(--bind "$ep" --db "$db" --rounds "$rounds" --min-clients $((clients - 2)) --partitions "$clients"
             --client-timeout 5 --round-timeout 40 --seed "$seed"
             --key "$work/keys/coordinator.key" --allow "$work/keys/clients")
start_server() { "$build/server/fedmoe-server" "${server_args[@]}" >> "$work/server.log" 2>&1 & server=$!; }
start_client() {
  "$build/client/fedmoe-client" --connect "$ep" --key "$work/keys/clients/c$1.key" \
      --server-key "$work/keys/coordinator.pub" --partition "$1/$clients" --state-dir "$work" \
      >> "$work/client$1.log" 2>&1 &
  cpid[$1]=$!
}
committed() { "$build/server/fedmoe-history" --db "$db" export 2>/dev/null | tail -n +2 | wc -l; }

declare -a cpid
start_server
for ((i = 0; i < clients; i++)); do start_client $i; done
k_client=0 k_stall=0 k_coord=0 k_term=0 crashes=0 bad_sent=0 bad_err=0 events=0
deadline=$((SECONDS + 900))
while ((SECONDS < deadline)); do
  sleep $((2 + RANDOM % 3))
  if ! kill -0 "$server" 2>/dev/null; then
    wait "$server"; st=$?
    if ((st == 0)) && (($(committed) >= rounds)); then break; fi
    ((st != 0)) && crashes=$((crashes + 1))
    start_server
    continue
  fi
  (($(committed) >= rounds)) && continue
  events=$((events + 1))
  case $((RANDOM % 6)) in
    0|1) i=$((RANDOM % clients)); kill -9 "${cpid[$i]}" 2>/dev/null; wait "${cpid[$i]}" 2>/dev/null
         k_client=$((k_client + 1)); sleep $((1 + RANDOM % 2)); start_client $i ;;
    2) i=$((RANDOM % clients)); kill -STOP "${cpid[$i]}" 2>/dev/null; sleep 7; kill -CONT "${cpid[$i]}" 2>/dev/null
       k_stall=$((k_stall + 1)) ;;
    3) kill -9 "$server"; wait "$server" 2>/dev/null; k_coord=$((k_coord + 1)); start_server ;;
    4) if ((k_term == 0)); then kill -TERM "$server"; wait "$server"; st=$?
         ((st != 0)) && crashes=$((crashes + 1)); k_term=1; start_server
         for ((i = 0; i < clients; i++)); do   # told to stop, they left: start them again
           kill -0 "${cpid[$i]}" 2>/dev/null || { wait "${cpid[$i]}" 2>/dev/null; start_client $i; }
         done
       else
         out=$("$build/tests/badpeer" "$ep" 10 $RANDOM "$work/keys/clients/badpeer.key" "$work/keys/coordinator.pub")
         for kv in ${out#badpeer:}; do v=${kv#*=}; bad_sent=$((bad_sent + ${v%/*})); bad_err=$((bad_err + ${v#*/})); done
       fi ;;
    5) out=$("$build/tests/badpeer" "$ep" 10 $RANDOM "$work/keys/clients/badpeer.key" "$work/keys/coordinator.pub")
       for kv in ${out#badpeer:}; do v=${kv#*=}; bad_sent=$((bad_sent + ${v%/*})); bad_err=$((bad_err + ${v#*/})); done ;;
  esac
done
kill -0 "$server" 2>/dev/null && { wait "$server" || crashes=$((crashes + 1)); }
for ((i = 0; i < clients; i++)); do wait "${cpid[$i]}" 2>/dev/null; done
csv=$("$build/server/fedmoe-history" --db "$db" export)
done_rounds=$(tail -n +2 <<<"$csv" | wc -l)
distinct=$(tail -n +2 <<<"$csv" | cut -d, -f2 | sort -un | wc -l)
expected=$(seq 1 "$rounds" | paste -sd, -)
got=$(tail -n +2 <<<"$csv" | cut -d, -f2 | sort -n | paste -sd, -)
lost=$((rounds - distinct)); dup=$((done_rounds - distinct))
integrity=$(python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])" "$db")
runs=$("$build/server/fedmoe-history" --db "$db" runs | tail -n +2 | wc -l)
status=$("$build/server/fedmoe-history" --db "$db" runs | tail -n 1 | awk '{print $3}')
cat <<EOT
| what | count |
|------|------:|
| rounds planned / committed | $rounds / $done_rounds |
| clients | $clients |
| fault events | $events |
| client SIGKILL, restarted | $k_client |
| client stalled past the client timeout (SIGSTOP 7 s, SIGCONT) | $k_stall |
| coordinator SIGKILL, restarted | $k_coord |
| coordinator SIGTERM, restarted | $k_term |
| bad messages sent / Error replies received (oversized ones get none) | $bad_sent / $bad_err |
| runs in the database (must be 1) | $runs ($status) |
| rounds lost | $lost |
| rounds duplicated | $dup |
| PRAGMA integrity_check | $integrity |
| daemon crashes (unexpected exits) | $crashes |
EOT
if [[ "$got" != "$expected" || $lost -ne 0 || $dup -ne 0 || "$integrity" != "ok" || $crashes -ne 0 || $runs -ne 1 ]]; then
  echo "fault_injection: FAILED (logs in $work)"; exit 1
fi
rm -rf "$work"
