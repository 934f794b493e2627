#!/usr/bin/env bash
# Mixed precision (issue 12) through the binary:
#   - LeNet-5, one epoch of Fashion-MNIST: --precision bf16 and fp16 reach
#     test accuracy within 0.01 of fp32 (the same seed and data order);
#     fp16's progress line shows the loss scale and the skipped steps;
#   - DDP with bf16: 2 ranks x 32 match 1 process x 64 within 0.01;
#   - fp16 with an Inf injected into ONE rank's gradients (--debug-overflow
#     R:S) under mpirun, 2 ranks, with DDP and with ZeRO-1 (where each rank
#     holds other gradients): the step is skipped on every rank, the scale
#     halves, training continues, and the run ends exactly as when the other
#     rank overflows (the decision is the job's, not the rank's);
#   - the command line: tf32 on the CPU, --debug-overflow without fp16 and
#     --stochastic-rounding without bf16 or fp16 exit 2 with the reason.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
unshare_test_files
DT_DATA_DIR=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR
run() { run_within 900 "$@"; } # a loaded 2-core machine is slow
last_line_accuracy() { tail -1 "$out" | sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p'; }
# within A B TOL: |A - B| <= TOL (both numbers)
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }
# the lines of a run without its timings
untimed() { # (the resumed run's train_loss averages only its own micro-batches)
  grep -E '^(epoch 1 step|epoch 1 train_loss|test_accuracy)' "$1" |
    sed -e 's/ samples\/s.*//' -e 's/ time=.*//' -e 's/ train_loss=[0-9.]*//'
}

# ---- the command line --------------------------------------------------------
run train --precision tf32 --max-steps 1
expect 2 err "^dtrain train: --precision tf32 needs a CUDA device" "tf32 on the CPU is refused"
run bench --precision tf32 --steps 1
expect 2 err "^dtrain bench: --precision tf32 needs a CUDA device" "bench: tf32 on the CPU"
run train --precision half
expect 2 err "invalid value 'half' for --precision: expected one of fp32, tf32, bf16, fp16" \
  "an unknown precision"
run train --precision bf16 --debug-overflow 0:1
expect 2 err "--debug-overflow tests the GradScaler: it needs --precision fp16" \
  "--debug-overflow without fp16"
run train --stochastic-rounding --max-steps 1
expect 2 err "^dtrain train: --stochastic-rounding rounds the 16-bit working copy of the weights: it needs --precision bf16 or fp16" \
  "--stochastic-rounding without bf16 or fp16"
run bench --precision fp32 --stochastic-rounding --steps 1
expect 2 err "^dtrain bench: --stochastic-rounding .* needs --precision bf16 or fp16" \
  "bench: --stochastic-rounding with fp32"
run train --precision fp16 --debug-overflow 1
expect 2 err "invalid value '1' for --debug-overflow: expected RANK:STEP" "a bad RANK:STEP"
run bench --model lenet --precision bf16 --batch 8 --steps 2 --warmup 1
expect 0 out "^dtrain bench: model lenet .* precision bf16 " "bench names the precision"

# ---- LeNet-5, one epoch: bf16 and fp16 within 0.01 of fp32 ----------------------
declare -A acc
for p in fp32 bf16 fp16; do
  run train --precision "$p" --log-interval 100 --run-dir "$tmp/lenet-$p"
  acc[$p]=$(last_line_accuracy)
  expect 0 out "^test_accuracy=0\.[0-9]{4}$" "LeNet-5, one epoch, --precision $p"
done
expect 0 out "^epoch 1 step 100/[0-9]+ loss [0-9.]+ lr [0-9.e-]+ scale [0-9]+ skipped [0-9]+ " \
  "fp16: the progress line shows the loss scale and the skipped steps"
expect_cmd "fp16: the metrics records carry loss_scale and skipped_steps" \
  grep -Eq '"loss_scale":[0-9]+.*"skipped_steps":[0-9]+' "$tmp/lenet-fp16/metrics.jsonl"
for p in bf16 fp16; do
  checks=$((checks + 1))
  if awk -v a="${acc[fp32]}" 'BEGIN { exit !(a >= 0.85) }' && within "${acc[$p]}" "${acc[fp32]}" 0.01; then
    echo "ok: $p test_accuracy=${acc[$p]}, fp32 ${acc[fp32]} (|diff| <= 0.01)"
  else
    fail "$p test_accuracy=${acc[$p]}, fp32 ${acc[fp32]}: want fp32 >= 0.85 and $p within 0.01"
  fi
done

