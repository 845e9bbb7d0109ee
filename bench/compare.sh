#!/usr/bin/env bash
# Runs fedmoe-bench train and the PyTorch twin for the same stem in one go and
# prints both JSON lines and the ratio of samples per second.
#   bench/compare.sh [mlp|cnn] [repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
stem=${1:-mlp}
repeats=${2:-5}
steps=200
[[ $stem == cnn ]] && steps=50
ours=$(build/bench/fedmoe-bench train --stem "$stem" --steps "$steps" --repeats "$repeats")
theirs=$(/usr/bin/python3 bench/torch_model.py --stem "$stem" --steps "$steps" --repeats "$repeats")
echo "$ours"
echo "$theirs"
a=$(sed -E 's/.*"samples_per_s":([0-9.]+).*/\1/' <<<"$ours")
b=$(sed -E 's/.*"samples_per_s": ([0-9.]+).*/\1/' <<<"$theirs")
awk -v a="$a" -v b="$b" -v s="$stem" 'BEGIN { printf "{\"stem\":\"%s\",\"ratio_fedmoe_over_pytorch\":%.2f}\n", s, a / b }'
