#!/usr/bin/env bash
# Makes sure the fedmoe image for this sources tree exists and prints its tag
# (fedmoe/fedmoe:VERSION-COMMIT, also tagged :latest). Builds it when missing,
# when the tree has uncommitted changes (Docker's layer cache keeps an unchanged
# build quick) or with --build; where the base image is neither here nor
# pullable, makes it from Debian's archive first (base-image.sh).
#   docker/image.sh [--build]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
build=0
[[ ${1:-} == --build ]] && build=1
commit=$(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)
[[ $commit == *-dirty ]] && build=1
version=$(sed -n 's/^project(fedmoe VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
image=fedmoe/fedmoe:$version-$commit
if ((build)) || ! docker image inspect "$image" >/dev/null 2>&1; then
  base=${FEDMOE_BASE:-debian:bookworm-slim}
  if ! docker image inspect "$base" >/dev/null 2>&1 && ! timeout 30 docker pull -q "$base" >/dev/null 2>&1; then
    echo "image: no $base here and no registry answers: making the base image from Debian's archive" >&2
    "$here/base-image.sh" fedmoe/debian:bookworm >&2
    base=fedmoe/debian:bookworm
  fi
  echo "image: building $image on $base (a few minutes the first time)" >&2
  docker build -q -f "$here/Dockerfile" --build-arg BASE="$base" --build-arg VERSION="$version" \
    --build-arg COMMIT="$commit" -t "$image" -t fedmoe/fedmoe:latest "$root" >/dev/null
fi
echo "$image"
