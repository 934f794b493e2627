#!/usr/bin/env bash
# dtrain bench beside the same benchmark in PyTorch (tools/bench_torch.py),
# alternating the two for several rounds so that both see the same machine
# load, for MLP batch 128, LeNet-5 batch 64, GPT-2 tiny and Llama tiny batch 16 context
# 64, ResNet-18 batch 16 on 64 px RGB images and ResNet-18 (small stem) batch
# 64 on 28 px grey ones
# (the language models: AdamW, the LM's step). Prints the median steps/s of each and the ratio
# dtrain / PyTorch. Then weak scaling on 2 ranks of 1 thread each, MLP batch
# 128 and LeNet-5 batch 64 per rank: `dtrain launch -n 1` and `-n 2` beside
# PyTorch on 1 process and PyTorch DDP (gloo) on 2 (bench_torch.py --world 2),
# the four alternating; efficiency = samples/s on 2 ranks / (2 x samples/s on
# 1 rank) of each round, the median over the rounds, and the ratio.
#
#   tools/bench_compare.sh [--rounds R] [--steps N] [--gpt-steps N] [--threads T]
#                          [--only MODEL|scaling] [--no-scaling]
#
# Needs Debian's python3-torch (tools/setup.sh --bench).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
rounds=5
steps=200
gpt_steps=10
threads=$(nproc)
only=""
scaling=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --gpt-steps) gpt_steps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-scaling) scaling=0; shift ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_compare: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

case "$only" in
  "" | mlp | lenet | gpt2-tiny | llama-tiny | resnet18 | resnet18-small | scaling) ;;
  *) echo "bench_compare: --only $only: expected mlp, lenet, gpt2-tiny, llama-tiny, resnet18, resnet18-small or scaling" >&2; exit 2 ;;
esac

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

[ "$only" = scaling ] || printf '%-16s %14s %14s %16s\n' "benchmark" "dtrain step/s" "torch step/s" "dtrain/torch"
for config in "mlp 128 $steps" "lenet 64 $steps" "gpt2-tiny 16 $gpt_steps --ctx 64 --optimizer adamw --warmup 2" \
  "llama-tiny 16 $gpt_steps --ctx 64 --optimizer adamw --warmup 2" \
  "resnet18 16 $gpt_steps --image-size 64 --channels 3 --warmup 2" \
  "resnet18-small 64 $gpt_steps --warmup 2"; do
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
if [ "$only" != scaling ]; then
  echo "($rounds alternating rounds of $steps steps each ($gpt_steps for GPT-2, Llama and the ResNets), $threads threads, medians;"
  echo " OpenBLAS, whose GEMMs both run on: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
fi

# ---- weak scaling: 1 and 2 ranks of 1 thread each ----
[ "$scaling" = 1 ] && { [ -z "$only" ] || [ "$only" = scaling ]; } || exit 0
samples_per_s() { sed -n 's/^steps_per_s=[0-9.]* samples_per_s=\([0-9.]*\) .*/\1/p'; }
efficiency() { awk -v one="$1" -v two="$2" 'BEGIN { printf "%.3f", (one > 0) ? two / (2 * one) : 0 }'; }
dtrain_sps() { # ranks model batch
  "$dtrain" launch -n "$1" --threads 1 -- bench --model "$2" --batch "$3" --steps "$steps" \
    2> >(grep -v '^dtrain launch: mpirun ' >&2) | samples_per_s
}
torch_sps() { # ranks model batch
  "$python" "$root/tools/bench_torch.py" --world "$1" --model "$2" --batch "$3" --steps "$steps" \
    --threads 1 | samples_per_s
}
if [ -z "$only" ]; then echo; fi
printf '%-16s %14s %14s %16s\n' "weak scaling" "dtrain eff" "torch eff" "dtrain/torch"
for config in "mlp 128" "lenet 64"; do
  read -r model batch <<<"$config"
  ours1=() ours2=() theirs1=() theirs2=() ours_eff=() theirs_eff=()
  for ((r = 0; r < rounds; r++)); do
    ours1+=("$(dtrain_sps 1 "$model" "$batch")")
    ours2+=("$(dtrain_sps 2 "$model" "$batch")")
    theirs1+=("$(torch_sps 1 "$model" "$batch")")
    theirs2+=("$(torch_sps 2 "$model" "$batch")")
    ours_eff+=("$(efficiency "${ours1[r]}" "${ours2[r]}")")
    theirs_eff+=("$(efficiency "${theirs1[r]}" "${theirs2[r]}")")
  done
  a=$(printf '%s\n' "${ours_eff[@]}" | median)
  b=$(printf '%s\n' "${theirs_eff[@]}" | median)
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }')
  printf '%-16s %14.3f %14.3f %16s\n' "$model batch $batch" "$a" "$b" "${ratio}x"
  printf '%-16s %14.0f %14.0f   samples/s, 1 rank\n' "" \
    "$(printf '%s\n' "${ours1[@]}" | median)" "$(printf '%s\n' "${theirs1[@]}" | median)"
  printf '%-16s %14.0f %14.0f   samples/s, 2 ranks\n' "" \
    "$(printf '%s\n' "${ours2[@]}" | median)" "$(printf '%s\n' "${theirs2[@]}" | median)"
done
echo "($rounds alternating rounds of $steps steps each, 1 thread per rank; efficiency: samples/s on 2"
echo " ranks / (2 x on 1 rank) per round, median; PyTorch DDP over gloo; per-rank batch as shown)"
