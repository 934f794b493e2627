#!/usr/bin/env bash
# Distributed training from the command line, end to end:
#   - dtrain launch -n 2 -- train: the mpirun line it runs, DDP over 2 ranks,
#     only rank 0 prints (other ranks with --verbose-ranks), the final line;
#   - the main job (2 ranks x batch 32, one epoch) reaches >= 0.85 and matches
#     the single-process run with the same global batch (64) within 0.01;
#   - --grad-compress bf16: the main job within 0.01 of uncompressed, half the
#     all-reduced bytes (metrics file and bench); a compressed ZeRO run resumes
#     bit for bit; fp16 and dp mode train;
#   - launch -- bench: the DDP figures (ddp: and comm: lines);
#   - --mode dp --devices cpu:0,cpu:1 trains in one process;
#   - an image folder on 2 ranks x 16 gives one process x 32's losses;
#   - clear errors: bad --devices, a failing rank (prefixed "rank R:", the job
#     ends), launch without -n / --, mpirun missing.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR="$data_dir"

timeout_bin=$(command -v timeout) || { echo "ddp_cli_test: timeout(1) not found" >&2; exit 1; }
run() { # run with a deadline: nothing here may hang
  "$timeout_bin" 300 "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}
last_line_accuracy() { tail -1 "$out" | sed -n 's/^test_accuracy=\([0-9.]*\)$/\1/p'; }

# ---- launch: the mpirun line, DDP, rank 0 prints ----------------------------
run launch -n 2 -- train --model mlp --batch 32 --max-steps 20 --log-interval 20 --accum 2
expect 0 err "^dtrain launch: mpirun -np 2 (--bind-to none --map-by slot|--map-by slot:PE=[0-9]+ --bind-to core) -x OMP_NUM_THREADS=[0-9]+ -x DT_NUM_THREADS=[0-9]+ .*$(basename "$dtrain") train --model mlp" \
  "launch prints the mpirun command line"
expect 0 out "ddp world 2 .*per-rank batch 32, global batch 64" "the header names world and batches"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "rank 0 prints the final line"
expect_not out "^rank 1: " "other ranks are quiet"
[ "$(grep -c '^test_accuracy=' "$out")" = 1 ] || fail "test_accuracy printed more than once"

# placement: 2 ranks of 1 thread are bound to a core each where two cores are
# there; a --bind-to of the user's replaces dtrain's placement
run launch -n 2 --threads 1 --dry-run -- train --model mlp
cores=$(nproc)
if [ "$cores" -ge 2 ] && [ "$(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null)" = 0 ]; then
  expect 0 err "^dtrain launch: mpirun -np 2 --map-by slot:PE=1 --bind-to core -x OMP_NUM_THREADS=1 " \
    "each rank bound to a core of its own"
fi
run launch -n 2 --threads 1 --mpirun-arg=--bind-to --mpirun-arg=socket --dry-run -- train --model mlp
expect 0 err "^dtrain launch: mpirun -np 2 -x OMP_NUM_THREADS=1 .* --bind-to socket " \
  "the user's --bind-to alone places the ranks"
run launch -n 3 --threads "$cores" --dry-run -- train --model mlp
expect 0 err "^dtrain launch: mpirun -np 3 --bind-to none --map-by slot " \
  "more threads than cores: no binding"

run launch -n 2 -- train --model mlp --batch 16 --max-steps 10 --log-interval 5 --verbose-ranks
expect 0 out "^rank 1: epoch 1 step 10/10" "--verbose-ranks: rank 1 prints, prefixed"

# ---- the main job: 2 ranks x 32 == 1 process x 64 ---------------------------
run train --log-interval 0
single=$(last_line_accuracy)
expect 0 out "^test_accuracy=" "single process, batch 64, one epoch"
last_allreduce_bytes() { # of the last train record of a metrics file
  grep -o '"allreduce_bytes":[0-9.e+]*' "$1" | tail -1 | cut -d: -f2
}
run launch -n 2 -- train --batch 32 --log-interval 300 --run-dir "$tmp/run-f32"
ddp=$(last_line_accuracy)
ddp_bytes=$(last_allreduce_bytes "$tmp/run-f32/metrics.jsonl")
expect 0 out "^test_accuracy=" "2 ranks, batch 32 each, one epoch"
checks=$((checks + 1))
if [ -n "$single" ] && [ -n "$ddp" ] &&
  awk -v a="$ddp" -v b="$single" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a >= 0.85 && d <= 0.01) }'; then
  echo "ok: 2-rank test_accuracy=$ddp >= 0.85, single-process $single (|diff| <= 0.01)"
