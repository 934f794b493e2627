#!/usr/bin/env bash
# dtrain bench beside the same benchmark in PyTorch (tools/bench_torch.py),
# alternating the two for several rounds so that both see the same machine
# load, for MLP batch 128, LeNet-5 batch 64 and GPT-2 tiny batch 16 context
# 64 (AdamW, the LM's step). Prints the median steps/s of each and the ratio
# dtrain / PyTorch.
#
#   tools/bench_compare.sh [--rounds R] [--steps N] [--gpt-steps N] [--threads T] [--only MODEL]
#
# Needs Debian's python3-torch (tools/setup.sh --bench).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
rounds=5
steps=200
gpt_steps=10
threads=$(nproc)
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --gpt-steps) gpt_steps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_compare: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

python=/usr/bin/python3
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "bench_compare: PyTorch is not installed for $python: run tools/setup.sh --bench" >&2
  exit 1
fi

# Build (and set up) once through the wrapper, then call the binary directly.
"$root/dtrain" --help >/dev/null
# Same configuration as the wrapper's build (no -c opt: .bazelrc's -O2), so
# that this is the binary just built and not a stale one from another config.
dtrain="$(cd "$root" && bazel info bazel-bin 2>/dev/null)/launch/dtrain"

steps_per_s() { sed -n 's/^steps_per_s=\([0-9.]*\) .*/\1/p'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '%-16s %14s %14s %16s\n' "benchmark" "dtrain step/s" "torch step/s" "dtrain/torch"
for config in "mlp 128 $steps" "lenet 64 $steps" "gpt2-tiny 16 $gpt_steps --ctx 64 --optimizer adamw --warmup 2"; do
  read -r model batch n extra <<<"$config"
  [ -z "$only" ] || [ "$only" = "$model" ] || continue
  ours=()
  theirs=()
  for ((r = 0; r < rounds; r++)); do
    # shellcheck disable=SC2086 # $extra is a list of flags
    ours+=("$("$dtrain" bench --model "$model" --batch "$batch" --steps "$n" \
      --threads "$threads" $extra | steps_per_s)")
    # shellcheck disable=SC2086
    theirs+=("$("$python" "$root/tools/bench_torch.py" --model "$model" --batch "$batch" \
      --steps "$n" --threads "$threads" $extra | steps_per_s)")
  done
  a=$(printf '%s\n' "${ours[@]}" | median)
  b=$(printf '%s\n' "${theirs[@]}" | median)
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')
  printf '%-16s %14.3f %14.3f %16s\n' "$model batch $batch" "$a" "$b" "${ratio}x"
done
echo "($rounds alternating rounds of $steps steps each ($gpt_steps for GPT-2), $threads threads, medians)"
