#!/usr/bin/env bash
# Containers, measured (BENCHMARKS.md "Containers"):
#  1. from a cold cache: the base image (debootstrap) and the image build, and the image's size;
#  2. RUNS times: docker/sim.sh with CLIENTS clients and ROUNDS rounds: the time from
#     `up` to the first committed round, the wall time, the final accuracy;
#  3. the same settings as fedmoe-sim processes: the final accuracy and the final
#     global model's checkpoint digest must be the same as in containers.
#   bench/docker.sh [BUILD=build] [RUNS=3] [CLIENTS=4] [ROUNDS=3]
set -euo pipefail
build=${1:-build} runs=${2:-3} clients=${3:-4} rounds=${4:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/fedmoe-bench-docker-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$root/docker/engine.sh"
docker rmi -f $(docker images -q fedmoe/fedmoe) fedmoe/debian:bookworm >/dev/null 2>&1 || true
docker builder prune -af >/dev/null 2>&1 || true
t0=$(date +%s.%N); "$root/docker/base-image.sh" >/dev/null; t1=$(date +%s.%N)
image=$("$root/docker/image.sh" 2>/dev/null); t2=$(date +%s.%N)
echo "cold: base image $(echo "$t1 - $t0" | bc | xargs printf '%.0f') s, image build $(echo "$t2 - $t1" | bc | xargs printf '%.0f') s, size $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
digest() { # DB: the last committed round's checkpoint digest and accuracy
  /usr/bin/python3 - "$1" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
r = c.execute("SELECT checkpoint_sha256, test_accuracy FROM rounds ORDER BY run_id DESC, round DESC LIMIT 1").fetchone()
print(f"{r[0][:16]} {100*r[1]:.2f}%")
PY
}
for i in $(seq 1 "$runs"); do
  p=fedmoe-bench-$$-$i
  s=$(date +%s.%N)
  FEDMOE_PROJECT=$p "$root/docker/sim.sh" --clients "$clients" --rounds "$rounds" > "$work/sim-$i.out" 2>&1
  e=$(date +%s.%N)
  docker run --rm -v "${p}_data:/data" -v "$work:/out" --user 0 "$image" sh -c "cp /data/fedmoe.db /out/docker-$i.db"
  first=$(/usr/bin/python3 - "$work/docker-$i.db" <<'PY'
import sqlite3, sys, datetime as d
c = sqlite3.connect(sys.argv[1])
st, fin = c.execute("SELECT r.started_at, (SELECT finished_at FROM rounds WHERE round = 1) FROM runs r").fetchone()
f = lambda x: d.datetime.fromisoformat(x.replace("Z", "+00:00"))
print(f"{(f(fin) - f(st)).total_seconds():.1f}")
PY
)
  echo "containers run $i: run start to round 1 committed $first s, wall $(echo "$e - $s" | bc | xargs printf '%.1f') s (sim.sh, image cached), final $(digest "$work/docker-$i.db")"
  docker-compose -p "$p" -f "$root/docker/compose.yml" down -v >/dev/null 2>&1 || docker compose -p "$p" -f "$root/docker/compose.yml" down -v >/dev/null 2>&1 || true
done
"$root/$build/client/fedmoe-sim" --clients "$clients" --rounds "$rounds" --db "$work/sim.db" --workdir "$work/w" > "$work/sim.out" 2>&1
echo "processes (fedmoe-sim, same settings): final $(digest "$work/sim.db")"
