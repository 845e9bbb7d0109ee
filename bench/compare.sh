#!/usr/bin/env bash
# Runs fedmoe-bench train and the PyTorch twin of the same model in one go and
# prints both JSON lines and the ratio of their throughputs (samples a second
# for the image model's stems, tokens a second for text).
#   bench/compare.sh [mlp|cnn|text] [repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-mlp}
repeats=${2:-5}
case $what in
  mlp) steps=200 ours_args=(--stem mlp) theirs=(bench/torch_model.py --stem mlp) key=samples_per_s ;;
  cnn) steps=50 ours_args=(--stem cnn) theirs=(bench/torch_model.py --stem cnn) key=samples_per_s ;;
  # text: the default model (context 32) on 128 windows a step: 4,096 tokens, as at context 128 before
  text) steps=20 ours_args=(--task text --batch 128) theirs=(bench/torch_text.py --batch 128) key=tokens_per_s ;;
  *) echo "compare: mlp, cnn or text, not '$what'" >&2; exit 2 ;;
esac
ours=$(build/bench/fedmoe-bench train "${ours_args[@]}" --steps "$steps" --repeats "$repeats")
theirs=$(/usr/bin/python3 "${theirs[@]}" --steps "$steps" --repeats "$repeats")
echo "$ours"
echo "$theirs"
a=$(sed -E "s/.*\"$key\":([0-9.]+).*/\\1/" <<<"$ours")
b=$(sed -E "s/.*\"$key\": ([0-9.]+).*/\\1/" <<<"$theirs")
awk -v a="$a" -v b="$b" -v s="$what" 'BEGIN { printf "{\"model\":\"%s\",\"ratio_fedmoe_over_pytorch\":%.2f}\n", s, a / b }'
