#!/usr/bin/env bash
# Installs the Debian 12 packages that fedmoe needs to build, test and run.
# Works as root, or through sudo. Installs only what is missing.
#   scripts/install-deps.sh          build + run + test dependencies
#   scripts/install-deps.sh --bench  also python3-torch for the PyTorch comparison
#   scripts/install-deps.sh --ci     also clang + libFuzzer, valgrind and python3-torch (CI's extra checks)
#   scripts/install-deps.sh --docker also starts the Docker engine (Debian's dockerd, in the
#                                    background) when none answers (docker/engine.sh)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
engine=0

pkgs=(build-essential cmake pkg-config
      libzmq3-dev libsodium-dev libprotobuf-c-dev protobuf-c-compiler
      libssl-dev libsqlite3-dev libopenblas-dev libcmocka-dev zlib1g-dev
      libinih-dev libmicrohttpd-dev dataset-fashion-mnist
      fortunes fortunes-de fortunes-es fortunes-it fortunes-pl fortunes-ru fortunes-cs fortunes-br  # text: eight languages
      fortunes-eo fortunes-ga  # text: the two smallest, for the tests
      manpages manpages-de manpages-es manpages-it manpages-pl manpages-ru manpages-cs manpages-pt-br  # text: a second domain
      python3 python3-zmq python3-protobuf protobuf-compiler python3-numpy  # the Python clients and their test
      iptables iproute2                                       # the silent-peer test (a cut network)
      chromium chromium-driver                                # the browser view's test (headless)
      docker.io docker-compose debootstrap python3-yaml)      # docker/ and its tests (the engine: docker/engine.sh)
case "${1:-}" in
  --bench) pkgs+=(python3-torch) ;;
  --ci) pkgs+=(clang libclang-rt-14-dev valgrind python3 python3-torch) ;;
  --docker) engine=1 ;;
  "") ;;
  *) echo "install-deps: unknown option '$1' (--bench, --ci or --docker)" >&2; exit 2 ;;
esac
start_engine() { ((engine == 0)) || "$here/../docker/engine.sh"; }

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  start_engine
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
start_engine
