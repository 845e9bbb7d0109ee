#!/usr/bin/env bash
# The many-machines path on one machine: docker/compose.yml deployed as a
# Docker Swarm stack (docker stack deploy) on a one-node swarm (made here and
# left again when there was none). The kernel here has no IPVS, so the stack
# must work without the routing mesh: the coordinator is reached by name
# (endpoint_mode dnsrr) and publishes its port in host mode. 4 client replicas
# take their ids from their task slots (c000..c003); the run of 3 rounds
# finishes, every round once with all 4, read from the stack's data volume; the
# view service (host port, dnsrr) serves it with the token. Skipped (77) only when
# no Docker engine can be had.
#   tests/swarm.sh SOURCE_DIR
set -uo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
"$src/docker/engine.sh" || { echo "swarm: SKIPPED: no Docker engine" >&2; exit 77; }
image=$("$src/docker/image.sh") || { echo "swarm: FAILED: no image" >&2; exit 1; }
stack=fedmoe-swarm-$$
work=$(mktemp -d /tmp/fedmoe-test-swarm-XXXXXX)
made=0
cleanup() {
  docker stack rm "$stack" >/dev/null 2>&1
  for _ in $(seq 1 60); do
    [[ -z $(docker ps -aq --filter "label=com.docker.stack.namespace=$stack") ]] && break
    sleep 1
  done
  docker volume ls -q --filter "name=${stack}_" | xargs -r docker volume rm -f >/dev/null 2>&1
  ((made)) && docker swarm leave --force >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 143" TERM INT  # (so that the EXIT cleanup runs)
fail() {
  echo "swarm: FAILED: $*" >&2
  cat "$work/follow.out" >&2 2>/dev/null
  docker stack ps --no-trunc "$stack" >&2 2>/dev/null | head -20
  for s in coordinator client keys view; do
    echo "--- logs of ${stack}_$s:" >&2; docker service logs --tail 10 "${stack}_$s" >&2 2>&1
  done
  exit 1
}
if [[ $(docker info -f '{{.Swarm.LocalNodeState}}') != active ]]; then
  docker swarm init --advertise-addr 127.0.0.1 >/dev/null || fail "docker swarm init"
  made=1
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port) vport=$(free_port)
after=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
FEDMOE_IMAGE=$image FEDMOE_CLIENTS=4 FEDMOE_ROUNDS=3 FEDMOE_PORT=$port FEDMOE_VIEW_PORT=$vport \
  docker stack deploy -c "$src/docker/compose.yml" "$stack" >"$work/deploy.out" 2>&1 || fail "stack deploy: $(cat "$work/deploy.out")"
[[ $(docker service inspect -f '{{.Spec.EndpointSpec.Mode}}' "${stack}_coordinator") == dnsrr ]] || fail "the coordinator is not dnsrr"
# the round log, from the stack's volume (once its coordinator task made it), as fedmoe-sim shows it
for _ in $(seq 1 300); do docker volume inspect "${stack}_data" >/dev/null 2>&1 && break; sleep 1; done
docker volume inspect "${stack}_data" >/dev/null 2>&1 || fail "the stack made no data volume in 5 minutes"
timeout 900 docker run --rm -v "${stack}_data:/data" "$image" fedmoe-history --db /data/fedmoe.db follow --after "$after" \
  >"$work/follow.out" 2>&1 &
follow=$!
# meanwhile the coordinator's port answers on the host (host mode, no routing mesh)
open=0
for _ in $(seq 1 120); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then open=1; break; fi
  kill -0 $follow 2>/dev/null || break
  sleep 1
done
wait $follow; rc=$?
[[ $rc -eq 0 ]] || fail "the run did not finish (follow exited $rc)"
((open)) || fail "port $port was never open on the host"
grep -q "rounds                     3 of 3" "$work/follow.out" || fail "not 3 of 3 rounds"
[[ $(grep -cE '^ +[1-3] +4/4 ' "$work/follow.out") -eq 3 ]] || fail "not 3 rounds with 4 clients each"
for id in c000 c001 c002 c003; do
  grep -q "^  $id .*completed" "$work/follow.out" || fail "client $id (from its task slot) missing"
done
# the view service (host port, dnsrr) serves the finished run with the token from its volume
token=$(docker run --rm -v "${stack}_view-token:/keys/view" "$image" token) || fail "no view token in the stack's volume"
python3 "$src/tests/view_probe.py" "$vport" "$token" 3 3 4 > "$work/view.out" 2>&1 || fail "the view: $(cat "$work/view.out")"
echo "swarm: OK: stack $stack on a one-node swarm, 3 rounds with c000-c003 (task slots), coordinator dnsrr on host port $port; $(cat "$work/view.out")"
