#!/usr/bin/env bash
# Issue 9, end to end through the dtrain binary under mpirun:
#   - a command line only one rank gets wrong: that rank's message, prefixed
#     "rank R:", and the whole job ends at once (exit 2);
#   - ranks started with different settings (--lr, --seed, --data, ...) or
#     different data behind the same flags: every rank fails before the first
#     step naming the flag (or data set) and both values; per-rank flags
#     (--threads, --log-interval, --data-dir) may differ;
#   - output that cannot be written (stdout on /dev/full): exit 1, named,
#     with its cause also where the trainer's log flushed earlier;
#   - --bucket-cap-mb 1e30 / 1e-6 (no undefined float->size_t conversion);
#   - divergence named "nan" (not "-nan"), and with --clip by its size;
#   - data problems named for what they are, before the first step: a
#     directory, a symlink loop or a dangling link in place of a data file, a
#     file in place of the data folder; --eval-batch larger than the test set.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist mnist) || exit 1
export DT_DATA_DIR="$data_dir"

mpi_args=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x DT_NUM_THREADS=1)
[ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)
# mpmd "RANK0 ARGS" "RANK1 ARGS": one rank each, every job under a deadline.
mpmd() {
  local a0 a1
  read -r -a a0 <<<"$1"
  read -r -a a1 <<<"$2"
  start=$(date +%s)
  timeout 60 mpirun "${mpi_args[@]}" -np 1 "$dtrain" "${a0[@]}" : -np 1 "$dtrain" "${a1[@]}" \
    >"$out" 2>"$err"
  rc=$?
  elapsed=$(($(date +%s) - start))
}
quick() { # quick DESCRIPTION: the last job ended within 30 s
  checks=$((checks + 1))
  if [ "$elapsed" -le 30 ]; then echo "ok: $1 ended in ${elapsed}s"; else fail "$1 took ${elapsed}s"; fi
}
base="train --model mlp --max-steps 3 --log-interval 0 --comm-timeout 20"

# ---- one rank's bad command line ends the job --------------------------------
mpmd "$base" "$base --batch 0"
expect 2 err "^rank 1: dtrain train: invalid value '0' for --batch" "rank 1's flag error, with its rank"
quick "a bad flag on rank 1"
mpmd "$base --warmup -3" "$base"
expect 2 err "^dtrain train: invalid value '-3' for --warmup|^dtrain train: .*warmup" "rank 0's flag error"
quick "a bad flag on rank 0"

# ---- settings that must agree ---------------------------------------------------
drift() { # drift FLAG VALUE0 VALUE1
  mpmd "$base $1 $2" "$base $1 $3"
  expect 1 err "dtrain: error: rank [01]: ranks were started with different settings: rank 0 has $1 $2, rank 1 has $1 $3: start every rank with the same flags and data" \
    "$1 $2 vs $3 refused"
}
drift --lr 0.05 0.1
drift --seed 1 2
drift --data fashion-mnist mnist
drift --max-steps 3 4
drift --batch 32 64
drift --optimizer sgd adamw
drift --accum 1 2
quick "a configuration drift"

# The same flags, other files: rank 1's "fashion-mnist" holds MNIST.
mkdir -p "$tmp/other"
ln -sfn "$data_dir/mnist" "$tmp/other/fashion-mnist"
mpmd "$base" "$base --data-dir $tmp/other"
expect 1 err "ranks were started with different settings: rank 0 has data train: 60000 samples, f32\(1, 28, 28\) -> i32\(\), fingerprint [0-9a-f]+, rank 1 has data train: 60000 samples, .*fingerprint [0-9a-f]+" \
  "same flags, different data: the data sets' fingerprints differ"

# Per-rank flags may differ.
mpmd "$base --threads 1 --log-interval 1" "$base --threads 2 --data-dir $data_dir"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--threads, --log-interval and --data-dir may differ per rank"

# ---- bucket sizes at the edges ------------------------------------------------
mpmd "$base --bucket-cap-mb 1e30 --first-bucket-mb 1e-6" "$base --bucket-cap-mb 1e30 --first-bucket-mb 1e-6"
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--bucket-cap-mb 1e30 --first-bucket-mb 1e-6 train"

# ---- output that cannot be written --------------------------------------------
full() { # full DESCRIPTION ARGS...: stdout on /dev/full
  local what=$1
  shift
  timeout 120 "$dtrain" "$@" >/dev/full 2>"$err"
  rc=$?
  expect 1 err "^dtrain: error: writing the standard output failed: No space left on device" \
    "$what > /dev/full"
}
full "train" train --model mlp --max-steps 2 --log-interval 0
full "train --help" train --help
full "--help" --help
full "doctor" doctor
full "bench" bench --model mlp --steps 2 --warmup 1
full "tokenize --help" tokenize --help

# ---- divergence ----------------------------------------------------------------
run() { timeout 120 "$dtrain" "$@" >"$out" 2>"$err"; rc=$?; }
run train --model mlp --lr 1e6 --max-steps 30 --log-interval 5
expect 1 err "^dtrain: error: training diverged: loss is nan at epoch 1 step [0-9]+" "divergence says nan"
expect_no_minus_nan() {
  checks=$((checks + 1))
  if grep -q -- "-nan" "$err"; then fail "'-nan' printed"; else echo "ok: no '-nan'"; fi
}
expect_no_minus_nan
run train --model mlp --lr 1e6 --clip 1 --max-steps 30 --log-interval 5
expect 1 err "^dtrain: error: training diverged: loss is [0-9.e+]+ \(the first step's was 2\.[0-9]+\)" \
  "with --clip a huge finite loss is a divergence"

# ---- data problems, named before the first step ----------------------------------
bad="$tmp/bad/fashion-mnist"
mkdir -p "$bad"
for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz train-labels-idx1-ubyte.gz; do
  ln -sfn "$data_dir/fashion-mnist/$f" "$bad/$f"
done
images="$bad/train-images-idx3-ubyte.gz"
bad_data() { # bad_data PATTERN DESCRIPTION
  run train --model mlp --max-steps 2 --data-dir "$tmp/bad"
  expect 1 err "$1" "$2"
  checks=$((checks + 1))
  if grep -q "^epoch\|step " "$out"; then fail "$2: trained before failing"; else echo "ok: $2: before any step"; fi
}
mkdir "$images"
bad_data "^dtrain: error: .*train-images-idx3-ubyte.gz: is a directory, not an IDX file" "a directory as the images file"
rmdir "$images"
ln -s loop_b "$bad/loop_a"
ln -s loop_a "$bad/loop_b"
ln -s loop_a "$images"
bad_data "^dtrain: error: .*train-images-idx3-ubyte.gz: Too many levels of symbolic links" "a symlink loop"
rm "$images"
ln -s nowhere "$images"
bad_data "^dtrain: error: .*train-images-idx3-ubyte.gz: is a dangling symbolic link" "a dangling symlink"
mkdir -p "$tmp/filedir"
: >"$tmp/filedir/fashion-mnist"
run train --model mlp --max-steps 2 --data-dir "$tmp/filedir"
expect 1 err "^dtrain: error: data set folder .*filedir/fashion-mnist is not a directory" "a file as the data folder"
run train --model mlp --max-steps 2 --eval-batch 99999999 --log-interval 0
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "--eval-batch larger than the test set evaluates it in one batch"

echo "reliability_cli_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
