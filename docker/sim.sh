#!/usr/bin/env bash
# The main job in containers: a coordinator and N clients of the fedmoe image,
# CURVE keys made on first start, one line per committed round and the summary
# (the same as fedmoe-sim's), the round log left on the stack's data volume;
# meanwhile the run in a browser (the view's address, with its token, is printed).
#   docker/sim.sh [--clients N] [--rounds R] [--strategy S] [--config FILE]
#                 [--image TAG | --build] [--no-view] [-- FEDMOE-SERVER FLAGS...]
#   --config FILE   an INI file of fedmoe-server options (fedmoe-server --help)
#   --no-view       no browser view (its port, FEDMOE_VIEW_PORT, default 8080, unused)
#   --image TAG     run this image, never build (default: the image of this
#                   commit, built when missing, with its base image made from
#                   Debian's archive where no registry answers)
# A coordinator restarted mid-run is waited for. Ctrl-C stops the stack
# cleanly; run it again with the same settings and the run resumes.
# Environment: FEDMOE_PROJECT (stack name, default fedmoe), FEDMOE_PORT (5555),
# FEDMOE_VIEW_PORT (8080).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
clients=4 rounds=10 strategy="" build=0 image="" config="" view=1 extra=()
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --clients) clients=${2:?--clients needs a number}; shift 2 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --strategy) strategy=${2:?--strategy needs a name}; shift 2 ;;
    --config) config=${2:?--config needs a file}; shift 2 ;;
    --image) image=${2:?--image needs a tag}; shift 2 ;;
    --build) build=1; shift ;;
    --no-view) view=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "sim.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $clients =~ ^[1-9][0-9]*$ && $rounds =~ ^[1-9][0-9]*$ ]] || { echo "sim.sh: --clients and --rounds take positive numbers" >&2; exit 2; }
if [[ -n $config ]]; then
  [[ -f $config && -r $config ]] || { echo "sim.sh: --config $config: no such readable file" >&2; exit 2; }
  config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
fi
[[ -n $image && $build -eq 1 ]] && { echo "sim.sh: --image and --build exclude each other" >&2; exit 2; }

if docker compose version >/dev/null 2>&1; then compose=(docker compose); 
elif command -v docker-compose >/dev/null; then compose=(docker-compose);
else echo "sim.sh: no docker compose (scripts/install-deps.sh installs docker-compose)" >&2; exit 1; fi
project=${FEDMOE_PROJECT:-fedmoe}
dc() { "${compose[@]}" -p "$project" -f "$here/compose.yml" "$@"; }

"$here/engine.sh" || { echo "sim.sh: no Docker engine (see the line above)" >&2; exit 1; }
if [[ -n $image ]]; then
  docker image inspect "$image" >/dev/null 2>&1 ||
    { echo "sim.sh: image $image is not on this Docker engine (docker/image.sh builds fedmoe's; or drop --image)" >&2; exit 1; }
else
  flags=()
  ((build)) && flags=(--build)
  image=$("$here/image.sh" "${flags[@]}") || { echo "sim.sh: the image could not be built (see above)" >&2; exit 1; }
fi
export FEDMOE_IMAGE=$image FEDMOE_CLIENTS=$clients FEDMOE_ROUNDS=$rounds FEDMOE_STRATEGY=$strategy
export FEDMOE_SERVER_ARGS="${extra[*]:-}" FEDMOE_CONFIG=$config
dc down --remove-orphans >/dev/null 2>&1 || true
docker volume rm -f "${project}_slots" >/dev/null  # client ids are claimed anew
err=$(mktemp)
trap 'rm -f "$err"' EXIT
# one clear line when the stack cannot start (a port taken, a volume refused ...)
fail_start() {
  local why
  why=$(grep -m1 -iE 'cannot|bind|already|denied|no such|not found|invalid' "$err" || grep -iE 'error' "$err" | tail -1)
  if grep -qiE 'address already in use|port is already allocated' "$err"; then
    local port var=FEDMOE_PORT
    port=$(grep -oE '0\.0\.0\.0:[0-9]+' "$err" | head -1 | cut -d: -f2)
    [[ $port == "${FEDMOE_VIEW_PORT:-8080}" ]] && var=FEDMOE_VIEW_PORT
    why="port ${port:-${FEDMOE_PORT:-5555}} of this machine is taken (another one: $var=N docker/sim.sh ...)"
  fi
  echo "sim.sh: $1: ${why#ERROR: }" >&2
  dc down --remove-orphans >/dev/null 2>&1 || true
  exit 1
}
dc run --rm keys 2>"$err" || fail_start "the keys could not be made"
token=""
((view)) && { token=$(dc run --rm -T view token 2>"$err") || fail_start "the view's token could not be read"; }
stopped=0
stop() { stopped=1; echo; echo "sim.sh: stopping the stack"; dc stop -t 30 >/dev/null 2>&1 || true; }
trap stop INT TERM
# (follow takes a run that ends before it first looks, from this time on)
after=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
services=(coordinator client)
((view)) && services+=(view)
dc up -d --scale client="$clients" "${services[@]}" 2>"$err" || fail_start "the stack did not start"
echo "sim.sh: coordinator and $clients clients in containers ($image), $rounds rounds"
dc run --rm -T history follow --resume-wait 120 --after "$after" 2>/dev/null &
follow=$!
((view)) && echo "sim.sh: the run in a browser: http://localhost:${FEDMOE_VIEW_PORT:-8080}/?token=$token (while the stack runs)"
# a coordinator that keeps failing (a bad setting, a damaged database) ends the job with its reason
failed=""
while kill -0 $follow 2>/dev/null && ((stopped == 0)); do
  coord=$(dc ps -q coordinator 2>/dev/null || true)
  if [[ -n $coord && $(docker inspect -f '{{.RestartCount}}' "$coord" 2>/dev/null || echo 0) -ge 3 ]]; then
    failed=$(docker logs --tail 20 "$coord" 2>&1 | grep -vE '^\s*$' | tail -1)
    break
  fi
  sleep 1
done
if [[ -n $failed || $stopped -ne 0 ]]; then
  kill $follow 2>/dev/null || true
  docker ps -q --filter "label=com.docker.compose.project=$project" --filter "label=com.docker.compose.oneoff=True" |
    xargs -r docker rm -f >/dev/null 2>&1 || true
fi
rc=0
wait $follow || rc=$?
if [[ -n $failed ]]; then
  echo "sim.sh: the coordinator failed 3 times; its last line: $failed" >&2
  dc down --remove-orphans >/dev/null 2>&1 || true
  exit 1
fi
if ((stopped == 0)); then
  coord=$(dc ps -q coordinator)
  [[ -n $coord ]] && timeout 60 docker wait "$coord" >/dev/null 2>&1 || true
  dc down --remove-orphans >/dev/null 2>&1 || true
fi
echo
echo "database: volume ${project}_data   (${compose[*]} -p $project -f $here/compose.yml run --rm history rounds)"
((view)) && echo "browse it: ${compose[*]} -p $project -f $here/compose.yml up -d view   (the same address)"
((stopped)) && exit 130
exit "$rc"