else
  fail "2-rank test_accuracy=$ddp, single-process $single: want >= 0.85 and within 0.01"
fi

# ---- --grad-compress: the main job in 16 bits ---------------------------------
run launch -n 2 -- train --batch 32 --log-interval 300 --run-dir "$tmp/run-bf16" --grad-compress bf16
bf16=$(last_line_accuracy)
bf16_bytes=$(last_allreduce_bytes "$tmp/run-bf16/metrics.jsonl")
expect 0 out "zero 0, grad-compress bf16$" "--grad-compress bf16: the header names it"
checks=$((checks + 1))
if [ -n "$bf16" ] && [ -n "$ddp" ] && [ -n "$bf16_bytes" ] && [ -n "$ddp_bytes" ] &&
  awk -v a="$bf16" -v b="$ddp" -v x="$bf16_bytes" -v y="$ddp_bytes" \
    'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a >= 0.85 && d <= 0.01 && x > 0 && 2 * x == y) }'; then
  echo "ok: --grad-compress bf16 test_accuracy=$bf16, uncompressed $ddp (|diff| <= 0.01); allreduce_bytes $ddp_bytes -> $bf16_bytes per step"
else
  fail "--grad-compress bf16: test_accuracy=$bf16 vs $ddp (want >= 0.85, within 0.01); allreduce_bytes $bf16_bytes vs $ddp_bytes (want half)"
fi
run launch -n 2 -- train --model mlp --batch 16 --max-steps 20 --log-interval 20 --accum 2 --clip 1 \
  --zero 2 --grad-compress fp16
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--grad-compress fp16 with --zero 2, --accum 2, --clip 1 trains"
# A compressed run resumes bit for bit (the casts are deterministic).
compressed=(train --model mlp --max-steps 8 --accum 2 --batch 16 --log-interval 0 --grad-compress bf16 --zero 1)
run launch -n 2 --threads 1 -- "${compressed[@]}" --save-every 4 --run-dir "$tmp/gc-full"
run launch -n 2 --threads 1 -- "${compressed[@]}" --run-dir "$tmp/gc-resumed" \
  --resume "$tmp/gc-full/checkpoints/step_00000004"
expect 0 out "resumed from .*step_0*4" "--grad-compress bf16 --zero 1: resumed at step 4"
check_same() { cmp "$1/model.safetensors" "$2/model.safetensors" && cmp "$1/trainer_state.bin" "$2/trainer_state.bin"; }
expect_cmd "--grad-compress bf16 --zero 1: 8 steps = 4 + resume + 4, bitwise" \
  check_same "$tmp/gc-full/checkpoints/step_00000008" "$tmp/gc-resumed/checkpoints/step_00000008"
run train --mode dp --devices cpu:0,cpu:1 --model mlp --max-steps 10 --log-interval 10 --grad-compress bf16
expect 0 out "mode dp: 2 replicas .*grad-compress bf16$" "--mode dp --grad-compress bf16: header"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--mode dp --grad-compress bf16 trains"
run train --grad-compress int8
expect 2 err "invalid value 'int8' for --grad-compress: expected one of none, bf16, fp16" \
  "a bad --grad-compress"

# ---- bench under the launcher ------------------------------------------------
run launch -n 2 -- bench --model mlp --batch 16 --steps 5 --warmup 1
expect 0 out "^ddp: world 2, per-rank batch 16, global batch 32, [0-9]+ buckets" "bench: ddp line"
expect 0 out "^steps_per_s=[0-9.]+ samples_per_s=[0-9.]+ ms_per_step=[0-9.]+$" "bench: throughput"
expect 0 out "^comm: allreduce_ms=[0-9.]+ overlapped_ms=[0-9.]+ hidden=[0-9]+% exposed_ms=[0-9.]+ allreduce_bytes=[0-9]+ \(per step\)$" \
  "bench: the reducer's communication figures"
