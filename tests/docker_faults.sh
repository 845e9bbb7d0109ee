#!/usr/bin/env bash
# Faults in the container stack (docker/sim.sh, 4 client containers, quorum 2,
# --client-timeout 5, 4 local epochs, 7 rounds):
#  round 2: one client container stopped with `docker kill` (dropped; the round
#           completes with the others) and another crashed (SIGKILL to its
#           init: Docker restarts it, with the same id); the killed one is
#           started again after round 2 and rejoins a later round;
#  round 3: a client container cut off the network (`docker network
#           disconnect`) for 9 s, past the client timeout, then reconnected:
#           dropped, then back;
#  after round 3 the coordinator container is restarted (`docker restart`:
#           SIGTERM, the clients wait), after round 4 killed (`docker kill`)
#           and started (`docker start`): each time it resumes from its
#           database on the volume.
# The run finishes: every round exactly once, no client twice in a round,
# both gone clients back, all 4 in the last round, and the database intact.
# Skipped (77) only when no Docker engine can be had.
#   tests/docker_faults.sh SOURCE_DIR
set -uo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
name=docker-faults
. "$src/tests/docker_lib.sh"
# How often Docker has restarted a container, once it has at least once (30 s at most).
restarted() {
  local n=0
  for _ in $(seq 1 30); do
    n=$(docker inspect -f '{{.RestartCount}}' "$1" 2>/dev/null || echo 0)
    [[ $n -ge 1 ]] && break
    sleep 1
  done
  echo "$n"
}

FEDMOE_PROJECT=$project FEDMOE_MIN_CLIENTS=2 "$src/docker/sim.sh" --clients 4 --rounds 7 -- --client-timeout 5 --local-epochs 4 \
  > "$work/sim.out" 2>&1 &
sim=$!
# the containers and their ids, known before round 1 ends (so that round 2 is hit early)
for _ in $(seq 1 900); do
  mapfile -t cs < <(dc ps -q client 2>/dev/null)
  [[ ${#cs[@]} -eq 4 ]] && break
  kill -0 $sim 2>/dev/null || break
  sleep 1
done
[[ ${#cs[@]} -eq 4 ]] || fail "not 4 client containers: ${cs[*]}"
keep_logs
killed=${cs[0]} crashed=${cs[1]} cut=${cs[2]}
for _ in $(seq 1 60); do
  killed_id=$(client_id_of "$killed") crashed_id=$(client_id_of "$crashed") cut_id=$(client_id_of "$cut")
  [[ -n $killed_id && -n $crashed_id && -n $cut_id ]] && break
  sleep 1
done
[[ -n $killed_id && -n $crashed_id && -n $cut_id ]] || fail "client containers without a slot"
crashed_pid=$(docker inspect -f '{{.State.Pid}}' "$crashed")
wait_round 1 900
# round 2 is open: one client stopped, another crashes
docker kill "$killed" >/dev/null || fail "docker kill of a client container"
kill -9 "$crashed_pid" || fail "could not crash a client container"
[[ $(restarted "$crashed") -ge 1 ]] || fail "the crashed client container was not restarted"
wait_round 2 300
docker start "$killed" >/dev/null || fail "docker start of the killed client container"
# round 3: one client cut off past the client timeout
network=${project}_default
docker network disconnect "$network" "$cut" || fail "docker network disconnect"
sleep 9
docker network connect "$network" "$cut" || fail "docker network connect"
wait_round 3 300
coord=$(dc ps -q coordinator)
docker restart "$coord" >/dev/null || fail "docker restart of the coordinator"
wait_round 4 300
docker kill "$coord" >/dev/null || fail "docker kill of the coordinator"
sleep 2
docker start "$coord" >/dev/null || fail "docker start of the coordinator"
wait $sim; rc=$?
[[ $rc -eq 0 ]] || fail "sim.sh exited with $rc"
grep -q "rounds                     7 of 7" "$work/sim.out" || fail "the summary does not show 6 of 6 rounds"
# the round log on the volume: every round once, no client twice in a round
[[ $(history_tool runs | grep -c '^run-') -eq 1 ]] || fail "not 1 run: $(history_tool runs)"
history_tool export > "$work/rounds.csv" || fail "history could not read the volume"
[[ $(tail -n +2 "$work/rounds.csv" | cut -d, -f2 | tr '\n' ' ') == "1 2 3 4 5 6 7 " ]] ||
  fail "rounds: $(cut -d, -f2 "$work/rounds.csv" | tr '\n' ' ')"
client_rows 1 > /dev/null
dups=$(tail -n +2 "$work/clients.csv" | cut -d, -f2,3 | sort | uniq -d)
[[ -z $dups ]] || fail "a client twice in a round: $dups"
[[ $(client_rows 2 | grep -c ' completed') -ge 2 ]] || fail "round 2 without its quorum: $(client_rows 2)"
grep -q "client $killed_id silent for .* taken as gone" "$work/stack.log" || fail "the killed client $killed_id was not dropped"
# back: the killed and the cut-off client complete a later round; all 4 the last
back=$(awk -F, -v id="$killed_id" 'NR > 1 && $3 == id && $2 >= 3 && $4 == "completed"' "$work/clients.csv" | wc -l)
[[ $back -ge 1 ]] || fail "the killed client $killed_id did not rejoin: $(grep ",$killed_id," "$work/clients.csv")"
# (dropped, it may still finish round 3 if it is back before the round ends)
grep -q "client $cut_id silent for .* taken as gone" "$work/stack.log" || fail "the cut-off client $cut_id was not dropped"
grep -q "client $cut_id is back\|client $cut_id said hello again" "$work/stack.log" || fail "the cut-off client $cut_id did not come back"
back=$(awk -F, -v id="$cut_id" 'NR > 1 && $3 == id && $2 >= 3 && $4 == "completed"' "$work/clients.csv" | wc -l)
[[ $back -ge 1 ]] || fail "the cut-off client $cut_id did not rejoin: $(grep ",$cut_id," "$work/clients.csv")"
[[ $(client_rows 7 | grep -c ' completed') -eq 4 ]] || fail "not all 4 clients in round 7: $(client_rows 7)"
[[ $(history_tool check) == ok ]] || fail "integrity check: $(history_tool check)"
grep -q "stopping: run .* left resumable" "$work/stack.log" || fail "the coordinator did not stop cleanly on docker restart"
grep -q "waiting for it" "$work/stack.log" || fail "no client waited for the restarted coordinator"
echo "docker_faults: OK: 7 rounds exactly once; $killed_id (docker kill) dropped and back, $crashed_id crashed and restarted, $cut_id cut off 9 s, dropped and back; coordinator restarted and killed, resumed both times; integrity ok"
