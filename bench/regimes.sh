#!/usr/bin/env bash
# Where the mixture wins: the strategies against data per client, over seeds,
# in one regime. Every (size, strategy, seed) is one fedmoe-sim run of ROUNDS
# rounds with the same budget (the same rounds and local epochs for every
# strategy); sizes cap each client's train + validation data
# (--client-examples, or --client-bytes for text), its test split whole.
#   bench/regimes.sh SETTING [OUT=bench-regimes] [extra fedmoe-sim flags...]
# SETTING (20 clients on Fashion-MNIST unless said):
#   dirichlet    Dirichlet(0.1) label skew
#   domains      feature shift: --domains rotate (the four turns, five clients
#                each), IID labels
#   concept      concept shift: --concept-groups 2 (half the clients relabel
#                every class), IID labels
#   text         the fortunes, one language a client (8 clients); sizes in bytes
# Environment: BUILD (a frozen build; default build), SIZES (default
#   "25 50 100 250 1000", text "4096 16384 65536 262144"; "all" = no cap),
#   SEEDS ("1 2 3"), STRATEGIES (image: "local fedavg comigs pfedmoap full",
#   text: "local fedavg comigs"), ROUNDS (30), HOLDOUT=1 (score on held-out
#   train data, for choosing settings: the test splits are never read),
#   DATA_SEED (one partition for every run, --data-seed: SEEDS then vary the
#   training alone; the seed column of runs.txt reads dD.sS).
# Writes OUT/runs.txt (one line a run: setting size strategy seed run-id
# final best-on-validation, accuracy in % or bits per byte), OUT/regimes.db,
# OUT/sim-*.txt and OUT/machine.txt; bench/regimes_table.py OUT/runs.txt makes
# the table (mean +- std) and the plot.
set -euo pipefail
cd "$(dirname "$0")/.."
setting=${1:?setting: dirichlet, domains, concept or text}
out=${2:-bench-regimes}
shift $(( $# > 2 ? 2 : $# )) || true
build=${BUILD:-build}
rounds=${ROUNDS:-30}
seeds=${SEEDS:-1 2 3}
case $setting in
  dirichlet) flags=(--clients 20 --dirichlet 0.1) ;;
  domains)   flags=(--clients 20 --iid --domains rotate) ;;
  concept)   flags=(--clients 20 --iid --concept-groups 2) ;;
  text)      flags=(--task text --clients 8) ;;
  *) echo "regimes.sh: unknown setting '$setting' (dirichlet, domains, concept, text)" >&2; exit 2 ;;
esac
if [[ $setting == text ]]; then
  sizes=${SIZES:-4096 16384 65536 262144} strategies=${STRATEGIES:-local fedavg comigs} cap=--client-bytes
else
  sizes=${SIZES:-25 50 100 250 1000} strategies=${STRATEGIES:-local fedavg comigs pfedmoap full} cap=--client-examples
fi
[[ ${HOLDOUT:-0} == 1 ]] && flags+=(--holdout)
[[ -n ${DATA_SEED:-} ]] && flags+=(--data-seed "$DATA_SEED")
mkdir -p "$out"
{ bench/machine.sh
  echo "started $(date -u '+%Y-%m-%d %H:%M UTC'), setting $setting, rounds $rounds, seeds $seeds, flags: ${flags[*]} $*"
} >> "$out/machine.txt"
db="$out/regimes.db"
for size in $sizes; do
  for strategy in $strategies; do
    for seed in $seeds; do
      key=$seed
      [[ -n ${DATA_SEED:-} ]] && key="d$DATA_SEED.s$seed"
      tag="$setting-$size-$strategy-$key"
      capflag=()
      [[ $size == all ]] || capflag=("$cap" "$size")
      echo "== $tag" >&2
      "$build/client/fedmoe-sim" "${flags[@]}" "${capflag[@]}" --rounds "$rounds" --strategy "$strategy" \
        --seed "$seed" --db "$db" --workdir "$out/work-$tag" "$@" > "$out/sim-$tag.txt"
      id=$(grep -m1 '^run ' "$out/sim-$tag.txt" | awk '{print $2}')
      rm -rf "$out/work-$tag"
      # final, and best on validation: the test score of the round whose
      # validation accuracy is best (text: next-byte accuracy; the round log
      # keeps no validation loss a round)
      "$build/server/fedmoe-history" --db "$db" export "$id" | awk -F, -v text="$([[ $setting == text ]] && echo 1 || echo 0)" \
        -v tag="$setting $size $strategy $key $id" '
        NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        {
          t = text ? $col["test_loss"] / log(2) : 100 * $col["test_accuracy"]; v = $col["val_accuracy"]
          if (n == 0 || v > vb) { vb = v; tb = t }
          tf = t; n++
        }
        END { printf "%s %.4f %.4f\n", tag, tf, tb }' >> "$out/runs.txt"
    done
  done
done
