#!/usr/bin/env bash
# One allowed key against everyone else, measured (BENCHMARKS.md "Security"):
# the attacks of tests/test_hostile.c (40 connections of one key, 100,000
# Error reports without a Hello, a 2 KB/s drip after a Hello, messages built to
# decode large) against the programs of a build folder, while two honest
# clients train; prints what each attack did (descriptors, log lines, rounds,
# the coordinator's memory, whether a newcomer got in) without judging it, so
# older programs can be measured too.
#   bench/hostile.sh PROGRAMS_BUILD [TEST_BUILD=build] [RUNS=1]
set -euo pipefail
cd "$(dirname "$0")/.."
programs=$(cd "${1:?a build folder with server/ and client/}" && pwd)
tests=${2:-build}
runs=${3:-1}
for r in $(seq "$runs"); do
  echo "run $r: programs of $programs"
  FEDMOE_BIN_DIR=$programs FEDMOE_MEASURE_ONLY=1 "$tests/tests/test_hostile" 2>&1 | grep '^  ' || true
done
