#!/usr/bin/env bash
# Makes sure a Docker engine answers (one clear line when none can): when none does and this is root with
# Debian's dockerd installed (scripts/install-deps.sh), starts one in
# the background (log: /var/log/fedmoe-dockerd.log) and waits for it.
set -euo pipefail
command -v docker >/dev/null || { echo "engine: no docker command (scripts/install-deps.sh --docker installs Debian's docker.io)" >&2; exit 1; }
docker info >/dev/null 2>&1 && exit 0
if [[ -n ${DOCKER_HOST:-} && ${DOCKER_HOST} != unix:///var/run/docker.sock ]]; then
  echo "engine: no Docker engine answers at DOCKER_HOST=$DOCKER_HOST (start it there, or unset DOCKER_HOST)" >&2
  exit 1
fi
if [[ $(id -u) -ne 0 ]] || ! command -v dockerd >/dev/null; then
  echo "engine: no Docker engine answers; start one (scripts/install-deps.sh installs Debian's docker.io)" >&2
  exit 1
fi
echo "engine: starting dockerd"
nohup dockerd >/var/log/fedmoe-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "engine: dockerd did not answer within 60 s; the end of /var/log/fedmoe-dockerd.log:" >&2
tail -n 20 /var/log/fedmoe-dockerd.log >&2
exit 1
