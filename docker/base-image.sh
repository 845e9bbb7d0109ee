#!/usr/bin/env bash
# Makes the base image the Dockerfile builds on, where no image registry can be
# reached: a minimal Debian 12 root from Debian's package archive (debootstrap
# --variant=minbase), imported into the local engine. It uses the same archive
# as this machine's apt (its sources are copied in), so a container's
# `apt-get install` reaches what the host reaches.
#   docker/base-image.sh [TAG]     default TAG: fedmoe/debian:bookworm
# Does nothing when the image exists. Needs root (debootstrap) and a Docker engine.
set -euo pipefail
tag=${1:-fedmoe/debian:bookworm}
docker=${DOCKER:-docker}

if $docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base-image: $tag present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "base-image: debootstrap is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "base-image: debootstrap needs root" >&2; exit 1; }

# The archive this machine's apt uses (deb822 sources first, then the one-line form).
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] || continue
  mirror=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f")
  [[ -n $mirror ]] && break
done
if [[ -z $mirror && -f /etc/apt/sources.list ]]; then
  mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
fi

root=$(mktemp -d /var/tmp/fedmoe-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap --variant=minbase bookworm ${mirror:-(the default archive of debootstrap)}"
debootstrap --variant=minbase bookworm "$root" ${mirror:+"$mirror"} > "$root.log" 2>&1 ||
  { tail -20 "$root.log" >&2; echo "base-image: debootstrap failed (log above)" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# the host's apt sources (updates, security) and no caches
if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/"
fi
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb "$root"/tmp/*
tar -C "$root" -c . | $docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  --message "Debian 12 minbase from debootstrap" - "$tag" >/dev/null
echo "base-image: made $tag ($($docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
