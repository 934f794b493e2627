#!/usr/bin/env bash
# Issue 29: --max-memory MIB and the recovery from an out-of-memory error
# inside a step, through the dtrain binary on the CPU:
#   - an OOM forced mid-run (DT_TEST_MAX_MEMORY_FROM_STEP: the cap applies
#     after step 2, and only micro-batch 512 exceeds it) is recovered from:
#     a line with `out of memory` and the new micro-batch, an "oom" record in
#     the metrics file, and final parameters and momenta within 1e-6 of a run
#     with micro-batch 256 and twice the accumulation from the start (steps 1
#     and 2 summed each micro-batch's gradient in one piece: not bitwise);
#     on 1 rank, on 2 ranks (DDP, ZeRO 1, one rank alone out of memory:
#     DT_TEST_MAX_MEMORY_RANK) and in --mode dp (with 4 replicas: an
#     epoch's last micro-batch whose last piece is smaller than the
#     replicas runs that piece with the one before);
#   - an OOM in the first step: bitwise equal to the halved run;
#   - a checkpoint keeps the halved micro-batch: a resume goes on with it,
#     and ends bitwise where the uninterrupted run ended;
#   - when even micro-batch 1 does not fit: an error with the breakdown and
#     the levers (--zero, --recompute, --precision); in --mode dp when a
#     piece would have fewer samples than the replicas;
#   - bad --max-memory values are refused (exit 2) naming the flag; --help
#     and doctor mention it; bench takes it.
# The caps (MiB) fit the MLP 784-512-512-10 under SGD with momentum on the
# CPU allocator's accounting: between steps 7.7 MiB (DDP 5.1), at the peak
# of a micro-batch of 512 about 14.2 (DDP 11.7), of 256 about 11.0 (8.4).
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
numpy_reader
obs_check=$(find_built tests/launch/obs_check) || exit 1
src=$(find_data_dir fashion-mnist gpt2 brown) || exit 1
export DT_DATA_DIR="$src"

