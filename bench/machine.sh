#!/usr/bin/env bash
# Where and with what a benchmark's numbers were made, for its machine.txt:
# runs are bit-repeatable on one machine kind, so the commit and the CPU are
# part of a result. Prints the commit (marked when the tree has uncommitted
# changes) and the CPU; run from the checkout.
#   bench/machine.sh
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
awk -F': *' -v n="$(nproc)" '/^model name/ {m = $2} /^cpu family/ {f = $2} /^model[[:space:]]*:/ {d = $2}
    /^$/ {exit} END {printf "cpu %s, family %s model %s, %s cores\n", m, f, d, n}' /proc/cpuinfo