bench_bytes=$(sed -n 's/^comm: .* allreduce_bytes=\([0-9]*\) .*/\1/p' "$out")
run launch -n 2 -- bench --model mlp --batch 16 --steps 5 --warmup 1 --grad-compress bf16
expect 0 out "^ddp: world 2, .* zero 0, grad-compress bf16$" "bench --grad-compress bf16: the ddp line"
bf16_bench_bytes=$(sed -n 's/^comm: .* allreduce_bytes=\([0-9]*\) .*/\1/p' "$out")
checks=$((checks + 1))
if [ -n "$bench_bytes" ] && [ -n "$bf16_bench_bytes" ] && [ "$bench_bytes" -gt 0 ] &&
  [ $((2 * bf16_bench_bytes)) = "$bench_bytes" ]; then
  echo "ok: bench allreduce_bytes $bench_bytes -> $bf16_bench_bytes per step with --grad-compress bf16"
else
  fail "bench allreduce_bytes '$bench_bytes' -> '$bf16_bench_bytes' with --grad-compress bf16: want half"
fi

# ---- ZeRO: --zero 1 and 2 train as --zero 0 (DDP and dp) ----------------------
zero_summary() { # the last progress line's loss and the final accuracy
  echo "$(grep '^epoch 1 step 12/12' "$out" | sed 's/.* loss \([0-9.]*\) .*/\1/') $(last_line_accuracy)"
}
for mode in ddp dp; do
  for z in 0 1 2; do
    if [ "$mode" = ddp ]; then
      run launch -n 2 -- train --model mlp --batch 16 --max-steps 6 --accum 2 --clip 1 \
        --optimizer adamw --lr 0.002 --log-interval 12 --zero "$z"
    else
      run train --mode dp --devices cpu:0,cpu:1 --model mlp --batch 32 --max-steps 6 --accum 2 \
        --clip 1 --optimizer adamw --lr 0.002 --log-interval 12 --zero "$z"
    fi
    expect 0 out "zero $z, grad-compress none$" "$mode --zero $z: the header names the stage"
    expect 0 out "^epoch 1 step 12/12 .* optimizer-state [0-9.]+ MiB grads [0-9.]+ MiB( \(\+[0-9.]+ MiB in flight\))?$" \
      "$mode --zero $z: the progress line's per-rank bytes"
    summary[$z]=$(zero_summary)
    state[$z]=$(grep '^epoch 1 step 12/12' "$out" | sed 's/.* optimizer-state \([0-9.]*\) MiB.*/\1/')
  done
  checks=$((checks + 1))
  if [ -n "${summary[0]}" ] && [ "${summary[0]}" = "${summary[1]}" ] && [ "${summary[0]}" = "${summary[2]}" ] &&
    awk -v a="${state[0]}" -v b="${state[1]}" 'BEGIN { exit !(b > 0 && b <= a / 2 + 0.01) }'; then
    echo "ok: $mode: --zero 0, 1, 2 give loss and accuracy ${summary[0]}; optimizer state ${state[0]} -> ${state[1]} MiB per rank"
  else
    fail "$mode: --zero 0/1/2 give '${summary[0]}' / '${summary[1]}' / '${summary[2]}', optimizer state ${state[0]} / ${state[1]} MiB"
  fi
done
run launch -n 2 -- bench --model mlp --batch 16 --steps 3 --warmup 1 --optimizer adamw --zero 2
expect 0 out "^ddp: world 2, .* zero 2, grad-compress none$" "bench --zero 2: the ddp line"
expect 0 out "^memory: optimizer_state_mib=[0-9.]+ grad_mib=[0-9.]+ in_flight_mib=[0-9.]+ \(per rank\)$" \
  "bench: per-rank memory"

