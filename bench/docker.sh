#!/usr/bin/env bash
# Containers, measured (BENCHMARKS.md "Containers"):
#  1. from a cold cache: the base image (debootstrap) and the image build, and the image's size;
#  2. RUNS times: docker/sim.sh with CLIENTS clients and ROUNDS rounds on the
#     image just built: the time from its start (the stack's `up`, keys made)
#     to the first committed round on its screen, the wall time, the final accuracy;
#  3. the same settings as fedmoe-sim processes, with the image's programs (in
#     one container) and with this machine's build (BUILD, -march=native): the
#     final accuracy and the digest of the final global vector and prompt, to
#     compare with the containers'.
#   bench/docker.sh [BUILD=build] [RUNS=3] [CLIENTS=4] [ROUNDS=3] [COLD=1]   (COLD=0: keep the images, skip 1.)
set -euo pipefail
build=${1:-build} runs=${2:-3} clients=${3:-4} rounds=${4:-3} cold=${5:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/fedmoe-bench-docker-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$root/docker/engine.sh"
if ((cold)); then
  docker rmi -f $(docker images -q fedmoe/fedmoe) fedmoe/debian:bookworm >/dev/null 2>&1 || true
  docker builder prune -af >/dev/null 2>&1 || true
  t0=$(date +%s.%N); "$root/docker/base-image.sh" >/dev/null; t1=$(date +%s.%N)
  image=$("$root/docker/image.sh" 2>/dev/null); t2=$(date +%s.%N)
  echo "cold: base image $(echo "$t1 - $t0" | bc | xargs printf '%.0f') s, image build $(echo "$t2 - $t1" | bc | xargs printf '%.0f') s, size $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
else
  image=$("$root/docker/image.sh")
fi
digest() { # DB: SHA-256 of the final global vector and prompt (from the last checkpoint), and the accuracy
  /usr/bin/python3 - "$1" <<'PY'
import hashlib, sqlite3, struct, sys
c = sqlite3.connect(sys.argv[1])
blob, = c.execute("SELECT state FROM checkpoints ORDER BY run_id DESC, round DESC LIMIT 1").fetchone()
acc, = c.execute("SELECT test_accuracy FROM rounds ORDER BY run_id DESC, round DESC LIMIT 1").fetchone()
off = 16 + 4  # header, round
ng, = struct.unpack_from("<Q", blob, off); off += 8
g = blob[off:off + 4 * ng]; off += 4 * ng
npr, = struct.unpack_from("<Q", blob, off); off += 8
p = blob[off:off + 4 * npr]
print(f"global {hashlib.sha256(g + p).hexdigest()[:16]} {100 * acc:.2f}%")
PY
}
for i in $(seq 1 "$runs"); do
  p=fedmoe-bench-$$-$i
  s=$(date +%s.%N) first=""
  FEDMOE_PROJECT=$p "$root/docker/sim.sh" --image "$image" --clients "$clients" --rounds "$rounds" > "$work/sim-$i.out" 2>&1 &
  sim=$!
  while kill -0 $sim 2>/dev/null; do
    [[ -z $first ]] && grep -qE '^ +1 ' "$work/sim-$i.out" && first=$(echo "$(date +%s.%N) - $s" | bc)
    sleep 0.1
  done
  wait $sim || { echo "containers run $i: sim.sh failed:"; tail "$work/sim-$i.out"; exit 1; }
  e=$(date +%s.%N)
  docker run --rm -v "${p}_data:/data" -v "$work:/out" --user 0 "$image" sh -c "cp /data/fedmoe.db /out/docker-$i.db; if [ -f /data/fedmoe.db-wal ]; then cp /data/fedmoe.db-wal /out/docker-$i.db-wal; fi"
  printf 'containers run %d: sim.sh start to round 1 shown %.1f s, wall %.1f s (image present), final %s\n' \
    "$i" "$first" "$(echo "$e - $s" | bc)" "$(digest "$work/docker-$i.db")"
  docker-compose -p "$p" -f "$root/docker/compose.yml" down -v >/dev/null 2>&1 || docker compose -p "$p" -f "$root/docker/compose.yml" down -v >/dev/null 2>&1 || true
done
mkdir -m 777 "$work/img"
docker run --rm -v "$work/img:/out" "$image" fedmoe-sim --clients "$clients" --rounds "$rounds" --db /out/sim.db \
  --workdir /out/w > "$work/img-sim.out" 2>&1
echo "processes (fedmoe-sim of the image, in one container, same settings): final $(digest "$work/img/sim.db")"
"$root/$build/client/fedmoe-sim" --clients "$clients" --rounds "$rounds" --db "$work/sim.db" --workdir "$work/w" > "$work/sim.out" 2>&1
echo "processes (fedmoe-sim of $build, this machine's build, same settings): final $(digest "$work/sim.db")"
