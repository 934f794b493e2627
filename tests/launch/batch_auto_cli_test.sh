#!/usr/bin/env bash
# --batch auto (issue 29) on bench and train under a CPU memory cap
# (DT_CPU_MEMORY_LIMIT): the micro-batch is the seed's rule
# min(free / the plan's memory per sample x 0.9, samples / 10), logged,
# and it fits the cap (bench's measured peak below it); --global-batch
# sets the accumulation (train); --max-memory caps what train's plan sees
# as it caps bench's; ranks whose plans differ take the smallest
# micro-batch; a model that cannot fit, and the flags' misuses, are clear
# errors.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
data_dir=$(find_data_dir fashion-mnist) || exit 1

# ---- bench: memory only (a synthetic batch has no data set) ----------------
DT_CPU_MEMORY_LIMIT=300M run_within 300 bench --model gpt2-tiny --batch auto --steps 1 --warmup 1 \
  --threads 1
expect 0 out "^batch auto: [0-9]+ \(the seed's rule min\(" "bench --batch auto: logged"
batch=$(grep -oE '^batch auto: [0-9]+' "$out" | grep -oE '[0-9]+$')
rule=$(grep -oE "per sample x 0.9\) = [0-9]+" "$out" | grep -oE '[0-9]+$')
peak=$(grep -oE 'peak_mem=[0-9.]+' "$out" | cut -d= -f2)
# 300 MiB: 110.4 MiB of weights, gradients and AdamW state and 27 MiB per
# sample of 64 tokens leave room for about 6; the rule's 0.9 a few less.
if [ -n "$batch" ] && [ "$batch" = "$rule" ] && [ "$batch" -ge 4 ] &&
  awk -v p="$peak" 'BEGIN { exit !(p > 0 && p <= 300) }'; then
  ok "bench --batch auto: micro-batch $batch (the rule's) peaks at $peak MiB under the 300 MiB cap"
else
  not_ok "bench --batch auto: micro-batch '$batch', rule '$rule', peak '$peak' MiB (cap 300)"
fi
DT_CPU_MEMORY_LIMIT=400M run_within 300 bench --model gpt2-tiny --batch auto --steps 1 --warmup 0 \
  --threads 1
more=$(grep -oE '^batch auto: [0-9]+' "$out" | grep -oE '[0-9]+$')
if [ -n "$more" ] && [ -n "$batch" ] && [ "$more" -gt "$batch" ]; then
  ok "bench --batch auto: a larger cap, a larger micro-batch ($batch -> $more)"
else
  not_ok "bench --batch auto: micro-batch '$more' under 400 MiB, '$batch' under 300 MiB"
fi

# ---- train: the data set's tenth, and the accumulation ---------------------
DT_CPU_MEMORY_LIMIT=1G run_within 300 train --model mlp --data-dir "$data_dir" --batch auto \
  --max-steps 1 --threads 1 --run-dir "$tmp/run1"
expect 0 out "batch auto: micro-batch 6000 \(the seed's rule min\(.*, 60000 samples / 10\) = 6000" \
  "train --batch auto: the data set's tenth when memory allows more"
expect 0 out "epochs 1 batch 6000 \(global 6000\) accum 1" "train --batch auto: the run takes it"
DT_CPU_MEMORY_LIMIT=64M run_within 300 train --model mlp --data-dir "$data_dir" --batch auto \
  --global-batch 6000 --max-steps 1 --threads 1 --run-dir "$tmp/run2"
expect 0 out "batch auto: micro-batch ([0-9]+) .*accumulation ([0-9]+), global batch 6000" \
  "train --batch auto --global-batch 6000 under 64 MiB: micro-batch x accumulation"
micro=$(grep -oE 'batch auto: micro-batch [0-9]+' "$out" | grep -oE '[0-9]+$')
accum=$(grep -oE 'accumulation [0-9]+' "$out" | grep -oE '[0-9]+$')
if [ -n "$micro" ] && [ -n "$accum" ] && [ "$accum" -gt 1 ] && [ $((micro * accum)) = 6000 ]; then
  ok "train: micro-batch $micro x accumulation $accum = 6000 under the 64 MiB cap"
else
  not_ok "train: micro-batch '$micro' x accumulation '$accum' (expected 6000, accumulation > 1)"
