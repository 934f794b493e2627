#!/usr/bin/env bash
# Checkpoints end to end (issue 13), through the dtrain binary:
#   - bit-exact resume: N steps = N/2 + resume + N/2, every parameter and
#     optimizer moment bitwise equal (the files compared byte for byte, and
#     the tensors by an independent numpy reader) for MLP and LeNet with
#     --accum 2, one process and DDP over 2 ranks;
#   - a stop by SIGTERM (one process) and SIGUSR1 to one rank (2 ranks: rank 0,
#     which was not signalled, still names SIGUSR1) at a
#     random moment: exit 75, then --resume auto reaches the same bits;
#   - a 2-rank checkpoint resumed on 1 and on 3 ranks (same global batch)
#     matches the uninterrupted 2-rank run within f32 tolerance;
#   - truncated, bit-flipped and mismatched checkpoints: exit 1 naming the
#     file and section (or the setting); --resume auto skips a damaged newest
#     one, saying why, and takes the previous;
#   - the default run directory: a name another run took in the same
#     second gets a -2 suffix; a working directory that cannot hold runs/
#     is an error naming --run-dir;
#   - a full disk (a small tmpfs, when it can be mounted) while saving: exit 1
#     naming ENOSPC, the previous checkpoint intact;
#   - dtrain launch --max-restarts: a rank killed (kill -9), and a rank
#     hung (SIGSTOP) until the watchdog ends the job (exit 70): the job
#     restarts from the newest complete checkpoint and finishes;
#   - kill -9 at random moments of a run that saves every step:
#     the newest complete checkpoint always loads (CKPT_KILL_TRIALS, 5 here;
#     20+ for the note).
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
numpy_reader
data_dir=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR="$data_dir"
run() { # run ARGS...: dtrain with a deadline
  timeout 300 "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}
run_in() { # run_in DIR ARGS...: run, with DIR as the working directory
  (cd "$1" && shift && run "$@" && exit "$rc")
  rc=$?
}
check() { expect_cmd "$@"; } # check DESCRIPTION COMMAND...: the command succeeds (check_lib.sh)
same_bits() { # same_bits CKPT_A CKPT_B
  cmp "$1/model.safetensors" "$2/model.safetensors" &&
    cmp "$1/trainer_state.bin" "$2/trainer_state.bin" &&
    "$py" "$numpy_tool" compare "$1" "$2"
}
ck() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
# One thread everywhere: the default thread count is measured at start
# (launch/threads.h), and two runs that measured a different load would
# sum in another order (not bitwise equal).
launch() { # launch NP ARGS...: NP ranks (1 = a plain process)
  local np=$1
  shift
  if [ "$np" = 1 ]; then "$dtrain" "$@" --threads 1; else "$dtrain" launch -n "$np" --threads 1 -- "$@"; fi
}

# ---- bit-exact resume ----
steps=8
for model in mlp lenet; do
  for np in 1 2; do
    d="$tmp/exact-$model-$np"
    common=(train --model "$model" --max-steps $steps --accum 2 --batch 16 --log-interval 0)
    launch "$np" "${common[@]}" --save-every $((steps / 2)) --run-dir "$d/full" >"$out" 2>"$err"
    rc=$?
    expect 0 out "^test_accuracy=" "$model on $np rank(s): $steps steps, saving at $((steps / 2))"
    launch "$np" "${common[@]}" --run-dir "$d/resumed" --resume "$(ck "$d/full" $((steps / 2)))" \
      >"$out" 2>"$err"
    rc=$?
    expect 0 out "resumed from .*step_0*$((steps / 2)): optimizer step $((steps / 2))" \
      "$model on $np rank(s): resumed at step $((steps / 2))"
    check "$model on $np rank(s), --accum 2: N = N/2 + resume + N/2, bitwise" \
      same_bits "$(ck "$d/full" $steps)" "$(ck "$d/resumed" $steps)"
  done
done

# --mode dp (one process, a replica per device), with and without ZeRO.
for zero in 0 1; do
  d="$tmp/dp$zero"
  common=(train --model mlp --max-steps 8 --accum 2 --batch 16 --log-interval 0 --mode dp
    --devices cpu:0,cpu:1 --optimizer adamw --zero "$zero")
  run "${common[@]}" --save-every 4 --run-dir "$d/full"
  run "${common[@]}" --run-dir "$d/resumed" --resume "$(ck "$d/full" 4)"
  expect 0 out "resumed from" "--mode dp --zero $zero: resumed at step 4"
  check "--mode dp --zero $zero: N = N/2 + resume + N/2, every file bitwise" \
    diff -r "$(ck "$d/full" 8)" "$(ck "$d/resumed" 8)"
done

# ---- a stop requested by a signal, then --resume auto ----
signal_stop() { # signal_stop NP SIGNAL VICTIM_RANK STEPS
  local np=$1 sig=$2 victim=$3 steps=$4 d="$tmp/stop-$1"
  local common=(train --model mlp --max-steps "$steps" --batch 32 --log-interval 0 --threads 1)
  launch "$np" "${common[@]}" --run-dir "$d/ref" >"$out" 2>"$err"
  launch "$np" "${common[@]}" --run-dir "$d/run" --save-every 250 >"$out" 2>"$err" &
  local job=$!
  for ((i = 0; i < 600; i++)); do # training has begun: the first checkpoint is there
    [ -f "$d/run/checkpoints/step_00000250/manifest.json" ] && break
    sleep 0.1
  done
  # A moment into the run (0-90 ms past the checkpoint): a second or more
  # had let a fast machine finish the run, and a signal to a process that
  # had exited is no stop at all.
  sleep "0.0$((RANDOM % 10))"
  local pid sent=0
  for pid in $(pgrep -f -- "--run-dir $d/run"); do
    if [ "$np" = 1 ] || tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null |
      grep -qx "OMPI_COMM_WORLD_RANK=$victim"; then
      kill -s "$sig" "$pid" 2>/dev/null && sent=1
    fi
  done
  wait $job
  rc=$?
  if [ "$rc" = 0 ] && [ "$sent" = 0 ]; then
    ok "$np rank(s): the run ended before SIG$sig could be sent (exit 0)"
  elif [ "$rc" = 0 ]; then
    # The signal came after the ranks' last agreement: the run had finished.
    expect 0 err "SIG$sig arrived after the last optimizer step: the run had finished" \
      "$np rank(s): SIG$sig after the last step: exit 0, saying so"
  else
    expect 75 out "stopped by SIG$sig after optimizer step [0-9]+; checkpoint .* saved" \
      "$np rank(s): SIG$sig to rank $victim stops every rank after its step, saved, exit 75"
  fi
  launch "$np" "${common[@]}" --run-dir "$d/run" --save-every 250 --resume auto >"$out" 2>"$err"
  rc=$?
  expect 0 out "^test_accuracy=" "$np rank(s): --resume auto after the stop finishes the run"
  check "$np rank(s): stopped by SIG$sig and resumed = uninterrupted, bitwise" \
    same_bits "$(ck "$d/ref" "$steps")" "$(ck "$d/run" "$steps")"
}
signal_stop 1 TERM 0 1500
signal_stop 2 USR1 1 900

# ---- dtrain launch --max-restarts: a rank killed, the job restarted ----
d="$tmp/restart"
"$dtrain" launch -n 2 --threads 1 --max-restarts 2 -- train --model mlp --max-steps 900 \
  --batch 32 --log-interval 0 --threads 1 --save-every 100 --run-dir "$d" >"$out" 2>"$err" &
job=$!
for ((i = 0; i < 600; i++)); do # until the first checkpoint is complete
  [ -f "$d/checkpoints/step_00000100/manifest.json" ] && break
  sleep 0.1
done
sleep 0.0$((RANDOM % 10)) # a moment, not the second that could see the run end
for pid in $(pgrep -f -- "--run-dir $d"); do
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" &&
    kill -9 "$pid"
done
wait $job
rc=$?
expect 0 err "restart 1 of 2: a rank died \((killed by signal 9: mpirun exited 137|another rank found its process gone; exit 69)\)" \
  "--max-restarts: kill -9 of rank 1 restarts the job, saying why"
expect 0 out "resumed from .*step_" "... which resumes from the newest complete checkpoint"
check "... and ends with the uninterrupted run's bits" \
  same_bits "$(ck "$tmp/stop-2/ref" 900)" "$(ck "$d" 900)"
# ---- --max-restarts after the watchdog: a rank hangs (SIGSTOP) ----
# Rank 1 is stopped once the first checkpoint is complete (the run has
# 1900 steps to go, far more than the moment it takes to stop it); rank 0's
# all-reduce passes --comm-timeout 5, its watchdog ends the job (exit 70),
# and the launcher starts it again from the newest complete checkpoint.
d="$tmp/watchdog"
timeout 900 "$dtrain" launch -n 2 --threads 1 --max-restarts 2 -- train --model mlp \
  --epochs 3 --max-steps 2000 --batch 32 --log-interval 0 --threads 1 --save-every 100 \
  --comm-timeout 5 --run-dir "$d" >"$out" 2>"$err" &
job=$!
for ((i = 0; i < 3000; i++)); do # until the first checkpoint is complete (5 min at most)
  [ -f "$d/checkpoints/step_00000100/manifest.json" ] && break
  sleep 0.1
done
stopped=0
for pid in $(pgrep -f -- "--run-dir $d"); do
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" &&
    kill -STOP "$pid" && stopped=$((stopped + 1))
done
wait $job
rc=$?
checks=$((checks + 1))
if [ "$stopped" = 1 ]; then echo "ok: rank 1 stopped (SIGSTOP) after the first checkpoint"; else
  fail "SIGSTOP reached $stopped ranks, expected rank 1 alone"; fi
expect 0 err "restart 1 of 2: the watchdog ended the job \(a collective did not complete in time; exit 70\)" \
  "--max-restarts: a hung rank's watchdog (exit 70) restarts the job, saying why"
expect 0 out "resumed from .*step_0*[1-9][0-9]*: optimizer step" \
  "... which resumes from the newest complete checkpoint"
expect 0 out "^test_accuracy=" "... and the restarted job finishes the run"
check "... at its last step" test -f "$(ck "$d" 2000)/manifest.json"
run launch -n 2 --max-restarts 1 -- train --model mlp
expect 2 err "--max-restarts resumes from the run's checkpoints: give train a --run-dir" \
  "--max-restarts without --run-dir is a command-line error"

# ---- another world size, the same global batch ----
d="$tmp/world"
common=(train --model mlp --max-steps 10 --log-interval 0)
launch 2 "${common[@]}" --batch 12 --save-every 5 --run-dir "$d/two" >"$out" 2>"$err"
rc=$?
expect 0 out "^test_accuracy=" "2 ranks x --batch 12: 10 steps, saving at 5"
# resume_on_1_and_3 SAVED FINAL RTOL [ZERO_ON_1 ZERO_ON_3]: $d/two's checkpoint
# (2 ranks x 12) on 1 and 3 ranks, the same global batch, against $d/two's end.
resume_on_1_and_3() {
  local saved=$1 final=$2 rtol=$3 np z
  for np in 1 3; do
    z=()
    [ $# -gt 3 ] && z=(--zero "$([ "$np" = 1 ] && echo "$4" || echo "$5")")
    launch "$np" "${common[@]}" --batch $((24 / np)) "${z[@]}" --run-dir "$d/on$np" \
      --resume "$(ck "$d/two" "$saved")" >"$out" 2>"$err"
    rc=$?
    expect 0 out "resumed from" \
      "the 2-rank checkpoint resumes on $np rank(s) (--batch $((24 / np)) ${z[*]})"
    check "resumed on $np rank(s) = the uninterrupted 2-rank run within f32 tolerance" \
      "$py" "$numpy_tool" compare "$(ck "$d/two" "$final")" "$(ck "$d/on$np" "$final")" \
      --rtol "$rtol"
  done
}
resume_on_1_and_3 5 10 1e-5
run "${common[@]}" --batch 12 --run-dir "$d/bad" --resume "$(ck "$d/two" 5)"
expect 1 err "global batch is 24, this run's 12 .*use --batch 24" \
  "another global batch is refused, naming the --batch that fits"

# ---- ZeRO: each rank writes its own optimizer shard; any sharding resumes ----
d="$tmp/zero"
common=(train --model mlp --max-steps 8 --accum 2 --log-interval 0 --optimizer adamw)
launch 2 "${common[@]}" --batch 12 --zero 2 --save-every 4 --run-dir "$d/two" >"$out" 2>"$err"
rc=$?
expect 0 out "^test_accuracy=" "--zero 2 on 2 ranks: 8 steps, saving at 4"
check "--zero 2: each rank's shard is its own file, listed in the manifest" \
  grep -q '"optimizer.rank00001.bin"' "$(ck "$d/two" 8)/manifest.json"
launch 2 "${common[@]}" --batch 12 --zero 2 --run-dir "$d/again" --resume "$(ck "$d/two" 4)" \
  >"$out" 2>"$err"
check "--zero 2 resumed on 2 ranks = uninterrupted, every file bitwise" \
  diff -r "$(ck "$d/two" 8)" "$(ck "$d/again" 8)"
resume_on_1_and_3 4 8 2e-5 0 1 # AdamW; --zero 0 on 1 rank, --zero 1 on 3
# A new run in the same run directory (no --resume) writes its shards over
# the old run's: rank 0's manifest must list the new ones, never a stale
# file that another rank has not replaced yet.
launch 2 "${common[@]}" --batch 12 --zero 2 --lr 0.02 --save-every 4 --run-dir "$d/two" \
  >"$out" 2>"$err"
launch 2 "${common[@]}" --batch 12 --zero 2 --lr 0.02 --save-every 4 --run-dir "$d/fresh" \
  >"$out" 2>"$err"
check "--zero 2: a run over an earlier run's checkpoints = the same run in a fresh directory" \
  diff -r "$(ck "$d/two" 8)" "$(ck "$d/fresh" 8)"

# ---- damaged and mismatched checkpoints ----
d="$tmp/damage"
common=(train --model mlp --max-steps 4 --batch 16 --log-interval 0)
run "${common[@]}" --save-every 2 --run-dir "$d/run"
expect 0 out "^test_accuracy=" "a run with checkpoints at steps 2 and 4"
flip() { # flip FILE OFFSET_FROM_END
  "$py" -c "import sys; p, k = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, 'rb').read()); b[len(b) - k] ^= 0x20; open(p, 'wb').write(b)" "$1" "$2"
}
cp -r "$(ck "$d/run" 4)" "$d/flipped"
flip "$d/flipped/trainer_state.bin" 100
run "${common[@]}" --run-dir "$d/x1" --resume "$d/flipped"
expect 1 err "flipped/trainer_state.bin: section 'optimizer': CRC32 mismatch" \
  "a flipped bit in the optimizer moments: exit 1 naming the file and section"
cp -r "$(ck "$d/run" 4)" "$d/flipped-w"
flip "$d/flipped-w/model.safetensors" 8
run "${common[@]}" --run-dir "$d/x2" --resume "$d/flipped-w"
expect 1 err "flipped-w/model.safetensors: tensor 5.bias: CRC32 mismatch" \
  "a flipped bit in the weights: exit 1 naming the file and tensor"
cp -r "$(ck "$d/run" 4)" "$d/cut"
truncate -s 2000 "$d/cut/trainer_state.bin"
run "${common[@]}" --run-dir "$d/x3" --resume "$d/cut"
expect 1 err "cut/trainer_state.bin: 2000 bytes, the manifest says .*section 'meta'|cut/trainer_state.bin.*section '.*': truncated" \
  "a truncated trainer state: exit 1 naming the file and section"
cp -r "$(ck "$d/run" 4)" "$d/nomanifest"
rm "$d/nomanifest/manifest.json"
run "${common[@]}" --run-dir "$d/x4" --resume "$d/nomanifest"
expect 1 err "no readable manifest \(an interrupted save\?\)" \
  "a checkpoint without its manifest does not exist"
cp -r "$(ck "$d/run" 4)" "$d/unlisted"
"$py" -c "import json, sys; p = sys.argv[1]; m = json.load(open(p)); m['files'] = [f for f in m['files'] if f['name'] != 'model.safetensors']; json.dump(m, open(p, 'w'))" \
  "$d/unlisted/manifest.json"
run "${common[@]}" --run-dir "$d/x7" --resume "$d/unlisted"
expect 1 err "unlisted/manifest.json does not list model.safetensors" \
  "a manifest that leaves out the weights (read unchecked otherwise) is refused"
run "${common[@]}" --seed 5 --run-dir "$d/x8" --resume "$(ck "$d/run" 4)"
expect 1 err "written with --seed 0, this run has --seed 5" "another seed is named as --seed"
run train --model lenet --max-steps 4 --batch 16 --log-interval 0 --run-dir "$d/x5" \
  --resume "$(ck "$d/run" 4)"
expect 1 err "the checkpoint was written with --model mlp, this run has --model lenet" \
  "another model is refused, naming the difference"
run "${common[@]}" --optimizer adamw --run-dir "$d/x6" --resume "$(ck "$d/run" 4)"
expect 1 err "written with --optimizer sgd, this run has --optimizer adamw" \
  "another optimizer is refused, naming the difference"
flip "$(ck "$d/run" 4)/trainer_state.bin" 100
run "${common[@]}" --max-steps 6 --run-dir "$d/run" --resume auto
expect 1 err "the checkpoint's LR schedule spans 4 optimizer steps, this run's 6: .*keep --epochs, --max-steps" \
  "--resume auto with another --max-steps is refused, naming flags --help lists"
expect_not err "schedule_steps|schedule-steps" "... and no field or flag that does not exist"
run "${common[@]}" --run-dir "$d/run" --resume auto
expect 0 out "skipping checkpoint .*step_00000004: .*section 'optimizer': CRC32 mismatch" \
  "--resume auto names the damaged newest checkpoint"
expect 0 out "resumed from .*step_00000002" "... and takes the previous complete one"
run "${common[@]}" --max-steps 4 --save-every 1 --keep 2 --run-dir "$d/keep"
expect 0 out "checkpoint .*step_00000004 saved: training waited [0-9.]+ ms \(the snapshot\)" \
  "each checkpoint's line: the training thread's wait and the background write"
check "--keep 2 leaves the newest 2 checkpoints" \
  test "$(ls "$d/keep/checkpoints")" = "$(printf 'step_00000003\nstep_00000004')"
run "${common[@]}" --max-steps 2 --run-dir "$d/keep"
expect 0 out "note: .*keep/checkpoints holds checkpoints of an earlier run \(newest step_00000004\)" \
  "a new run in a run directory with checkpoints says it does not resume them"
run "${common[@]}" --resume auto
expect 2 err "--resume auto looks for checkpoints in the run directory: give it with --run-dir" \
  "--resume auto without --run-dir is a command-line error"

# ---- the default run directory ----
# Every name a run could take in the next 30 s is taken already (as if
# another run had started in that second): the run claims the next one.
w="$tmp/cwd-busy"
mkdir -p "$w/runs"
now=$(date -u +%s)
for ((s = 0; s < 30; s++)); do
  mkdir -p "$w/runs/mlp-fashion-mnist-$(date -u -d "@$((now + s))" +%Y%m%d-%H%M%S)"
done
run_in "$w" train --model mlp --max-steps 1 --log-interval 0
expect 0 out "^dtrain train: run directory runs/mlp-fashion-mnist-[0-9]{8}-[0-9]{6}-2$" \
  "a run whose default directory another run took in the same second gets its own (-2)"
w="$tmp/cwd-blocked"
mkdir -p "$w"
touch "$w/runs" # runs/ cannot be made here (as in a read-only working directory)
run_in "$w" train --model mlp --max-steps 1 --log-interval 0
expect 1 err "the default run directory goes under runs/ in the working directory .*: give --run-dir DIR" \
  "a working directory that cannot hold runs/: exit 1 naming --run-dir"

# ---- a full disk while saving ----
disk="$tmp/small-disk"
mkdir -p "$disk"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=7m tmpfs "$disk" 2>/dev/null; then
  run train --model mlp --max-steps 6 --batch 16 --log-interval 0 --save-every 3 --run-dir "$disk/run"
  expect 1 err "(checkpoints/step_00000006|step_00000006).*No space left on device" \
    "a full disk while saving: exit 1 naming the file and ENOSPC"
  check "the previous checkpoint (step 3) is intact and loads" \
    "$dtrain" eval --checkpoint "$disk/run"
  umount "$disk"
else
  echo "skipped: a full disk (cannot mount a tmpfs here: needs root)"
fi

# ---- kill -9 at random moments while checkpoints are written ----
trials=${CKPT_KILL_TRIALS:-5}
killed_writing=0
for ((t = 1; t <= trials; t++)); do
  d="$tmp/kill$t"
  "$dtrain" train --model mlp --max-steps 100000 --batch 8 --log-interval 0 --threads 1 \
    --lr 0.01 --save-every 1 --keep 3 --run-dir "$d" >"$d.out" 2>&1 &
  job=$!
  # Once a first checkpoint is complete (one a step after it; --keep 3 soon
  # removes step 1's, so any complete one counts), a random moment.
  for ((i = 0; i < 600; i++)); do
    ls "$d"/checkpoints/*/manifest.json >/dev/null 2>&1 && break
    sleep 0.1
  done
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", r % 2000 / 1000 }')"
  ls "$d"/checkpoints/*/.*.tmp >/dev/null 2>&1 && killed_writing=$((killed_writing + 1))
  kill -9 $job
  wait $job 2>/dev/null
  run eval --checkpoint "$d"
  # (what the weights are worth is not the point: a long run may diverge)
  expect 0 out "^test_loss=(-?nan|[0-9.]+) test_accuracy=" \
    "kill -9 trial $t: the newest complete checkpoint loads ($(grep -o 'step_[0-9]*' "$out" | head -1))"
done
echo "kill -9 trials: $trials, $killed_writing of them with a temporary file present at the kill"

echo "checkpoint_cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
