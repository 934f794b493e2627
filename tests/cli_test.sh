#!/usr/bin/env bash
# The dtrain command line, tried as a new user would: help (generated from
# the flag tables, so it must list what the parser accepts), flag errors
# (exit 2, naming the flag and the accepted values), subcommand errors,
# bench, doctor's report and verdict, the DT_* environment, and clear
# failures (exit 1, no internal function names or file:line unless
# DT_DEBUG=1) for an unavailable device and a missing data folder.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/check_lib.sh"

# A user-facing message names no internal function (dt_...) and no
# source location (file.c:123).
# The help wraps long lines: $flat is the last stdout with each flag's
# help on one line.
flat="$tmp/flat"
flatten() { sed -E ':a;N;$!ba;s/\n {25}/ /g' "$out" >"$flat"; }
expect_plain() { # expect_plain DESCRIPTION
  expect_not err '\bdt_[a-z0-9_]+|[a-z_]+\.(c|cc|cu|h):[0-9]+' "$1: no internal names in the message"
}

# A tiny valid data set (8 random 28x28 images per split) for runs that
# need one, and an empty data folder.
tiny="$tmp/tiny/fashion-mnist"
mkdir -p "$tiny" "$tmp/empty"
for p in train t10k; do
  printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x1c\x00\x00\x00\x1c' >"$tiny/$p-images-idx3-ubyte"
  head -c 6272 /dev/urandom >>"$tiny/$p-images-idx3-ubyte"
  printf '\x00\x00\x08\x01\x00\x00\x00\x08\x01\x02\x03\x04\x05\x06\x07\x00' >"$tiny/$p-labels-idx1-ubyte"
done

run --help
expect 0 out "train" "dtrain --help lists train"
expect 0 out "bench" "dtrain --help lists bench"

run help train
expect 0 out "--batch" "dtrain help train shows the train flags"
run help --help
expect 0 out "^usage: dtrain help \[COMMAND\]" "dtrain help --help"
run help help
expect 0 out "^usage: dtrain help" "dtrain help help"
run help launch
expect 0 out "^usage: dtrain launch \[-n N\]" "dtrain help launch"
run help frobnicate
expect 2 err "unknown command 'frobnicate'" "dtrain help of an unknown command"
run help train bench
expect 2 err "dtrain help: unexpected argument 'bench'" "dtrain help takes one command"

run
expect 2 err "usage: dtrain" "dtrain without a command prints usage"

run frobnicate
expect 2 err "unknown command 'frobnicate'.*train.*bench" "unknown command lists the commands"

run train --help
flatten
expect 0 out "usage: dtrain train" "dtrain train --help"
for flag in model data data-dir epochs batch accum lr optimizer momentum nesterov weight-decay \
  schedule warmup clip seed threads device log-interval; do
  expect 0 out "--$flag" "dtrain train --help lists --$flag"
done
expect 0 flat "--batch N +micro-batch size .*\(default: 64\)" "train --help shows defaults"
expect 0 flat "--data NAME\|DIR .*one of fashion-mnist, mnist" "train --help lists the data sets"
expect 0 flat "--model NAME .*one of mlp, lenet" "train --help lists the models"
expect 0 flat "--optimizer NAME .*one of sgd, adamw" "train --help lists the optimizers"
expect 0 flat "--mode MODE .*one of ddp, dp" "train --help lists the modes"
expect 0 flat "--threads N .*0\.\.4096" "train --help gives the range of --threads"

# A language model's defaults come from its task (--model before the other flags).
run train --model gpt2-tiny --help
flatten
expect 0 flat "--optimizer NAME .*\(default: adamw\)" "gpt2-tiny's help shows its optimizer"
expect 0 flat "--beta2 B .*\(default: 0\.95\)" "gpt2-tiny's help shows beta2 0.95"
expect 0 flat "--clip NORM .*\(default: 1\)" "gpt2-tiny's help shows clipping at 1"
expect 0 flat "--data NAME\|DIR .*\(default: brown\)" "gpt2-tiny trains on brown by default"
for flag in ctx val-every val-batches sample-every sample-len temperature top-k prompt; do
  expect 0 out "--$flag" "dtrain train --help lists --$flag"
done
run train --model gpt2-tiny --ctx 65
expect 2 err "invalid value '65' for --ctx: model gpt2-tiny's context is 1 to 64" \
  "a context beyond the model's is a bad command line"
