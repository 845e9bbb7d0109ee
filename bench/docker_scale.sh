#!/usr/bin/env bash
# The largest container stack (BENCHMARKS.md "Containers"): docker/sim.sh with
# CLIENTS client containers for ROUNDS rounds on the image of this commit;
# prints the round lines, the wall time, each container's peak memory (its
# cgroup's max_usage_in_bytes: resident memory and the page cache it was
# charged; median and largest over the clients, and the coordinator's), and
# the machine's peak memory in use while it ran (sampled every 2 s).
#   bench/docker_scale.sh [CLIENTS=50] [ROUNDS=3]
set -euo pipefail
clients=${1:-50} rounds=${2:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/fedmoe-bench-scale-XXXXXX)
project=fedmoe-scale-$$
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
trap '"${compose[@]}" -p "$project" -f "$root/docker/compose.yml" down -v >/dev/null 2>&1; rm -rf "$work"' EXIT
"$root/docker/engine.sh"
image=$("$root/docker/image.sh")
[[ $(docker info -f '{{.CgroupVersion}}') == 1 ]] || { echo "docker_scale: reads cgroup v1 counters; this engine uses v2" >&2; exit 1; }
s=$(date +%s.%N)
FEDMOE_PROJECT=$project "$root/docker/sim.sh" --image "$image" --clients "$clients" --rounds "$rounds" > "$work/sim.out" 2>&1 &
sim=$!
used_peak=0
while kill -0 $sim 2>/dev/null; do
  for id in $(docker ps -q --no-trunc --filter "label=com.docker.compose.project=$project"); do
    f=/sys/fs/cgroup/memory/docker/$id/memory.max_usage_in_bytes
    [[ -r $f ]] || continue
    svc=$(docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}}' "$id" 2>/dev/null) || continue
    v=$(cat "$f" 2>/dev/null) || continue  # (gone meanwhile)
    echo "$svc $v" > "$work/peak-$id"
  done
  used=$(free -b | awk '/^Mem:/ { print $3 }')
  ((used > used_peak)) && used_peak=$used
  sleep 2
done
rc=0
wait $sim || rc=$?
e=$(date +%s.%N)
grep -E '^ +[0-9]+ +[0-9]+/[0-9]+ ' "$work/sim.out" || true
grep -E 'rounds  |final test accuracy|mean round time|wall time' "$work/sim.out" || true
[[ $rc -eq 0 ]] || { echo "docker_scale: sim.sh exited with $rc:"; tail -20 "$work/sim.out"; exit 1; }
echo "image $image, $clients client containers, $rounds rounds, wall $(echo "$e - $s" | bc | xargs printf '%.0f') s (sim.sh from the image present)"
mb() { awk '{ printf "%.0f", $1 / 1e6 }'; }
grep -h '^client ' "$work"/peak-* | cut -d' ' -f2 | sort -n > "$work/clients.peak"
n=$(wc -l < "$work/clients.peak")
echo "peak memory per client container: median $(sed -n "$(((n + 1) / 2))p" "$work/clients.peak" | mb) MB," \
  "largest $(tail -1 "$work/clients.peak" | mb) MB ($n containers);" \
  "coordinator $(grep -h '^coordinator ' "$work"/peak-* | cut -d' ' -f2 | mb) MB;" \
  "machine in use at most $(echo "$used_peak" | awk '{ printf "%.1f", $1 / 1e9 }') GB"