# ---- data-parallel mode -----------------------------------------------------
run train --mode dp --devices cpu:0,cpu:1 --model mlp --max-steps 10 --log-interval 10 --accum 2 --clip 1
expect 0 out "mode dp: 2 replicas" "--mode dp: header"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--mode dp --devices cpu:0,cpu:1 trains"
run train --mode dp --devices cpu:0,gpu:1
expect 2 err "invalid value 'cpu:0,gpu:1' for --devices: .*unknown device 'gpu:1'" "bad --devices item"
run train --mode dp --devices cpu:0,,cpu:1
expect 2 err "invalid value 'cpu:0,,cpu:1' for --devices: .*empty item" "empty --devices item"
run train --mode dp --devices cpu:0,cpu:0 --max-steps 1
expect 1 err "dtrain: error: .*device cpu:0 is listed twice" "duplicate --devices"
run train --mode dp
expect 2 err "dtrain train: --mode dp needs the replicas' devices" "--mode dp without --devices"
run train --devices cpu:0,cpu:1
expect 2 err "dtrain train: --devices 'cpu:0,cpu:1' is for --mode dp" "--devices without --mode dp"

# ---- a failing rank ends the job, with its rank ------------------------------
start=$(date +%s)
run launch -n 2 -- train --data-dir "$tmp/no-such-dir"
checks=$((checks + 1))
if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
  fail "a failing rank: exit $rc (124 = hung)"
elif ! grep -Eq "^dtrain: error: rank [01]: .*no-such-dir/fashion-mnist not found" "$err"; then
  fail "a failing rank: no 'dtrain: error: rank R:' message"
elif [ $(($(date +%s) - start)) -gt 60 ]; then
  fail "a failing rank: the job took more than 60 s to end"
else
  echo "ok: a failing rank prints 'rank R:' and ends the job (exit $rc)"
fi
run launch -n 2 -- train --mode dp --devices cpu:0,cpu:1
expect 1 err "dtrain: error: rank [01]: .*--mode dp runs one process" "--mode dp under a launcher"

# ---- launch's own command line -----------------------------------------------
run launch -- train
expect 2 err "dtrain launch: the number of ranks is required: -n N" "launch without -n"
run launch -n 2 train
expect 2 err "put the dtrain command after --" "launch without --"
run launch -n 0 -- train
expect 2 err "invalid value '0' for -n" "launch -n 0"
run launch -n 2 -- doctor
expect 2 err "'doctor' cannot run on several ranks" "launch of a non-distributed command"
run launch -n 512 --dry-run -- train --batch 8
expect 0 err "mpirun -np 512 .*-x OMP_NUM_THREADS=1 -x DT_NUM_THREADS=1 .*--oversubscribe" \
  "more ranks than cores: one thread each, --oversubscribe"
# The MCA settings of launch/mca_params.def (tools/gpu_check.sh reads them
# from this line): the one-node ones only without --hosts, none the user set.
run launch -n 2 --dry-run -- train
expect 0 err "mpirun -np 2 .* --mca btl self,vader --mca btl_vader_single_copy_mechanism none .*train$" \
  "launch passes launch/mca_params.def's MCA settings"
run launch -n 2 --hosts a,b --mpirun-arg --mca --mpirun-arg btl_vader_single_copy_mechanism \
  --mpirun-arg cma --dry-run -- train
expect_not err "--mca btl self|single_copy_mechanism none" \
  "several nodes: no shared-memory-only btl; the user's own --mca wins"
OMPI_MCA_btl=self,tcp run launch -n 2 --dry-run -- train
expect_not err "--mca btl self,vader" "OMPI_MCA_btl in the environment wins"
run launch -n 1 --threads 3 --mpirun-arg --tag-output --hosts a,b --dry-run -- bench
expect 0 err "mpirun -np 1 .*DT_NUM_THREADS=3 .*--host a,b --tag-output .*bench$" \
  "--threads, --hosts and --mpirun-arg reach mpirun"
# GPUs: the environment the ranks need, the one-rank-per-GPU default.
NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo CUDA_VISIBLE_DEVICES=0 DT_COMM_BACKEND=mpi \
  run launch -n 2 --dry-run -- train --device cuda
expect 0 err "mpirun -np 2 .*-x DT_COMM_BACKEND -x DT_DATA_DIR -x CUDA_VISIBLE_DEVICES .*train --device cuda$" \
  "DT_COMM_BACKEND and CUDA_VISIBLE_DEVICES reach the ranks"