run bench --model lenet --ctx 8
expect 2 err "model lenet takes no sequence" "--ctx for an image model is a bad command line"
for flag in "--prompt hi" "--sample-len 8" "--temperature 0" "--top-k 3" "--sample-seed=4" \
  "--sample-every 2"; do
  # shellcheck disable=SC2086 # the flag and its value
  run train --model mlp --max-steps 1 $flag
  expect 2 err "^dtrain train: ${flag%%[ =]*}: model mlp does not generate text" \
    "$flag for an image model is refused as --ctx is (it was ignored)"
done

run bench --help
flatten
expect 0 out "--steps" "dtrain bench --help lists --steps"
expect 0 out "comm: allreduce_ms=" "bench --help names the line with the all-reduce time"
expect 0 flat "--comm-backend NAME .*one of auto, mpi, nccl" "bench --help lists the backends"
run doctor --help
expect 0 out "usage: dtrain doctor" "dtrain doctor --help"
expect 0 out "verdict" "doctor --help describes the verdict"
run launch --help
expect 0 out "-n, --np N +ranks to start" "launch --help from the flag table"
expect 0 out "--mpirun-arg ARG" "launch --help lists --mpirun-arg"

run train --foo 3
expect 2 err "dtrain train: unknown flag --foo \(see dtrain train --help\)" "unknown flag"
run train --foo=3
expect 2 err "unknown flag --foo " "unknown flag with ="
run bench --bar
expect 2 err "dtrain bench: unknown flag --bar" "unknown bench flag"

run train --batch abc
expect 2 err "invalid value 'abc' for --batch: expected a positive integer" "malformed int"
run train --batch=0
expect 2 err "invalid value '0' for --batch" "zero batch"
run train --lr=-1
expect 2 err "invalid value '-1' for --lr" "negative lr"
run train --lr 1e400
expect 2 err "invalid value '1e400' for --lr" "lr out of range"
run train --epochs 99999999999
expect 2 err "invalid value '99999999999' for --epochs" "int overflow"
run train --optimizer sgdx
expect 2 err "invalid value 'sgdx' for --optimizer: expected one of sgd, adamw" "optimizer choices"
run train --zero 3
expect 2 err "^dtrain train: invalid value '3' for --zero: expected an integer in 0\.\.2$" "bad --zero"
run bench --zero -1
expect 2 err "^dtrain bench: invalid value '-1' for --zero: expected an integer in 0\.\.2$" \
  "bad bench --zero"
run train --schedule linear
expect 2 err "invalid value 'linear' for --schedule: expected one of constant, cosine, step" \
  "schedule choices"
# Every name or enum flag: exit 2, the flag and the accepted values.
run train --model resnet101
expect 2 err "^dtrain train: invalid value 'resnet101' for --model: expected one of mlp, lenet, gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-135m, llama-1b, resnet18, resnet34, resnet50, resnet18-small, resnet34-small, resnet50-small$" \
  "unknown model"
expect_plain "unknown model"
run bench --model resnet101
expect 2 err "^dtrain bench: invalid value 'resnet101' for --model: expected one of mlp, lenet, gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-135m, llama-1b, resnet18, resnet34, resnet50, resnet18-small, resnet34-small, resnet50-small$" \
  "bench: unknown model"
run train --data cifar10
expect 2 err "invalid value 'cifar10' for --data: expected one of fashion-mnist, mnist" \
  "unknown data set"
run train --mode zero
expect 2 err "invalid value 'zero' for --mode: expected one of ddp, dp" "unknown mode"
run train --device tpu:0
expect 2 err "invalid value 'tpu:0' for --device: expected cpu, cpu:N, cuda or cuda:N" \
  "unknown device type"
run bench --device cuda:x
expect 2 err "invalid value 'cuda:x' for --device: expected cpu, cpu:N, cuda or cuda:N" \
  "bench: bad device index"
run bench --optimizer lamb
expect 2 err "invalid value 'lamb' for --optimizer: expected one of sgd, adamw" "bench optimizer"
run train --mode dp --devices cpu:0,tpu:1
expect 2 err "invalid value 'cpu:0,tpu:1' for --devices: .*unknown device 'tpu:1'" "bad --devices"
run train --mode dp
expect 2 err "dtrain train: --mode dp needs the replicas' devices: --devices cpu:0,cpu:1" \
  "--mode dp without --devices"
