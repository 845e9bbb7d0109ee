# Shared by tests/docker.sh and tests/docker_faults.sh (sourced): a compose
# project of its own for the test, its cleanup, and failure with the logs.
# Before sourcing: src (the source tree) and name (the test's name).
if ! "$src/docker/engine.sh"; then
  echo "$name: SKIPPED: no Docker engine" >&2
  exit 77
fi
project=fedmoe-test-$name-$$
work=$(mktemp -d "/tmp/fedmoe-test-$name-XXXXXX")
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
dc() { "${compose[@]}" -p "$project" -f "$src/docker/compose.yml" "$@"; }
projects=("$project")  # every project the test made: removed with their volumes at the end
helpers=()  # processes of the test's own (killed at the end)
cleanup() {
  ((${#helpers[@]})) && kill "${helpers[@]}" 2>/dev/null
  for p in "${projects[@]}"; do
    "${compose[@]}" -p "$p" -f "$src/docker/compose.yml" down -v --remove-orphans >/dev/null 2>&1
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap "exit 143" TERM INT  # (so that the EXIT cleanup runs)
fail() {
  echo "$name: FAILED: $*" >&2
  echo "--- sim.sh output:" >&2; cat "$work/sim.out" >&2 2>/dev/null
  [[ -s $work/clients.csv ]] && { echo "--- client rows:" >&2; cat "$work/clients.csv" >&2; }
  if [[ -s $work/stack.log ]]; then
    echo "--- the stack's log (from keep_logs), its last 150 lines:" >&2; tail -n 150 "$work/stack.log" >&2
  else
    for c in $(docker ps -aq --filter "label=com.docker.compose.project=$project"); do
      echo "--- logs of $(docker inspect -f '{{.Name}}' "$c"):" >&2; docker logs --tail 15 "$c" >&2 2>&1
    done
  fi
  exit 1
}
# Keeps every container's log of the project in $work/stack.log (sim.sh removes
# the containers at its end): call once the stack is up.
keep_logs() { dc logs -f --no-color -t > "$work/stack.log" 2>&1 & }
# Waits (at most $2 s) for round $1's line in sim.sh's output while sim.sh ($sim) runs.
wait_round() {
  for _ in $(seq 1 "$2"); do
    grep -qE "^ +$1 " "$work/sim.out" && return 0
    kill -0 "$sim" 2>/dev/null || break
    sleep 1
  done
  fail "no round $1 within $2 s"
}
# The history tool on the project's data volume: history ARGS...
history_tool() { dc run --rm -T history "$@" 2>/dev/null; }
# The client id a client container claimed (its slot).
client_id_of() {
  docker exec "$1" sh -c 'for f in /slots/c*.owner; do [ "$(cat "$f")" = "$(hostname)" ] && basename "$f" .owner; done'
}
# A round's client rows as "client status" lines (history export, CSV).
client_rows() {
  history_tool export --table clients > "$work/clients.csv" || fail "history could not read the volume"
  awk -F, -v r="$1" 'NR > 1 && $2 == r { print $3, $4 }' "$work/clients.csv"
}
