#!/usr/bin/env bash
# Preparing the GPU bundle, here: tools/gpu_check.sh packs the CUDA suites
# and dtrain (as `bundle` does after building them) with their libraries,
# Open MPI's mpirun when present and bench_torch.py, lists it, stays under
# 64 MiB and leaves out the CUDA libraries the GPU machine has. Then `run`
# on the tarball: without a GPU the suites skip, dtrain doctor reports, and
# summary.md holds a row per suite.
set -euo pipefail

ws="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
script="$ws/tools/gpu_check.sh"
tmp="${TEST_TMPDIR:?}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

bins=()
for b in tests/cuda_backend_test tests/cuda_allocator_test tests/cuda_train_step_test \
  tests/op_table_test launch/dtrain; do
  [ -x "$ws/$b" ] || fail "$b missing from the runfiles"
  bins+=("$ws/$b")
done

tarball="$tmp/gpu_bundle.tar.xz"
GPU_CHECK_XZ_LEVEL=0 "$script" pack --no-data "$tarball" "${bins[@]}" >"$tmp/pack.log" 2>&1 ||
  { cat "$tmp/pack.log"; fail "pack failed"; }
cat "$tmp/pack.log"
listing=$(tar -tJf "$tarball")
has() { grep -qx "gpu_bundle/$1" <<<"$listing" || fail "the bundle lacks $1"; }
for b in cuda_backend_test cuda_allocator_test cuda_train_step_test op_table_test dtrain; do
  has "bin/$b"
done
has lib/libcore_Slibbase.so
has lib/libcuda_Slibcuda.so
has lib/libopenblas.so.0
has bench_torch.py
has MANIFEST.txt
if ldd "$ws/tests/cuda_backend_test" | grep -q libcudart; then  # not in --config=cpu builds
  has fallback/libcudart.so.13
fi
if command -v mpirun >/dev/null && mpirun --version 2>&1 | grep -q "Open MPI"; then
  has mpi/usr/bin/mpirun
  grep -q 'gpu_bundle/mpi/usr/lib/.*/openmpi3/mca_.*\.so$' <<<"$listing" ||
    fail "the bundle lacks Open MPI's plugins"
fi
if grep -E 'gpu_bundle/(lib|fallback)/lib(cuda\.so|cublas|cudnn|nccl|c\.so|m\.so)' <<<"$listing"; then
  fail "the bundle carries libraries the GPU machine provides (above)"
fi
grep -q "of 64 MiB" "$tmp/pack.log" || fail "pack did not report the size"
size=$(stat -c %s "$tarball")
[ "$size" -lt $((64 * 1024 * 1024)) ] || fail "bundle is $size bytes, over 64 MiB"

# Every library a binary needs is in the bundle or is one the GPU machine
# provides (glibc, CUDA).
mkdir -p "$tmp/unpacked"
tar -C "$tmp/unpacked" -xJf "$tarball"
for b in "$tmp"/unpacked/gpu_bundle/bin/*; do
  for lib in $(ldd "$b" | awk '/=> \// { print $1 }'); do
    case "$lib" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libcuda.so* | \
        libcudart* | libcublas* | libcudnn* | libnccl*) continue ;;
    esac
    [ -e "$tmp/unpacked/gpu_bundle/lib/$lib" ] || [ -e "$tmp/unpacked/gpu_bundle/fallback/$lib" ] ||
      fail "$(basename "$b") needs $lib, which the bundle lacks"
  done
done

# run, here: no GPU, so the suites skip and training/bench are left out.
out="$tmp/results"
PYTHON=/bin/false "$script" run "$tarball" "$out" >"$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log"; fail "run failed"; }
cat "$tmp/run.log"
[ -f "$out/summary.md" ] || fail "run wrote no summary.md"
for s in cuda_backend_test cuda_allocator_test cuda_train_step_test op_table_test; do
  grep -q "^| $s | [0-9]* | 0 | [0-9]* | ok |$" "$out/summary.md" || fail "summary row for $s"
  [ -f "$out/$s.xml" ] || fail "no gtest XML for $s"
done
grep -q '^## dtrain doctor' "$out/summary.md" || fail "summary lacks dtrain doctor"
grep -q 'verdict' "$out/doctor.txt" || fail "doctor.txt lacks a verdict"
if ! nvidia-smi -L >/dev/null 2>&1; then
  grep -q 'training and bench: left out (no GPU)' "$out/summary.md" || fail "no-GPU note"
fi
echo "PASS"
