#!/usr/bin/env bash
# Builds the fuzz targets with clang (ASan + UBSan + libFuzzer) and fuzzes the
# decode-and-validate path for a bounded time, starting from a seed corpus.
#   fuzz/run.sh [SECONDS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-O1 -g" \
      -DFM_FUZZ=ON -DFM_SANITIZE=ON -DFM_WERROR=ON > /dev/null
cmake --build build-fuzz -j2 --target fuzz_wire make_corpus
corpus=build-fuzz/corpus
mkdir -p "$corpus"
build-fuzz/fuzz/make_corpus "$corpus"
build-fuzz/fuzz/fuzz_wire -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 "$corpus" 2>&1 | tail -25