fi
# --max-memory 64 (no DT_CPU_MEMORY_LIMIT) is the cap the plan and its
# trial step see: the free memory bench --max-memory 64 sees, the
# micro-batch and accumulation of the run under DT_CPU_MEMORY_LIMIT=64M.
free_mib() { grep -oE 'min\([0-9.]+ MiB free' "$out" | grep -oE '[0-9.]+'; }
run_within 300 bench --model mlp --batch auto --max-memory 64 --steps 1 --warmup 0 --threads 1
bench_free=$(free_mib)
run_within 300 train --model mlp --data-dir "$data_dir" --batch auto --global-batch 6000 \
  --max-memory 64 --max-steps 1 --threads 1 --run-dir "$tmp/run4"
expect 0 out "batch auto: micro-batch $micro \(.*\), accumulation $accum, global batch 6000" \
  "train --batch auto --max-memory 64: micro-batch $micro x accumulation $accum, as under DT_CPU_MEMORY_LIMIT=64M"
train_free=$(free_mib)
if [ -n "$bench_free" ] && [ "$train_free" = "$bench_free" ]; then
  ok "train and bench --batch auto --max-memory 64: $train_free MiB free"
else
  not_ok "train --batch auto --max-memory 64: '$train_free' MiB free, bench's '$bench_free'"
fi
# Two ranks, only rank 1 under --max-memory 64 (DT_TEST_MAX_MEMORY_RANK):
# rank 1's plan takes micro-batch 3000, rank 0's the data set's tenth;
# every rank takes the smaller (different micro-batches were refused as
# "ranks were started with different settings").
DT_TEST_MAX_MEMORY_RANK=1 run_within 300 launch -n 2 --threads 1 -- train --model mlp \
  --data-dir "$data_dir" --batch auto --global-batch 12000 --max-memory 64 --max-steps 1 \
  --run-dir "$tmp/run5"
expect 0 out "batch auto: micro-batch $micro \(.*; another rank's, the smallest\), accumulation $accum, global batch 12000" \
  "2 ranks, rank 1 alone under --max-memory 64: both take rank 1's micro-batch $micro"
expect 0 out "^test_accuracy=" "2 ranks: the run goes on with it"

# ---- the trial steps: a micro-batch that runs out of memory is halved --------
# DT_TEST_BATCH_AUTO_OVERSHOOT=16 tries 16 x the rule's micro-batch first (a
# plan that underestimated): the trials halve it until a step fits.
DT_TEST_BATCH_AUTO_OVERSHOOT=16 DT_CPU_MEMORY_LIMIT=64M run_within 300 train --model mlp \
  --data-dir "$data_dir" --batch auto --global-batch 6000 --max-steps 2 --threads 1 \
  --run-dir "$tmp/run3"
expect 0 out "batch auto: micro-batch [0-9]+ \(.* = [0-9]+; [1-9][0-9]* trial step\(s\) out of memory, halved\), accumulation [0-9]+, global batch 6000" \
  "train --batch auto: trial steps out of memory halve the micro-batch"
micro3=$(grep -oE 'batch auto: micro-batch [0-9]+' "$out" | grep -oE '[0-9]+$')
rule3=$(grep -oE '\) = [0-9]+; ' "$out" | grep -oE '[0-9]+')
halved=$(grep -oE '[0-9]+ trial step' "$out" | grep -oE '^[0-9]+')
if [ -n "$micro3" ] && [ -n "$rule3" ] && [ "$micro3" -lt $((rule3 * 16)) ] &&
  [ "${halved:-0}" -ge 1 ] && [ $((6000 % micro3)) = 0 ]; then
  ok "train: the first trial (16 x the rule $rule3, at most 6000) ran out of memory: $halved halving(s) to $micro3"
else
  not_ok "train: micro-batch '$micro3', rule '$rule3', halvings '$halved'"
fi
expect 0 out "^test_accuracy=" "train: the run goes on at the halved micro-batch"

# ---- errors ------------------------------------------------------------------
DT_CPU_MEMORY_LIMIT=100M run_within 300 bench --model gpt2-tiny --batch auto --steps 1 --threads 1
expect 1 err "batch auto: model gpt2-tiny does not fit at micro-batch 1 .*ZeRO stage 1 or 2, recomputation" \
  "bench --batch auto: a model that cannot fit, with the levers"
run train --model mlp --batch 0
expect 2 err "invalid value '0' for --batch: expected a positive integer" "train --batch 0"
run bench --model mlp --batch 0
expect 2 err "invalid value '0' for --batch" "bench --batch 0"
run train --model mlp --global-batch 64
expect 2 err "--global-batch 64: needs --batch auto" "train --global-batch without --batch auto"
run train --model mlp --batch=auto --accum 2 --global-batch 64
expect 2 err "--global-batch 64: .*no --accum" "train --global-batch with --accum"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]