run() { # nothing here may hang: a rank left waiting would
  timeout 300 "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}
mlp=(--model mlp --threads 1 --log-interval 0 --eval-batch 100)
same() { # same A B RTOL: checkpoints A and B (weights and momenta)
  "$py" "$numpy_tool" compare "$1" "$2" --rtol "$3"
}
ck() { echo "$tmp/$1/checkpoints/step_0000000$2"; }

# ---- one rank: the OOM at step 3 ---------------------------------------------
DT_TEST_MAX_MEMORY_FROM_STEP=2 run train "${mlp[@]}" --batch 512 --accum 2 --max-steps 4 \
  --max-memory 12 --run-dir "$tmp/oom1" --log-interval 5
expect 0 out "^out of memory in optimizer step 3 \(.*CPU out of memory.*\): redoing the step with micro-batch 256 and accum 4" \
  "1 rank: the OOM in step 3 is logged with the new micro-batch"
grep -q '"type":"oom","step":2,"epoch":1,"batch":4,.*"micro_batch":256,"accum":4,"retries":1' \
  "$tmp/oom1/metrics.jsonl"
check_status $? "1 rank: the metrics file records the recovery"
# --log-interval 5: a record is due after micro-batch 5, inside the step
# that runs out of memory (micro-batches 5 and 6): it comes once, after the
# redo, with a loss (not one of the abandoned attempt, with nothing summed)
[ "$(grep -c '"type":"train","step":2,"epoch":1,"batch":5,' "$tmp/oom1/metrics.jsonl")" = 1 ] &&
  ! grep -q '"type":"train".*"loss":0,' "$tmp/oom1/metrics.jsonl"
check_status $? "1 rank: no progress record of the abandoned attempt, one of the redone step"
train_loss() { sed -n 's/^epoch 1 train_loss=\([0-9.]*\) .*/\1/p' "$out"; }
oom_loss=$(train_loss)
run train "${mlp[@]}" --batch 256 --accum 4 --max-steps 4 --run-dir "$tmp/half1"
expect 0 out "^test_accuracy=" "1 rank: micro-batch 256, accum 4 from the start"
[ -n "$oom_loss" ] && [ "$(train_loss)" = "$oom_loss" ]
check_status $? "1 rank: the epoch's train_loss counts each micro-batch once ($oom_loss, $(train_loss))"
expect_cmd "1 rank: the recovered run's parameters within 1e-6 of the halved run's" \
  same "$(ck oom1 4)" "$(ck half1 4)" 1e-6

# ---- one rank: the OOM in the first step: bitwise --------------------------
run train "${mlp[@]}" --batch 1024 --max-steps 3 --max-memory 16 --run-dir "$tmp/first"
expect 0 out "^out of memory in optimizer step 1 .* micro-batch 512 and accum 2" \
  "an OOM in the first step"
run train "${mlp[@]}" --batch 512 --accum 2 --max-steps 3 --run-dir "$tmp/first_half"
expect_cmd "an OOM in the first step: the parameters bitwise equal to the halved run's" \
  same "$(ck first 3)" "$(ck first_half 3)" 0

# ---- a resume keeps the halved micro-batch ---------------------------------
DT_TEST_MAX_MEMORY_FROM_STEP=2 run train "${mlp[@]}" --batch 512 --accum 2 --max-steps 6 \
  --save-every 2 --max-memory 12 --run-dir "$tmp/res"
expect 0 out "micro-batch 256 and accum 4" "a run that saves every 2 steps recovers"
DT_TEST_MAX_MEMORY_FROM_STEP=2 run train "${mlp[@]}" --batch 512 --accum 2 --max-steps 6 \
  --save-every 2 --max-memory 12 --run-dir "$tmp/res2" --resume "$(ck res 4)"
expect 0 out "micro-batch 256 and accum 4, as the checkpoint's run had" \
  "the resume goes on with the checkpoint's micro-batch"
expect_not out "^out of memory" "the resumed run does not run out of memory again"
expect_cmd "the resumed run ends bitwise where the uninterrupted one did" \
  same "$(ck res2 6)" "$(ck res 6)" 0

# ---- two ranks: DDP, ZeRO 1, one rank alone, --mode dp ----------------------
two=(launch -n 2 --threads 1 -- train "${mlp[@]}" --max-steps 4)
run "${two[@]}" --batch 256 --accum 4 --run-dir "$tmp/half2"
expect 0 out "^test_accuracy=" "2 ranks: micro-batch 256, accum 4 from the start"
DT_TEST_MAX_MEMORY_FROM_STEP=2 run "${two[@]}" --batch 512 --accum 2 --max-memory 10 \
  --run-dir "$tmp/oom2" --log-interval 2
expect 0 out "^out of memory in optimizer step 3 .*micro-batch 256 and accum 4" \
  "2 ranks: the OOM in step 3 is recovered from"
expect_cmd "2 ranks: every record of the metrics file has its documented keys" \
  "$obs_check" metrics "$tmp/oom2/metrics.jsonl" --world 2 --ddp
grep -q '"type":"oom","step":2,' "$tmp/oom2/metrics.jsonl"
check_status $? "2 ranks: the metrics file records the recovery"
expect_cmd "2 ranks: the recovered run's parameters within 1e-6 of the halved run's" \
  same "$(ck oom2 4)" "$(ck half2 4)" 1e-6
DT_TEST_MAX_MEMORY_FROM_STEP=2 DT_TEST_MAX_MEMORY_RANK=1 run "${two[@]}" --batch 512 \
  --accum 2 --max-memory 10 --run-dir "$tmp/oom2r1"
expect 0 out "^out of memory in optimizer step 3 \(another rank ran out of memory\): .*micro-batch 256" \
  "2 ranks, rank 1 alone out of memory: rank 0 agrees and redoes the step too"
expect_cmd "2 ranks, one rank out of memory: the same parameters as both ranks" \
  same "$(ck oom2r1 4)" "$(ck oom2 4)" 0
run "${two[@]}" --zero 1 --batch 256 --accum 4 --run-dir "$tmp/half2z"
DT_TEST_MAX_MEMORY_FROM_STEP=2 run "${two[@]}" --zero 1 --batch 512 --accum 2 --max-memory 12 \
  --run-dir "$tmp/oom2z"
expect 0 out "^out of memory in optimizer step 3 .*micro-batch 256 and accum 4" \
  "2 ranks, ZeRO 1: the OOM is recovered from"
expect_cmd "2 ranks, ZeRO 1: within 1e-6 of the halved run" \
  same "$(ck oom2z 4)" "$(ck half2z 4)" 1e-6
# ZeRO 2 keeps the whole gradient while the step reduces it: the error
# comes in the last micro-batch's backward, after a progress record of the
# step's first (--log-interval 1), and it takes four halvings. Each redo's
# record of micro-batch 5 shows the same loss (the abandoned attempts'
# losses are not summed into the next record), to rounding.
run "${two[@]}" --zero 2 --batch 256 --accum 4 --run-dir "$tmp/half2z2"
DT_TEST_MAX_MEMORY_FROM_STEP=2 run "${two[@]}" --zero 2 --batch 512 --accum 2 --max-memory 12 \
  --run-dir "$tmp/oom2z2" --log-interval 1
expect 0 out "^out of memory in optimizer step 3 .*micro-batch 32 and accum 32" \
  "2 ranks, ZeRO 2: the OOM is recovered from"
expect_cmd "2 ranks, ZeRO 2: within 1e-6 of the run with micro-batch 256" \
  same "$(ck oom2z2 4)" "$(ck half2z2 4)" 1e-6
grep '"type":"train","step":2,"epoch":1,"batch":5,' "$tmp/oom2z2/metrics.jsonl" |
  sed 's/.*"loss":\([0-9.e-]*\),.*/\1/' >"$tmp/losses5"
awk 'NR == 1 { lo = hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 }
     END { exit !(NR == 5 && hi - lo < 1e-5) }' "$tmp/losses5"
check_status $? "2 ranks, ZeRO 2: every redo records micro-batch 5's loss alike ($(tr '\n' ' ' <"$tmp/losses5"))"
dp=(train "${mlp[@]}" --threads 2 --mode dp --devices cpu:0,cpu:1 --max-steps 4)
run "${dp[@]}" --batch 256 --accum 4 --run-dir "$tmp/halfdp"
DT_TEST_MAX_MEMORY_FROM_STEP=2 run "${dp[@]}" --batch 512 --accum 2 --max-memory 11 \
  --run-dir "$tmp/oomdp"
expect 0 out "^out of memory in optimizer step 3 .*micro-batch 256 and accum 4" \
  "--mode dp: the OOM is recovered from"
expect_cmd "--mode dp: within 1e-6 of the halved run" \
  same "$(ck oomdp 4)" "$(ck halfdp 4)" 1e-6
# 4 replicas, 4610 training images: micro-batch 1024 runs out of memory
# in step 3 and is halved to 512; the epoch's last micro-batch, 514, runs
# as 512 and 2 samples, too few to split across 4 replicas: they join the
# piece before (one of 514), within 1e-6 of a run without the cap.
small_image_data "$src" 4610 500
dp4=(train "${mlp[@]}" --threads 4 --mode dp --devices cpu:0,cpu:1,cpu:2,cpu:3 --batch 1024)
DT_DATA_DIR="$data" run "${dp4[@]}" --run-dir "$tmp/dp4"
DT_DATA_DIR="$data" DT_TEST_MAX_MEMORY_FROM_STEP=2 run "${dp4[@]}" --max-memory 12 \
  --run-dir "$tmp/oomdp4"
expect 0 out "^out of memory in optimizer step 3 .*micro-batch 512 and accum 2" \
  "--mode dp, 4 replicas: the OOM is recovered from, the epoch's last 514 samples run in one piece"
expect_cmd "--mode dp, 4 replicas: within 1e-6 of the run without the cap" \
  same "$(ck oomdp4 5)" "$(ck dp4 5)" 1e-6

# ---- even micro-batch 1 does not fit ----------------------------------------
small_brown_data "$src"
DT_TEST_MAX_MEMORY_FROM_STEP=1 run train --model gpt2-tiny --threads 1 --batch 2 --max-steps 3 \
  --warmup 0 --log-interval 0 --max-memory 115 --run-dir "$tmp/tiny"
expect 1 out "^out of memory in optimizer step 2 .*micro-batch 1 and accum 2" \
  "GPT-tiny: the first OOM halves the micro-batch to 1"
expect 1 err "out of memory at optimizer step 2 even with a micro-batch of 1 .*parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer state [0-9.]+ MiB.*--zero 1 or 2.*--recompute.*--precision bf16.*--max-memory" \
  "micro-batch 1 does not fit either: the breakdown and the levers"
# --mode dp, 4 replicas of GPT-tiny (110 MiB each between steps, 6 MiB
# more per sample): a piece smaller than the replicas cannot be split, so
# the recovery stops with the out-of-memory error where halving would make
# one: micro-batch 7 (4 and 3), and 10 after its halving to 5 (3, 3, 3, 1).
gdp=(train --model gpt2-tiny --ctx 16 --threads 4 --warmup 0 --log-interval 0 --sample-len 0
  --mode dp --devices cpu:0,cpu:1,cpu:2,cpu:3 --max-steps 2 --max-memory 122)
DT_TEST_MAX_MEMORY_FROM_STEP=1 run "${gdp[@]}" --batch 7 --run-dir "$tmp/gdp7"
expect 1 err "out of memory at optimizer step 2 even with a micro-batch of 7 \(of --batch 7, after 0 halvings; --mode dp splits each piece across its 4 replicas: halving it again would leave a piece of 3 samples\): .*--recompute" \
  "--mode dp, 4 replicas, micro-batch 7 out of memory: no piece of 3 (the error says why)"
DT_TEST_MAX_MEMORY_FROM_STEP=1 run "${gdp[@]}" --batch 10 --run-dir "$tmp/gdp10"
expect 1 out "^out of memory in optimizer step 2 .*micro-batch 5 and accum 2" \
  "--mode dp, 4 replicas, micro-batch 10 out of memory: halved to 5"
expect 1 err "out of memory at optimizer step 2 even with a micro-batch of 5 \(of --batch 10, after 1 halving; .*a piece of 3 samples\)" \
  "--mode dp, 4 replicas: micro-batch 5 out of memory too: no pieces of 3"

# ---- the flag --------------------------------------------------------------
for v in 0 -3 abc 1.5 99999999999; do
  run train --model mlp --max-memory "$v" --max-steps 1
  expect 2 err "invalid value '$v' for --max-memory" "train --max-memory $v is refused"
  run bench --model mlp --max-memory "$v" --steps 1
  expect 2 err "invalid value '$v' for --max-memory" "bench --max-memory $v is refused"
done
run bench --model mlp --max-memory 1 --steps 1 --warmup 0
expect 1 err "CPU out of memory.*cap 1.00 MiB" "bench --max-memory caps the CPU allocator"
run train --help
expect 0 out "--max-memory MIB" "train --help shows --max-memory"
run bench --help
expect 0 out "--max-memory MIB" "bench --help shows --max-memory"
run doctor
expect 0 out "--max-memory MIB" "doctor mentions --max-memory"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]