run train --devices cpu:0,cpu:1
expect 2 err "dtrain train: --devices 'cpu:0,cpu:1' is for --mode dp" "--devices without --mode dp"
# Numbers out of range.
run train --threads 100000
expect 2 err "invalid value '100000' for --threads: expected an integer in 0\.\.4096" \
  "absurd --threads"
run bench --threads 5000
expect 2 err "invalid value '5000' for --threads: expected an integer in 0\.\.4096" \
  "absurd bench --threads"
run train --epochs 0
expect 2 err "invalid value '0' for --epochs: expected a positive integer" "zero epochs"
# Issue 32: more micro-batches per step than an epoch holds ran one short step.
run train --accum 2147483647 --data-dir "$tmp/tiny" --batch 4 --run-dir "$tmp/accum-run"
expect 1 err "dtrain: error: --accum 2147483647 micro-batches per optimizer step is more than an epoch holds \(2 micro-batches of --batch 4 on this rank\): use --accum of at most 2" \
  "--accum beyond the epoch"
run train --gamma 0
expect 2 err "invalid value '0' for --gamma: expected a number > 0" "--gamma 0"
run train --comm-timeout 0
expect 2 err "invalid value '0' for --comm-timeout: expected a number > 0" "--comm-timeout 0"
run train --bucket-cap-mb -1
expect 2 err "invalid value '-1' for --bucket-cap-mb: expected a number > 0" "negative bucket"
run bench --steps 0
expect 2 err "invalid value '0' for --steps: expected a positive integer" "bench --steps 0"
run bench --warmup -1
expect 2 err "invalid value '-1' for --warmup: expected a non-negative integer" "bench --warmup -1"
run train --momentum nan
expect 2 err "invalid value 'nan' for --momentum" "NaN momentum"
# launch's flags go through the same parser.
run launch -n 0 -- train
expect 2 err "^dtrain launch: invalid value '0' for -n: expected a positive integer$" "launch -n 0"
run launch --np=two -- train
expect 2 err "invalid value 'two' for --np: expected a positive integer" "launch --np=two"
run launch --threads 0 -n 2 -- train
expect 2 err "invalid value '0' for --threads: expected an integer in 1\.\.4096" "launch --threads 0"
run launch --hostfile "$tmp/no-such-hostfile" -n 2 -- train
expect 2 err "invalid value '.*no-such-hostfile' for --hostfile: cannot read the file" \
  "launch --hostfile missing"
run launch --hosts a --hostfile /dev/null -n 2 -- train
expect 2 err "give --hosts or --hostfile, not both" "launch --hosts and --hostfile"
run launch --bogus -- train
expect 2 err "dtrain launch: unknown flag --bogus" "launch: unknown flag"
run launch -n 2
expect 2 err "missing the command to run after --" "launch without a command"
run train --nesterov=maybe
expect 2 err "invalid value 'maybe' for --nesterov" "malformed switch"
run train --batch
expect 2 err "flag --batch needs a value" "missing value"
run train extra
expect 2 err "unexpected argument 'extra'" "positional argument"

run bench --model mlp --batch 8 --steps 3 --warmup 1
expect 0 out "^steps_per_s=[0-9.]+ samples_per_s=[0-9.]+ ms_per_step=[0-9.]+$" "bench mlp"
expect 0 out "forward_ms=" "bench breakdown"
run bench --model lenet --batch 4 --steps 2 --warmup 0 --optimizer adamw --threads 1
expect 0 out "^steps_per_s=" "bench lenet adamw"

# No GPU here (or no CUDA backend in this build): a clear error, not a crash.
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  run train --device cuda:0
  expect 1 err "dtrain: error: .*cuda:0" "train on an unavailable CUDA device"
  expect_plain "unavailable CUDA device"
  DT_DEBUG=1 run train --device cuda:0
  expect 1 err "^dtrain: debug: the error arose in [a-z_]+ [a-z_]+\.c:[0-9]+$" \
    "DT_DEBUG=1 adds where the error arose"
fi
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  run train --device cuda
  expect 1 err "dtrain: error: picking rank 0's GPU: .*cuda" "train --device cuda without a GPU"
