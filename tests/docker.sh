#!/usr/bin/env bash
# The container path for real: docker/sim.sh builds the image (and its base
# image where no registry answers), starts a coordinator and 3 client
# containers with CURVE keys made on first start; after the first round one
# client container is killed (restarted by its policy, it keeps its id) and
# another loses its network for 5 s; after the second the coordinator container
# is killed (restarted, it resumes from its database on the volume); the run
# finishes with every round exactly once. A taken port and a setting out of
# range each stop docker/sim.sh with one clear line. Also checked: the image runs
# `fedmoe-server --help`, as a non-root user, carries its version and commit,
# and reports the coordinator healthy; the history tool reads the round log
# from the volume. Skipped (77) only when no Docker engine can be had (not
# root, or no dockerd: scripts/install-deps.sh installs Debian's docker.io).
#   tests/docker.sh SOURCE_DIR
set -uo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
if ! "$src/docker/engine.sh"; then
  echo "docker: SKIPPED: no Docker engine" >&2
  exit 77
fi
project=fedmoe-test-$$
work=$(mktemp -d /tmp/fedmoe-test-docker-XXXXXX)
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
dc() { "${compose[@]}" -p "$project" -f "$src/docker/compose.yml" "$@"; }
fail() {
  echo "docker: FAILED: $*" >&2
  echo "--- sim.sh output:" >&2; cat "$work/sim.out" >&2 2>/dev/null
  for c in $(docker ps -aq --filter "label=com.docker.compose.project=$project"); do
    echo "--- logs of $(docker inspect -f '{{.Name}}' "$c"):" >&2; docker logs --tail 15 "$c" >&2 2>&1
  done
  dc down -v --remove-orphans >/dev/null 2>&1
  exit 1
}
trap 'dc down -v --remove-orphans >/dev/null 2>&1; rm -rf "$work"' EXIT
trap "exit 143" TERM INT  # (so that the EXIT cleanup runs)
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

FEDMOE_PROJECT=$project "$src/docker/sim.sh" --clients 3 --rounds 4 > "$work/sim.out" 2>&1 &
sim=$!
# after round 1: one client container killed (SIGKILL), the coordinator's health seen
for _ in $(seq 1 900); do grep -q '^    1 ' "$work/sim.out" && break; kill -0 $sim 2>/dev/null || break; sleep 1; done
grep -q '^    1 ' "$work/sim.out" || fail "no round 1 within 15 minutes"
victim=$(dc ps -q client | head -1)
[[ -n $victim ]] || fail "no client container"
victim_id=$(docker exec "$victim" sh -c 'for f in /slots/c*.owner; do [ "$(cat "$f")" = "$(hostname)" ] && basename "$f" .owner; done')
[[ -n $victim_id ]] || fail "the client container has no slot"
# a crash, not `docker kill` (which Docker takes as a manual stop and does not restart)
kill -9 "$(docker inspect -f '{{.State.Pid}}' "$victim")" || fail "could not kill a client container"
# another client loses the network for 5 s
other=$(dc ps -q client | sed -n 2p)
network=${project}_default
docker network disconnect "$network" "$other" || fail "could not disconnect a client container"
sleep 5
docker network connect "$network" "$other" || fail "could not reconnect a client container"
coord=$(dc ps -q coordinator)
image=$(docker inspect -f '{{.Config.Image}}' "$coord")
health=""
for _ in $(seq 1 40); do
  health=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$coord" 2>/dev/null)
  [[ $health == healthy ]] && break
  sleep 1
done
restarts=$(restarted "$victim")
[[ $restarts -ge 1 ]] || fail "the killed client container was not restarted"
# after round 2 the coordinator crashes (SIGKILL): restarted by its policy, it
# resumes the run from its database on the volume
for _ in $(seq 1 600); do grep -q '^    2 ' "$work/sim.out" && break; kill -0 $sim 2>/dev/null || break; sleep 1; done
grep -q '^    2 ' "$work/sim.out" || fail "no round 2"
kill -9 "$(docker inspect -f '{{.State.Pid}}' "$coord")" || fail "could not kill the coordinator container"
[[ $(restarted "$coord") -ge 1 ]] || fail "the killed coordinator container was not restarted"
wait $sim; rc=$?
[[ $rc -eq 0 ]] || fail "sim.sh exited with $rc"
[[ $health == healthy ]] || fail "the coordinator was never reported healthy (last: '$health')"
grep -q "rounds                     4 of 4" "$work/sim.out" || fail "the summary does not show 4 of 4 rounds"
[[ $(grep -cE '^ +[1-4] +3/3 ' "$work/sim.out") -ge 3 ]] || fail "fewer than 3 rounds with all 3 clients"
# every round exactly once, in the round log on the volume
dc run --rm -T history export > "$work/rounds.csv" 2>/dev/null || fail "history could not read the volume"
col=$(head -1 "$work/rounds.csv" | tr ',' '\n' | grep -nx round | cut -d: -f1)
rounds=$(tail -n +2 "$work/rounds.csv" | cut -d, -f"${col:-0}" | tr '\n' ' ')
[[ $(echo "$rounds" | tr ' ' '\n' | sed '/^$/d' | sort -n | uniq | tr '\n' ' ') == "1 2 3 4 " ]] || fail "rounds in the log: $rounds"
[[ $(tail -n +2 "$work/rounds.csv" | wc -l) -eq 4 ]] || fail "a round logged twice"
# the killed container came back with its id: its client has a row in the last round
dc run --rm -T history clients 4 > "$work/clients.txt" 2>/dev/null
grep -q "$victim_id .*completed" "$work/clients.txt" || fail "client $victim_id (killed, restarts: $restarts) did not complete round 4"
# the image itself
help=$(docker run --rm "$image" fedmoe-server --help)
[[ $help == "usage: fedmoe-server"* ]] || fail "fedmoe-server --help in $image"
[[ $(docker run --rm "$image" id -u) != 0 ]] || fail "the image runs as root"
[[ -n $(docker inspect -f '{{index .Config.Labels "org.opencontainers.image.revision"}}' "$image") ]] || fail "no commit label"
# bad set-ups end with one clear line: a port taken, a setting out of range
/usr/bin/python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); time.sleep(60)' 5597 &
holder=$!
sleep 1
FEDMOE_PROJECT=$project-bad FEDMOE_PORT=5597 "$src/docker/sim.sh" --clients 2 --rounds 2 > "$work/bad.out" 2>&1
rc=$?
kill $holder 2>/dev/null
[[ $rc -eq 1 ]] && grep -q "sim.sh: the stack did not start: port 5597 of this machine is taken" "$work/bad.out" ||
  fail "a taken port: rc $rc, $(tail -1 "$work/bad.out")"
FEDMOE_PROJECT=$project-bad timeout 300 "$src/docker/sim.sh" --clients 2 --rounds 2 -- --fraction 7 > "$work/bad.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -q "the coordinator failed 3 times; its last line: fedmoe-server: --fraction: 7 is out of range" \
  "$work/bad.out" || fail "a bad setting: rc $rc, $(tail -1 "$work/bad.out")"
"${compose[@]}" -p "$project-bad" -f "$src/docker/compose.yml" down -v >/dev/null 2>&1
echo "docker: OK: 4 rounds exactly once; client $victim_id killed after round 1 and back (restarts $restarts); coordinator killed after round 2 and resumed; healthy; a taken port and a bad setting each end with one clear line"
