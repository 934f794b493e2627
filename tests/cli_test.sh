#!/usr/bin/env bash
# The dtrain command line: help, flag errors, subcommand errors, bench, and
# clear failures for an unavailable device and a missing data folder.
set -uo pipefail

dtrain="${TEST_SRCDIR:-$(dirname "$0")/..}/dtrain/launch/dtrain"
[ -x "$dtrain" ] || dtrain="launch/dtrain"
[ -x "$dtrain" ] || { echo "cli_test: dtrain binary not found" >&2; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

lib="${TEST_SRCDIR:-$(dirname "$0")/..}/dtrain/tests/check_lib.sh"
[ -f "$lib" ] || lib="$(dirname "$0")/check_lib.sh"
# shellcheck source=tests/check_lib.sh
. "$lib"

run() {
  "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}

run --help
expect 0 out "train" "dtrain --help lists train"
expect 0 out "bench" "dtrain --help lists bench"

run help train
expect 0 out "--batch" "dtrain help train shows the train flags"

run
expect 2 err "usage: dtrain" "dtrain without a command prints usage"

run frobnicate
expect 2 err "unknown command 'frobnicate'.*train.*bench" "unknown command lists the commands"

run train --help
expect 0 out "usage: dtrain train" "dtrain train --help"
for flag in model data data-dir epochs batch accum lr optimizer momentum nesterov weight-decay \
  schedule warmup clip seed threads device log-interval; do
  expect 0 out "--$flag" "dtrain train --help lists --$flag"
done
expect 0 out "--batch N +micro-batch size \(default: 64\)" "train --help shows defaults"

run bench --help
expect 0 out "--steps" "dtrain bench --help lists --steps"
run doctor --help
expect 0 out "usage: dtrain doctor" "dtrain doctor --help"

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
expect 2 err "expected one of sgd\|adamw" "optimizer choices"
run train --schedule linear
expect 2 err "expected one of constant\|cosine\|step" "schedule choices"
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
run bench --model nosuchnet --steps 1
expect 1 err "dtrain: error: .*unknown model" "bench unknown model"

# No GPU here (or no CUDA backend in this build): a clear error, not a crash.
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  run train --device cuda:0
  expect 1 err "dtrain: error: .*cuda:0" "train on an unavailable CUDA device"
fi
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  run train --device cuda
  expect 1 err "dtrain: error: picking rank 0's GPU: .*cuda" "train --device cuda without a GPU"
fi
# The communication backend: flag, environment, and nccl with CPU tensors.
run train --comm-backend nccl
expect 1 err "dtrain: error: .*communication backend nccl .*with device cpu: NCCL reduces GPU memory" \
  "--comm-backend nccl on the CPU"
run train --comm-backend gloo
expect 2 err "invalid value 'gloo' for --comm-backend: expected one of auto\|mpi\|nccl" \
  "--comm-backend choices"
DT_COMM_BACKEND=gloo run train
expect 1 err "dtrain: error: environment variable DT_COMM_BACKEND: .*'gloo'" "bad DT_COMM_BACKEND"
DT_COMM_BACKEND=mpi run train --help
expect 0 out "--comm-backend NAME .*\(default: mpi\)" "train --help shows DT_COMM_BACKEND as the default"

# doctor: NCCL's transport environment and the backend choice.
NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=lo run doctor
expect 0 out "^    NCCL_DEBUG=INFO$" "doctor lists NCCL_DEBUG"
expect 0 out "^    NCCL_SOCKET_IFNAME=lo$" "doctor lists NCCL_SOCKET_IFNAME"
expect 0 out "DT_COMM_BACKEND not set: auto" "doctor: DT_COMM_BACKEND unset"
expect 0 out "^verdict: " "doctor ends with a verdict"
if [ "${DT_TEST_HAS_GPU:-0}" != 1 ]; then
  expect 0 out "GPUs +none visible" "doctor says there is no GPU"
fi
env -u NCCL_DEBUG DT_COMM_BACKEND=mpi CUDA_VISIBLE_DEVICES=0,1 "$dtrain" doctor >"$out" 2>"$err"
rc=$?
expect 0 out "^  DT_COMM_BACKEND=mpi " "doctor shows DT_COMM_BACKEND"
expect 0 out "^  CUDA_VISIBLE_DEVICES=0,1$" "doctor shows CUDA_VISIBLE_DEVICES"
DT_COMM_BACKEND=gloo run doctor
expect 0 out "DT_COMM_BACKEND=gloo +PROBLEM: .*'gloo'" "doctor flags a bad DT_COMM_BACKEND"
expect 0 out "^verdict: [0-9]+ problem\(s\) .*distributed settings are invalid" \
  "doctor's verdict counts it"

run train --device tpu:0
expect 1 err "dtrain: error: " "unknown device type"

missing="$tmp/no-such-dir"
run train --data-dir "$missing"
expect 1 err "dtrain: error: .*$missing/fashion-mnist.*tools/setup.sh" "missing data dir"
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

# A tiny valid data set (8 random 28x28 images per split) for flag checks
# that need a run to start.
tiny="$tmp/tiny/fashion-mnist"
mkdir -p "$tiny"
for p in train t10k; do
  printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x1c\x00\x00\x00\x1c' >"$tiny/$p-images-idx3-ubyte"
  head -c 6272 /dev/urandom >>"$tiny/$p-images-idx3-ubyte"
  printf '\x00\x00\x08\x01\x00\x00\x00\x08\x01\x02\x03\x04\x05\x06\x07\x00' >"$tiny/$p-labels-idx1-ubyte"
done
run train --data-dir "$tmp/tiny" --batch 4 --log-interval 0
expect 0 out "^test_accuracy=" "train on the tiny data set"
run train --data-dir "$tmp/tiny" --batch 4 --min-lr 1
expect 1 err "dtrain: error: .*min_lr 1: must be in \[0, base_lr" "--min-lr above --lr is refused"
run train --data-dir "$tmp/tiny" --batch 4 --warmup 5
expect 1 err "dtrain: error: .*total_steps \(2\) > warmup_steps \(5\)" "warm-up longer than the run"
run train --data-dir "$tmp/tiny" --batch 4 --schedule step --gamma 0
expect 1 err "dtrain: error: .*gamma 0: must be finite and > 0" "--gamma 0 is refused"
run train --data-dir "$tmp/tiny" --threads 100000
expect 1 err "dtrain: error: .*threads 100000: at most 4096" "absurd --threads is refused, no crash"
run bench --model mlp --batch 2 --steps 1 --threads 100000
expect 1 err "dtrain: error: .*threads 100000: at most 4096" "absurd bench --threads"
run train --data-dir "$tmp/tiny" --batch 8 --model mlp --weight-decay 3e38
expect 1 err "dtrain: error: .*training diverged: the test loss is .*nan" \
  "parameters blown up by the last step are caught"
run train --seed " -1"
expect 2 err "invalid value ' -1' for --seed" "negative seed with a leading space"

echo "cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