fi
# The communication backend: flag, environment, and nccl with CPU tensors.
run train --comm-backend nccl
expect 1 err "dtrain: error: .*communication backend nccl .*with device cpu: NCCL reduces GPU memory" \
  "--comm-backend nccl on the CPU"
expect_plain "--comm-backend nccl on the CPU"
run train --comm-backend gloo
expect 2 err "invalid value 'gloo' for --comm-backend: expected one of auto, mpi, nccl" \
  "--comm-backend choices"
DT_COMM_BACKEND=gloo run train
expect 1 err "^dtrain: error: environment variable DT_COMM_BACKEND: invalid value 'gloo': expected one of auto, mpi, nccl" \
  "bad DT_COMM_BACKEND"
DT_COMM_BACKEND=mpi run train --help
flatten
expect 0 flat "--comm-backend NAME .*\(default: mpi\)" "train --help shows DT_COMM_BACKEND as the default"
# Every DT_* variable is checked before a run starts.
DT_NUM_THREADS=abc run bench --steps 1
expect 1 err "^dtrain: error: environment variable DT_NUM_THREADS: invalid value 'abc': expected an integer in 1\.\.4096" \
  "bad DT_NUM_THREADS"
DT_CPU_MEMORY_LIMIT=lots run train --data-dir "$tmp/tiny"
expect 1 err "^dtrain: error: environment variable DT_CPU_MEMORY_LIMIT: invalid value 'lots': expected a byte count" \
  "bad DT_CPU_MEMORY_LIMIT"
DT_CUDNN_BENCHMARK=maybe run bench --steps 1
expect 1 err "environment variable DT_CUDNN_BENCHMARK: invalid value 'maybe': expected 1 or 0" \
  "bad DT_CUDNN_BENCHMARK"
DT_DEBUG=2 run train
expect 1 err "environment variable DT_DEBUG: invalid value '2'" "bad DT_DEBUG"

# doctor: one verdict line; exit 0 when the default job can run (its data
# set, mpirun, valid DT_* values), 1 naming what is missing.
one_verdict() { # the report has exactly one verdict line
  checks=$((checks + 1))
  local n
  n=$(grep -c 'verdict' "$out")
  if [ "$n" != 1 ]; then fail "$1: $n verdict lines"; else echo "ok: $1"; fi
}
NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo run doctor --data-dir "$tmp/tiny"
expect 0 out "^    NCCL_DEBUG=INFO$" "doctor lists NCCL_DEBUG"
expect 0 out "^    NCCL_SOCKET_IFNAME=lo$" "doctor lists NCCL_SOCKET_IFNAME"
expect 0 out "^verdict: ready for the default job" "doctor: ready with data and mpirun"
one_verdict "doctor: one verdict"
expect 0 out "^  fashion-mnist +ok " "doctor finds the data set"
expect 0 out "^  mpirun +/" "doctor finds mpirun"
# Every DT_* parameter with its value and default.
expect 0 out "^  DT_COMM_BACKEND +unset +default: auto$" "doctor: DT_COMM_BACKEND unset"
expect 0 out "^  DT_NUM_THREADS +unset +default: the cores" "doctor: DT_NUM_THREADS"
for v in DT_CPU_MEMORY_LIMIT DT_CPU_ALLOC_CACHE DT_CUDA_MEMORY_LIMIT DT_CUDA_TF32 \
  DT_CUDNN_BENCHMARK DT_DATA_DIR DT_MPIRUN DT_DEBUG DT_PARITY_TEST_DEVICE; do
  expect 0 out "^  $v +[^ ]+ +default: " "doctor lists $v"
done
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  expect 0 out "GPUs +none visible" "doctor says there is no GPU"
  expect 0 out "^verdict: .*GPU training: [0-9]+ problem" "the verdict mentions GPU training"
fi
# OpenMP's waits: a short spin unless the user chose (issue 32, defect 7).
env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY "$dtrain" doctor --data-dir "$tmp/tiny" >"$out" 2>"$err"
rc=$?
expect 0 out "^  openmp waits +OMP_WAIT_POLICY=unset GOMP_SPINCOUNT=1000 " \
  "doctor: dtrain started libgomp with a short spin"
