#!/usr/bin/env bash
# The robust-aggregation benchmark (issue 12): 10 clients on Fashion-MNIST
# (Dirichlet 0.3, the main job's setting, R rounds), 2 of them (20%) attackers
# (bench/attack.c: the client trains honestly, its upload lies), under each
# aggregation rule, for fedavg and full. Prints one line per run: the honest
# clients' test accuracy in the last round (their test examples pooled), and
# the mean over their last 5 rounds.
#   bench/robust.sh [ROUNDS=20] [OUT=bench-robust]
# Environment: BUILD (default build), STRATEGIES ("fedavg full"),
#   ATTACKS ("none signflip:10 scale:100 random:1"),
#   RULES ("mean/off mean/auto trimmed-mean:0.2/auto median/auto": RULE/CLIP).
# The attackers are client-000 and client-001 on partitions 0 and 1 in every run
# (a wrapper in OUT/bin gives client-K partition K), so runs differ only in the
# rule and the attack.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
out=${2:-bench-robust}
build=$(cd "${BUILD:-build}" && pwd)
strategies=${STRATEGIES:-fedavg full}
attacks=${ATTACKS:-none signflip:10 scale:100 random:1}
rules=${RULES:-mean/off mean/auto trimmed-mean:0.2/auto median/auto}
mkdir -p "$out/bin"
out=$(cd "$out" && pwd)
{ echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- || echo ' (with uncommitted changes)')"
  awk -F': *' -v n="$(nproc)" '/^model name/ {m = $2} /^$/ {exit} END {printf "cpu %s, %s cores\n", m, n}' /proc/cpuinfo
  echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), $rounds rounds"
} > "$out/machine.txt"
# fedmoe-sim runs the fedmoe-client next to it: here, a wrapper that pins
# partitions and makes the first two clients attackers
cp "$build/client/fedmoe-sim" "$out/bin/fedmoe-sim"
ln -sf "$build/server/fedmoe-server" "$out/bin/fedmoe-server"
cat > "$out/bin/fedmoe-client" <<WRAP
#!/bin/sh
id=""; prev=""
for a in "\$@"; do [ "\$prev" = "--id" ] && id=\$a; prev=\$a; done
k=\$(echo "\$id" | sed 's/^client-0*//'); k=\${k:-0}
prog="$build/client/fedmoe-client"
if [ "\$k" -lt 2 ] && [ "\${FEDMOE_ATTACK:-none}" != none ]; then prog="$build/bench/fedmoe-attacker"; fi
exec "\$prog" "\$@" --partition "\$k/10"
WRAP
chmod +x "$out/bin/fedmoe-client"
db="$out/robust.db"
printf "%-7s %-12s %-20s %9s %9s %7s\n" strategy attack rule final last5 clipped
for strategy in $strategies; do
  for attack in $attacks; do
    for rc in $rules; do
      rule=${rc%/*} clip=${rc#*/}
      tag="$strategy-${attack/:/}-${rule/:/}-$clip"
      FEDMOE_ATTACK=$attack "$out/bin/fedmoe-sim" --clients 10 --rounds "$rounds" --strategy "$strategy" --seed 1 \
        --aggregate "$rule" --clip-norm "$clip" --db "$db" --workdir "$out/work-$tag" > "$out/sim-$tag.txt" 2>&1 ||
        { echo "$tag: fedmoe-sim failed (see $out/sim-$tag.txt)"; continue; }
      run=$(grep -m1 '^run ' "$out/sim-$tag.txt" | awk '{print $2}')
      acc=$(sqlite3 "$db" "SELECT printf('%.2f', 100.0 * SUM(test_correct) / SUM(test_samples)) FROM client_rounds
              WHERE run_id = '$run' AND status = 'completed' AND client_id NOT IN ('client-000', 'client-001')
              AND round = (SELECT MAX(round) FROM rounds WHERE run_id = '$run')")
      last5=$(sqlite3 "$db" "SELECT printf('%.2f', 100.0 * SUM(test_correct) / SUM(test_samples)) FROM client_rounds
              WHERE run_id = '$run' AND status = 'completed' AND client_id NOT IN ('client-000', 'client-001')
              AND round > (SELECT MAX(round) FROM rounds WHERE run_id = '$run') - 5")
      clipped=$(grep -c 'clipped (distance' "$out/work-$tag/server.log" 2>/dev/null || true)
      printf "%-7s %-12s %-20s %9s %9s %7s\n" "$strategy" "$attack" "$rule/$clip" "$acc" "$last5" "${clipped:-0}"
    done
  done
done | tee "$out/summary.txt"