expect 0 err "mpirun .*-x NCCL_DEBUG " "NCCL_DEBUG reaches the ranks"
expect 0 err "mpirun .*-x NCCL_SOCKET_IFNAME " "NCCL_SOCKET_IFNAME reaches the ranks"
DT_CPU_MEMORY_LIMIT=2G DT_DEBUG=1 run launch -n 2 --dry-run -- train
expect 0 err "mpirun -np 2 .*-x DT_CPU_MEMORY_LIMIT .*-x DT_DEBUG " "every DT_* variable set reaches the ranks"
expect_not err "-x DT_NUM_THREADS " "DT_NUM_THREADS goes with its per-rank value only"
DT_COMM_BACKEND=gloo run launch -n 2 --dry-run -- train
expect 1 err "^dtrain: error: environment variable DT_COMM_BACKEND: invalid value 'gloo'" \
  "a bad DT_* value stops launch before mpirun"
run launch -n 2 --dry-run -- train
expect_not err "CUDA_VISIBLE_DEVICES|DT_COMM_BACKEND|NCCL_" "unset variables are not exported"
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  run launch --dry-run -- train
  expect 2 err "the number of ranks is required: -n N \(no GPU is visible" \
    "launch without -n and without GPUs"
  run launch -n 2 -- train --device cuda --max-steps 1
  expect 1 err "dtrain: error: rank [01]: picking rank [01]'s GPU" "--device cuda without a GPU, 2 ranks"
fi
run launch --hosts a,b --dry-run -- train
expect 2 err "the number of ranks is required: -n N \(with --hosts" "launch --hosts without -n"
run launch -n 2 -- train --model mlp --max-steps 4 --log-interval 0 --comm-backend mpi
expect 0 out "ddp world 2 .*over mpi, comm timeout" "--comm-backend mpi on CPU ranks"
run launch -n 2 -- train --model mlp --max-steps 1 --comm-backend nccl
expect 1 err "dtrain: error: rank [01]: .*communication backend nccl .*device cpu" \
  "--comm-backend nccl on CPU ranks"

# ---- an image folder (issue 28): 2 ranks x 16 = 1 process x 32 ------------
# The augmentation's draws depend on (seed, epoch, sample index) only, not on
# the rank or the number of workers, so DDP reads the images one process
# would: the same losses and accuracy. --skip-bad-images' count is summed
# over the ranks.
run images --from fashion-mnist --out "$tmp/fm-png" --per-class 20
expect 0 out "400 written" "a PNG folder of 200 + 200 images"
head -c 60 "$tmp/fm-png/train/3_dress/$(ls "$tmp/fm-png/train/3_dress" | sed -n 4p)" >"$tmp/cut.png"
mv "$tmp/cut.png" "$tmp/fm-png/train/3_dress/$(ls "$tmp/fm-png/train/3_dress" | sed -n 4p)"
folder=(train --model lenet --data "$tmp/fm-png" --epochs 2 --log-interval 0 --workers 2
  --skip-bad-images)
run launch -n 2 --threads 1 -- "${folder[@]}" --batch 16 --run-dir "$tmp/img-ddp"
expect 0 out "^epoch 2 .*bad_images=1" "image folder on 2 ranks: one bad image, counted once"
grep '^epoch' "$out" | sed 's/ time=.*//' >"$tmp/img-ddp.txt"
"$timeout_bin" 300 "$dtrain" "${folder[@]}" --threads 1 --batch 32 --run-dir "$tmp/img-one" \
  >"$out" 2>"$err"
rc=$?
expect 0 out "^epoch 2 .*bad_images=1" "image folder in one process"
grep '^epoch' "$out" | sed 's/ time=.*//' >"$tmp/img-one.txt"
check "image folder: 2 ranks x 16 = 1 process x 32 (losses, accuracy)" \
  diff "$tmp/img-ddp.txt" "$tmp/img-one.txt"

PATH=/nonexistent DT_MPIRUN= run launch -n 2 -- train
expect 1 err "dtrain: error: dtrain launch needs Open MPI's mpirun, which is not on PATH" \
  "mpirun missing"
DT_MPIRUN=/nonexistent/mpirun run launch -n 2 -- train
expect 1 err "dtrain: error: DT_MPIRUN=/nonexistent/mpirun is not an executable file" \
  "DT_MPIRUN not executable"
run launch --help
expect 0 out "usage: dtrain launch \\[-n N\\]" "launch --help"

echo "ddp_cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