env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active "$dtrain" doctor --data-dir "$tmp/tiny" >"$out" 2>"$err"
rc=$?
expect 0 out "^  openmp waits +OMP_WAIT_POLICY=active GOMP_SPINCOUNT=unset " \
  "doctor: the user's OMP_WAIT_POLICY stands"
env -u NCCL_DEBUG DT_COMM_BACKEND=mpi DT_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=0,1 \
  "$dtrain" doctor --data-dir "$tmp/tiny" >"$out" 2>"$err"
rc=$?
expect 0 out "^  DT_COMM_BACKEND +mpi +default: auto$" "doctor shows DT_COMM_BACKEND's value"
expect 0 out "^  DT_NUM_THREADS +1 +default: " "doctor shows DT_NUM_THREADS's value"
expect 0 out "^  CUDA_VISIBLE_DEVICES=0,1$" "doctor shows CUDA_VISIBLE_DEVICES"
DT_COMM_BACKEND=gloo run doctor --data-dir "$tmp/tiny"
expect 1 out "^    PROBLEM: environment variable DT_COMM_BACKEND: invalid value 'gloo'" \
  "doctor flags a bad DT_COMM_BACKEND"
expect 1 out "^verdict: NOT READY: .*valid DT_\* values" "doctor's verdict names it"
one_verdict "doctor: one verdict with a problem"
DT_TEST_REAL_CUDA=perhaps run doctor --data-dir "$tmp/tiny"
expect 0 out "^    PROBLEM \(for the tests that read it\): environment variable DT_TEST_REAL_CUDA: invalid value 'perhaps'" \
  "doctor flags a bad value of a variable only tests read (without failing the verdict)"
run doctor --data-dir "$tmp/empty"
expect 1 out "^verdict: NOT READY: .*the fashion-mnist data set under .*empty" \
  "doctor: the default job's data set is missing"
one_verdict "doctor: one verdict without data"
DT_MPIRUN="$tmp/no-such-mpirun" run doctor --data-dir "$tmp/tiny"
expect 1 out "^verdict: NOT READY: .*mpirun \(DT_MPIRUN is not an executable file\)" \
  "doctor: mpirun is missing"
PATH=/nonexistent "$dtrain" doctor --data-dir "$tmp/tiny" >"$out" 2>"$err"
rc=$?
expect 1 out "^verdict: NOT READY: .*mpirun \(not on PATH\)" "doctor: no mpirun on PATH"
run doctor --data-dir
expect 2 err "dtrain doctor: flag --data-dir needs a value" "doctor: a flag without its value"

missing="$tmp/no-such-dir"
run train --data-dir "$missing"
expect 1 err "dtrain: error: .*$missing/fashion-mnist.*tools/setup.sh" "missing data dir"
expect_plain "missing data dir"
DT_DEBUG=1 run train --data-dir "$missing"
expect 1 err "^dtrain: debug: the error arose in " "DT_DEBUG=1: where a data error arose"
DT_DATA_DIR="$missing" run train --data mnist
expect 1 err "$missing/mnist" "missing data dir from DT_DATA_DIR"

# A corrupt data set: a clear format error naming the file.
bad="$tmp/bad/fashion-mnist"
mkdir -p "$bad"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
  t10k-labels-idx1-ubyte; do
  printf 'not an idx file' >"$bad/$f"
done
run train --data-dir "$tmp/bad"
expect 1 err "dtrain: error: .*train-(images|labels)-idx" "corrupt data names the file"
expect_plain "corrupt data"

run train --data-dir "$tmp/tiny" --batch 4 --log-interval 0
expect 0 out "^test_accuracy=" "train on the tiny data set"
run train --data-dir "$tmp/tiny" --batch 4 --min-lr 1
expect 1 err "dtrain: error: .*min_lr 1: must be in \[0, base_lr" "--min-lr above --lr is refused"
run train --data-dir "$tmp/tiny" --batch 4 --warmup 5
expect 1 err "dtrain: error: .*total_steps \(2\) > warmup_steps \(5\)" "warm-up longer than the run"
run train --data-dir "$tmp/tiny" --batch 8 --model mlp --weight-decay 3e38
expect 1 err "dtrain: error: .*training diverged: the test loss is .*nan" \
  "parameters blown up by the last step are caught"
run train --seed " -1"
expect 2 err "invalid value ' -1' for --seed" "negative seed with a leading space"

echo "cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