# ---- DDP with bf16: 2 ranks x 32 == 1 process x 64 ------------------------------
run train --precision bf16 --log-interval 0 --max-steps 400
single=$(last_line_accuracy)
run launch -n 2 -- train --precision bf16 --batch 32 --log-interval 0 --max-steps 400
ddp=$(last_line_accuracy)
expect 0 out "^test_accuracy=" "bf16, 2 ranks x 32"
checks=$((checks + 1))
if within "$ddp" "$single" 0.01; then
  echo "ok: bf16 DDP test_accuracy=$ddp, single process $single (|diff| <= 0.01)"
else
  fail "bf16 DDP test_accuracy=$ddp, single process $single: want within 0.01"
fi

# ---- fp16: an overflow on one rank skips the step on every rank -----------------
# 12 optimizer steps, the Inf at step 3 (0-based) on one rank only; every
# rank prints its lines (--verbose-ranks). The line after micro-batch 4 is
# the first after the skipped update.
overflow_run() { # overflow_run RANK ZERO
  run launch -n 2 -- train --model mlp --precision fp16 --batch 32 --max-steps 12 \
    --log-interval 1 --verbose-ranks --debug-overflow "$1:3" --zero "$2" \
    --run-dir "$tmp/overflow-$1-$2"
}
for zero in 0 1; do
  overflow_run 1 "$zero"
  cp "$out" "$tmp/rank1.out"
  expect 0 out "^(rank 0: )?epoch 1 step 3/12 .* scale 65536 skipped 0 " \
    "zero $zero: rank 0 before the overflow: scale 2^16"
  for r in 0 1; do
    prefix="rank $r: "
    [ "$r" = 0 ] && prefix=""
    expect 0 out "^${prefix}epoch 1 step 4/12 .* scale 32768 skipped 1 " \
      "zero $zero: rank $r skipped the step of rank 1's overflow and halved the scale"
    expect 0 out "^${prefix}epoch 1 step 12/12 .* scale 32768 skipped 1 " \
      "zero $zero: rank $r trained on to the end, no further skips"
  done
  expect 0 out "^test_accuracy=0\.[0-9]{4}$" "zero $zero: the run ends with its result"
  overflow_run 0 "$zero"
  expect 0 out "^epoch 1 step 4/12 .* scale 32768 skipped 1 " "zero $zero: rank 0's own overflow"
  checks=$((checks + 1))
  # rank 0's lines and the result do not depend on which rank overflowed
  a=$(untimed "$tmp/rank1.out")
  b=$(untimed "$out")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "ok: zero $zero: an overflow on rank 1 or on rank 0 gives the same run on rank 0"
  else
    fail "zero $zero: rank 0's run differs with the overflow on rank 1 vs rank 0: $(diff <(echo "$a") <(echo "$b") | head -6)"
  fi
done

# ---- the scaler in the checkpoint: resume is exact ------------------------------
# Steps 0-5 with the overflow at step 3 (scale 32768, 1 skipped, the
# optimizer 1 step behind the run), saved at 6; resumed there, the run ends
# exactly as the uninterrupted one.
fp16_run() { # fp16_run RUN_DIR [FLAGS...]
  local dir=$1
  shift
  run train --model mlp --precision fp16 --max-steps 12 --log-interval 1 --debug-overflow 0:3 \
    --save-every 6 --run-dir "$dir" "$@"
}
fp16_run "$tmp/whole"
expect 0 out "^epoch 1 step 12/12 .* scale 32768 skipped 1 " "fp16, one run of 12 steps"
cp "$out" "$tmp/whole.out"
expect_cmd "the checkpoint's trainer state has the scaler section" \
  grep -aq "scale_bits 0x47000000" "$tmp/whole/checkpoints/step_00000006/trainer_state.bin"
fp16_run "$tmp/resumed" --resume "$tmp/whole/checkpoints/step_00000006"
expect 0 out "^epoch 1 step 12/12 .* scale 32768 skipped 1 " "fp16 resumed at step 6"
checks=$((checks + 1))
a=$(untimed "$tmp/whole.out" | grep -E 'step (7|8|9|10|11|12)/|train_loss|test_accuracy')
b=$(untimed "$out" | grep -E 'step (7|8|9|10|11|12)/|train_loss|test_accuracy')
if [ -n "$a" ] && [ "$a" = "$b" ]; then
  echo "ok: resumed at step 6, the scaler and the optimizer's step count restored: the same run"
else
  fail "the resumed fp16 run differs from the uninterrupted one: $(diff <(echo "$a") <(echo "$b") | head -6)"
fi

echo "amp_cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
