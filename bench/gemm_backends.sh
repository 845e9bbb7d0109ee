#!/usr/bin/env bash
# OpenBLAS against libxsmm on the model's product shapes (bench/gemm_backends.c).
# Needs Debian's libxsmm-dev (not a dependency of fedmoe: apt-get install
# libxsmm-dev). Single thread.
#   bench/gemm_backends.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pkg-config --exists libxsmm || { echo "gemm_backends: libxsmm-dev is not installed" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -O2 -march=native -std=gnu11 $(pkg-config --cflags libxsmm) bench/gemm_backends.c -o "$out/gemm_backends" \
  -lopenblas $(pkg-config --libs libxsmm)
OPENBLAS_NUM_THREADS=1 "$out/gemm_backends"
