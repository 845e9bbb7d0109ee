#!/usr/bin/env bash
# Prints the three Secrets docker/k8s/fedmoe.yaml mounts, with keys made here by
# fedmoe-keygen (from PATH, build/, or the fedmoe image):
#   fedmoe-coordinator  coordinator.key, coordinator.pub and c000.pub .. (its allow-list)
#   fedmoe-clients      c000.key .. and coordinator.pub
#   fedmoe-view         token: the browser view's (48 hex digits)
#   docker/k8s/make-secrets.sh N | kubectl apply -f -
# Every client pod of the Indexed Job mounts fedmoe-clients and uses its own
# cNNN.key; give each client machine only its own key where they are not one
# trust domain (docs/security.md).
set -euo pipefail
n=${1:?usage: make-secrets.sh CLIENTS}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "make-secrets.sh: CLIENTS must be a positive number" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ids=(coordinator)
for ((i = 0; i < n; i++)); do ids+=("$(printf 'c%03d' "$i")"); done
if command -v fedmoe-keygen >/dev/null; then
  fedmoe-keygen --out "$dir" "${ids[@]}" >/dev/null
elif [[ -x $root/build/server/fedmoe-keygen ]]; then
  "$root/build/server/fedmoe-keygen" --out "$dir" "${ids[@]}" >/dev/null
else
  docker run --rm --user "$(id -u)" -v "$dir:/out" fedmoe/fedmoe:latest fedmoe-keygen --out /out "${ids[@]}" >/dev/null
fi
secret() { # NAME FILE...
  echo "apiVersion: v1"
  echo "kind: Secret"
  echo "metadata:"
  echo "  name: $1"
  echo "type: Opaque"
  echo "data:"
  shift
  for f in "$@"; do echo "  $(basename "$f"): $(base64 -w0 < "$f")"; done
  echo "---"
}
pubs=()
keys=()
for ((i = 0; i < n; i++)); do id=$(printf 'c%03d' "$i"); pubs+=("$dir/$id.pub"); keys+=("$dir/$id.key"); done
secret fedmoe-coordinator "$dir/coordinator.key" "$dir/coordinator.pub" "${pubs[@]}"
secret fedmoe-clients "${keys[@]}" "$dir/coordinator.pub"
od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$dir/token"
secret fedmoe-view "$dir/token"
