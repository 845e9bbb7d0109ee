#!/usr/bin/env bash
# One line per run: best and final mean personalized accuracy over the rounds, on
# the test splits and on the validation splits, from fedmoe-history's CSV export.
#   bench/run-summary.sh DB RUN_ID [LABEL...]
set -euo pipefail
cd "$(dirname "$0")/.."
db=$1 id=$2
shift 2
${BUILD:-build}/server/fedmoe-history --db "$db" export "$id" | awk -F, -v label="$*" -v id="$id" '
  NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
  {
    r = $col["round"]; t = 100 * $col["test_accuracy"]; v = 100 * $col["val_accuracy"]
    if (t > tb) { tb = t; tr = r }
    if (v > vb) { vb = v; vr = r }
    tf = t; vf = v; n = r
  }
  END {
    printf "%-28s %-26s rounds %3d  test best %6.2f%% (r%3d) final %6.2f%%  val best %6.2f%% (r%3d) final %6.2f%%\n",
           label, id, n, tb, tr, tf, vb, vr, vf
  }'
