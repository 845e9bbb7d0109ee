#!/usr/bin/env bash
# The text benchmark of issue 15: one client per language (8 clients over the
# fortunes of en de es it pl ru cs pt), the same model, budget and seed for
# each strategy (local, fedavg, comigs), R rounds each.
#   bench/text_accuracy.sh [ROUNDS=30] [OUT=bench-text] [extra fedmoe-sim flags...]
# Environment: BUILD (default build), STRATEGIES (default "local fedavg comigs"),
#              CLIENTS (default 8), FLAGS_<strategy> (flags for that strategy alone,
#              e.g. FLAGS_comigs="--lr 0.003": its own setting chosen on holdout runs).
# Writes OUT/text.db, OUT/machine.txt, OUT/text.svg (fedmoe-history plot of the
# runs), OUT/summary.txt (each run's final test and validation bits per byte,
# over all bytes and as the mean over clients) and OUT/languages.txt (the last
# round's test bits per byte of each client, by its language, for each strategy,
# and its generalist routing share; OUT/languages.svg the same as bars). With --holdout among the flags the "test"
# numbers are the held-out part of train + validation (for choosing settings).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-30}
out=${2:-bench-text}
shift $(( $# > 2 ? 2 : $# )) || true
strategies=${STRATEGIES:-local fedavg comigs}
clients=${CLIENTS:-8}
build=${BUILD:-build}
sim=$build/client/fedmoe-sim
hist=$build/server/fedmoe-history
mkdir -p "$out"
{ bench/machine.sh
  echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), $clients clients, $rounds rounds, flags: $*"
} > "$out/machine.txt"
db="$out/text.db"
ids=() names=()
for strategy in $strategies; do
  own=FLAGS_$strategy
  echo "== text, $strategy, $rounds rounds ($* ${!own:-}) $(date -u +%H:%M)" >&2
  echo "$strategy: $* ${!own:-}" >> "$out/machine.txt"
  start=$(date +%s)
  # shellcheck disable=SC2086 # (FLAGS_ holds several flags)
  $sim --task text --partition-by language --clients "$clients" --rounds "$rounds" --strategy "$strategy" \
       --seed 1 --db "$db" --workdir "$out/work-$strategy" "$@" ${!own:-} > "$out/sim-$strategy.txt"
  echo "   $(( $(date +%s) - start )) s" >&2
  ids+=("$(grep -m1 '^run ' "$out/sim-$strategy.txt" | awk '{print $2}')")
  names+=("$strategy")
done
$hist --db "$db" plot --out "$out/text.svg" "${ids[@]}" >&2

# the last round of run $2 (strategy $1), a line a client:
#   language test_bpb val_bpb generalist_share test_bytes
# (a client's languages from the line it logs when it joins: partitions go by join order)
last_rows() {
  $hist --db "$db" export --table clients "$2" | awk -F, -v logs="$out/work-$1" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["status"] == "completed" { r = $col["round"] + 0; if (r > last) last = r; row[r, ++n[r]] = $0 }
    END {
      for (j = 1; j <= n[last]; j++) {
        split(row[last, j], f, ",")
        lang = "?"; file = logs "/" f[col["client"]] ".log"
        while ((getline line < file) > 0)
          if (match(line, /languages: .*/)) { lang = substr(line, RSTART + 11); gsub(/ /, "_", lang); break }
        close(file)
        printf "%s %.4f %.4f %.4f %d\n", lang, f[col["test_loss"]] / log(2),
               f[col["val_loss"]] / log(2), f[col["generalist_share"]], f[col["test_samples"]]
      }
    }' | sort
}
for i in "${!ids[@]}"; do  # (read once: the summary and the table below use them)
  last_rows "${names[$i]}" "${ids[$i]}" > "$out/last-${names[$i]}.txt"
done
{
  printf "%-8s %-26s %7s %12s %12s %12s\n" strategy run rounds "test bpb" "mean client" "val bpb"
  for i in "${!ids[@]}"; do
    s=${names[$i]}
    awk -v s="$s" -v id="${ids[$i]}" -v r="$rounds" '
      { tb += $2 * $5; b += $5; mc += $2; v += $3; n++ }
      END { printf "%-8s %-26s %7d %12.4f %12.4f %12.4f\n", s, id, r, tb / b, mc / n, v / n }' "$out/last-$s.txt"
  done
} | tee "$out/summary.txt"
# by language (a language with several clients: their byte-weighted mean)
{
  printf "%-12s" language
  for s in $strategies; do printf " %9s" "$s"; done
  for s in $strategies; do printf " %10s" "gen:$s"; done
  echo
  for i in "${!ids[@]}"; do sed "s/^/$i /" "$out/last-${names[$i]}.txt"; done | awk -v k="${#ids[@]}" '
    { l = $2; if (!(l in seen)) { seen[l] = 1; order[++nl] = l }
      t[l, $1] += $3 * $6; g[l, $1] += $5 * $6; b[l, $1] += $6 }
    END {
      for (j = 1; j <= nl; j++) {
        l = order[j]; printf "%-12s", l
        for (i = 0; i < k; i++) printf " %9s", b[l, i] ? sprintf("%.4f", t[l, i] / b[l, i]) : "-"
        for (i = 0; i < k; i++) printf " %10s", b[l, i] ? sprintf("%.3f", g[l, i] / b[l, i]) : "-"
        printf "\n"
      }
    }'
} | tee "$out/languages.txt"
bench/text_languages_svg.sh "$out/languages.txt" "$out/languages.svg"
