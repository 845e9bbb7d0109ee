#!/usr/bin/env bash
# The container path for real, as a user starts it: docker/sim.sh builds the
# image (and its base image where no registry answers) and runs a coordinator
# and 4 client containers for 3 rounds with CURVE keys made on first start; the
# history container then reads from the data volume 1 run, 3 rounds and 12
# client rows, and an intact database. Meanwhile the stack's browser view
# (the address sim.sh prints, with its token) answers the API with the run and
# its committed rounds, the page, and 401 without the token. A run stopped (SIGTERM) exits 130 with
# the stack stopped, and resumes when started again. The image runs `fedmoe-server --help`,
# as a non-root user, carries its version and commit, and reports the
# coordinator healthy. Bad set-ups end sim.sh with one clear line: no engine
# answering, the image missing, the port taken (the coordinator's or the view's), a config file with a bad value.
# (Faults: tests/docker_faults.sh.) Skipped (77) only when no Docker engine can
# be had (not root, or no dockerd: scripts/install-deps.sh installs Debian's
# docker.io).
#   tests/docker.sh SOURCE_DIR
set -uo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
name=docker
. "$src/tests/docker_lib.sh"

FEDMOE_PROJECT=$project "$src/docker/sim.sh" --clients 4 --rounds 3 > "$work/sim.out" 2>&1 &
sim=$!
# the coordinator's health and image, watched from its start (3 rounds may end
# in 20 s, before the first round's line is printed)
(
  for _ in $(seq 1 900); do
    c=$(dc ps -q coordinator 2>/dev/null)
    if [[ -n $c ]]; then
      [[ -s $work/image ]] || docker inspect -f '{{.Config.Image}}' "$c" > "$work/image" 2>/dev/null
      [[ $(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$c" 2>/dev/null) == healthy ]] &&
        { echo healthy > "$work/health"; exit 0; }
      # (a fast machine ends the 3 rounds before the engine's first probe, 10 s
      # in: the image's HEALTHCHECK command itself, run in the container, must
      # then say healthy)
      docker exec "$c" /usr/local/bin/fedmoe-entrypoint health > /dev/null 2>&1 &&
        { echo "healthy (the image's health command)" > "$work/health"; exit 0; }
    fi
    kill -0 $sim 2>/dev/null || exit 1
    sleep 1
  done
) &
watch=$!
# the view, once sim.sh printed its address: the API read with the token
# during the run (round 1 committed), refused without it
url=""
for _ in $(seq 1 900); do
  url=$(grep -oE 'http://localhost:[0-9]+/\?token=[0-9a-f]+' "$work/sim.out" | head -1)
  [[ -n $url ]] && break
  kill -0 $sim 2>/dev/null || break
  sleep 1
done
[[ -n $url ]] || fail "sim.sh printed no view address"
port=${url#http://localhost:}
/usr/bin/python3 "$src/tests/view_probe.py" "${port%%/*}" "${url##*token=}" 3 1 4 > "$work/view.out" 2>&1 &
probe=$!
wait_round 1 900
wait $probe || fail "the view during the run: $(cat "$work/view.out")"
wait $sim; rc=$?
[[ $rc -eq 0 ]] || fail "sim.sh exited with $rc"
wait $watch
[[ -s $work/health ]] || fail "the coordinator was never reported healthy"
image=$(cat "$work/image")
grep -q "rounds                     3 of 3" "$work/sim.out" || fail "the summary does not show 3 of 3 rounds"
grep -q "^database: volume ${project}_data" "$work/sim.out" || fail "sim.sh does not name the volume"
# the round log on the volume, read with the history container
[[ $(history_tool runs | grep -c '^run-') -eq 1 ]] || fail "not 1 run in the database: $(history_tool runs)"
history_tool export > "$work/rounds.csv" || fail "history could not read the volume"
[[ $(tail -n +2 "$work/rounds.csv" | cut -d, -f2 | tr '\n' ' ') == "1 2 3 " ]] || fail "rounds: $(cat "$work/rounds.csv")"
history_tool export --table clients > "$work/clients.csv"
[[ $(tail -n +2 "$work/clients.csv" | grep -c ',completed,') -eq 12 && $(wc -l < "$work/clients.csv") -eq 13 ]] ||
  fail "not 12 completed client rows: $(cat "$work/clients.csv")"
[[ $(tail -n +2 "$work/clients.csv" | cut -d, -f3 | sort -u | tr '\n' ' ') == "c000 c001 c002 c003 " ]] ||
  fail "client ids: $(cut -d, -f3 "$work/clients.csv" | sort -u | tr '\n' ' ')"
[[ $(history_tool check) == ok ]] || fail "integrity check: $(history_tool check)"
# after the run, the view started again as sim.sh says ("browse it:") serves all 3 rounds
grep -q "^browse it: .* up -d view" "$work/sim.out" || fail "sim.sh does not say how to browse the log after the run"
dc up -d view > "$work/view-up.out" 2>&1 || fail "the view did not start again: $(cat "$work/view-up.out")"
/usr/bin/python3 "$src/tests/view_probe.py" "${port%%/*}" "${url##*token=}" 3 3 4 > "$work/view.out" 2>&1 ||
  fail "the view after the run: $(cat "$work/view.out")"
dc stop view > /dev/null 2>&1

# the image itself
help=$(docker run --rm "$image" fedmoe-server --help)
[[ $help == "usage: fedmoe-server"* ]] || fail "fedmoe-server --help in $image"
[[ $(docker run --rm "$image" id -u) != 0 ]] || fail "the image runs as root"
[[ -n $(docker inspect -f '{{index .Config.Labels "org.opencontainers.image.revision"}}' "$image") ]] || fail "no commit label"

# stopped mid-run (SIGTERM, as Ctrl-C does in a terminal: a background job here
# ignores SIGINT), sim.sh stops the stack and exits 130; run again with the same
# settings, the run resumes and finishes: still 1 run, rounds 1-8 once each
# (8 rounds: the stop must come while it runs; without the view: --no-view)
projects+=("$project-stop")
FEDMOE_PROJECT=$project-stop "$src/docker/sim.sh" --image "$image" --clients 2 --rounds 8 --no-view > "$work/sim.out" 2>&1 &
sim=$!
wait_round 1 300
kill -TERM $sim
wait $sim; rc=$?
[[ $rc -eq 130 ]] && grep -q "sim.sh: stopping the stack" "$work/sim.out" || fail "stopped: rc $rc"
! grep -q "the run in a browser" "$work/sim.out" || fail "--no-view printed a view address"
[[ -z $(docker ps -q --filter "label=com.docker.compose.project=$project-stop") ]] || fail "containers still running after the stop"
p_dc() { "${compose[@]}" -p "$project-stop" -f "$src/docker/compose.yml" run --rm -T history "$@" 2>/dev/null; }
[[ $(p_dc runs | grep -c ' stopped ') -eq 1 ]] || fail "the run was not stopped mid-run: $(p_dc runs)"
FEDMOE_PROJECT=$project-stop "$src/docker/sim.sh" --image "$image" --clients 2 --rounds 8 --no-view > "$work/sim.out" 2>&1 ||
  fail "the resumed run: rc $?"
grep -q "rounds                     8 of 8" "$work/sim.out" || fail "the resumed run's summary does not show 8 of 8"
[[ $(p_dc runs | grep -c '^run-') -eq 1 ]] || fail "not 1 run after the resume: $(p_dc runs)"
[[ $(p_dc export | tail -n +2 | cut -d, -f2 | tr '\n' ' ') == "$(seq -s ' ' 1 8) " ]] || fail "rounds after the resume: $(p_dc export)"

# bad set-ups: one clear line each, exit 1
bad() {  # bad WHAT EXPECTED-LINE sim.sh-ARGS...
  local what=$1 want=$2; shift 2
  projects+=("$project-bad")
  FEDMOE_PROJECT=$project-bad timeout 300 "$src/docker/sim.sh" "$@" > "$work/bad.out" 2>&1
  local rc=$?
  [[ $rc -eq 1 ]] && grep -qF "$want" "$work/bad.out" || fail "$what: rc $rc, $(cat "$work/bad.out")"
}
DOCKER_HOST=unix:///nonexistent/docker.sock bad "no engine" \
  "engine: no Docker engine answers at DOCKER_HOST=unix:///nonexistent/docker.sock" --clients 2 --rounds 2
bad "the image missing" "sim.sh: image fedmoe/fedmoe:no-such-tag is not on this Docker engine" \
  --image fedmoe/fedmoe:no-such-tag --clients 2 --rounds 2
/usr/bin/python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); time.sleep(900)' 5597 &
holder=$!
helpers+=("$holder")
sleep 1
FEDMOE_PORT=5597 bad "a taken port" "sim.sh: the stack did not start: port 5597 of this machine is taken" \
  --image "$image" --clients 2 --rounds 2
FEDMOE_VIEW_PORT=5597 bad "the view's port taken" \
  "sim.sh: the stack did not start: port 5597 of this machine is taken (another one: FEDMOE_VIEW_PORT=N" \
  --image "$image" --clients 2 --rounds 2
kill $holder 2>/dev/null
printf 'rounds = 2\nfraction = 7\n' > "$work/bad.conf"
bad "a bad config value" "the coordinator failed 3 times; its last line: fedmoe-server: " \
  --image "$image" --clients 2 --rounds 2 --config "$work/bad.conf"
grep -q "fraction.*7" "$work/bad.out" || fail "the config error does not name the setting: $(cat "$work/bad.out")"
echo "docker: OK: 4 client containers x 3 rounds, 1 run, 3 rounds, 12 client rows, integrity ok; the view answered with the token only; stopped and resumed; healthy, non-root, labelled; no engine, a missing image, a taken port (coordinator's, view's) and a bad config value each end with one clear line"
