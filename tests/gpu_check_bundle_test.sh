#!/usr/bin/env bash
# Preparing the GPU bundle, here: tools/gpu_check.sh packs the CUDA suites
# and dtrain (as `bundle` does after building them) with their libraries,
# Open MPI's mpirun when present and bench_torch.py, lists it, stays under
# 64 MiB and leaves out the CUDA libraries the GPU machine has. Then `run`
# on the tarball: without a GPU the suites skip, dtrain doctor reports, and
# summary.md holds a row per suite.
set -euo pipefail
# The suites the bundle runs are GoogleTest binaries: Bazel's XML and
# premature-exit files are this test's, not theirs (each suite overwrote
# the XML, so ./test.sh counted whichever wrote last: 1 case or 664).
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE TEST_SHARD_STATUS_FILE GTEST_OUTPUT

ws="${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
script="$ws/tools/gpu_check.sh"
tmp="${TEST_TMPDIR:?}"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

bins=()
for b in tests/cuda_backend_test tests/cuda_allocator_test tests/cuda_loader_test \
  tests/cuda_train_step_test tests/op_table_test launch/dtrain; do
  [ -x "$ws/$b" ] || fail "$b missing from the runfiles"
  bins+=("$ws/$b")
done

tarball="$tmp/gpu_bundle.tar.xz"
GPU_CHECK_XZ_LEVEL=0 "$script" pack --no-data "$tarball" "${bins[@]}" >"$tmp/pack.log" 2>&1 ||
  { cat "$tmp/pack.log"; fail "pack failed"; }
cat "$tmp/pack.log"
listing=$(tar -tJf "$tarball")
has() { grep -qx "gpu_bundle/$1" <<<"$listing" || fail "the bundle lacks $1"; }
for b in cuda_backend_test cuda_allocator_test cuda_loader_test cuda_train_step_test \
  op_table_test dtrain; do
  has "bin/$b"
done
has lib/libcore_Slibcpu.so
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

# The plan: one line per step, NAME CAP_SECONDS, in order: the parity
# suites, then GPT-2 124M bf16 with both attention paths (the measurement
# that sets auto's default), then the rest; the caps add up to at most
# 450 s (the lease may be one call of 480 s); --extended adds more.
"$script" --plan >"$tmp/plan.txt" || fail "--plan failed"
cat "$tmp/plan.txt"
grep -vqE '^[a-z0-9_-]+ [1-9][0-9]*$' "$tmp/plan.txt" && fail "--plan printed a line that is not NAME CAP_SECONDS"
caps=$(awk '{ s += $2 } END { print s }' "$tmp/plan.txt")
[ "$caps" -le 450 ] || fail "the plan's caps add up to $caps s (> 450)"
[ "$(head -3 "$tmp/plan.txt" | awk '{ print $1 }' | tr '\n' ' ')" = \
  "op_table_test op_table_attention_gemm_test cuda_backend_test " ] || fail "the parity suites do not come first"
[ "$(sed -n '4,5p' "$tmp/plan.txt" | awk '{ print $1 }' | tr '\n' ' ')" = \
  "bench_gpt2_bf16 bench_gpt2_bf16_flash " ] || fail "GPT-2 bf16 with both attention paths does not come next"
[ "$(grep -c 'gpt2_step_vs_cpu' "$tmp/plan.txt")" = 0 ] ||
  fail "the CPU's GPT-2 124M step at T=1024 would run twice (cuda_train_step_test has it)"
"$script" --plan --extended >"$tmp/plan_ext.txt"
[ "$(head -n "$(wc -l <"$tmp/plan.txt")" "$tmp/plan_ext.txt")" = "$(cat "$tmp/plan.txt")" ] &&
  [ "$(wc -l <"$tmp/plan_ext.txt")" -gt "$(wc -l <"$tmp/plan.txt")" ] ||
  fail "--extended does not add steps after the plan's"
echo "plan: $(wc -l <"$tmp/plan.txt") steps, caps $caps s"

# run, here: no GPU, so the suites skip and the steps that need one are not run.
out="$tmp/results"
PYTHON=/bin/false "$script" run "$tarball" "$out" --deadline 300 >"$tmp/run.log" 2>&1 ||
  { cat "$tmp/run.log"; fail "run failed"; }
cat "$tmp/run.log"
[ -f "$out/summary.md" ] || fail "run wrote no summary.md"
files=$(find "$out" -type f | wc -l)
[ "$files" -le 8 ] || fail "run left $files files in OUT (at most 8 come back from the GPU machine)"
[ "$(ls "$out")" = "$(printf 'logs.tar.xz\nsummary.md')" ] || fail "OUT holds $(ls "$out" | tr '\n' ' ')"
tar -tJf "$out/logs.tar.xz" >"$tmp/logs.list"  # (grep -q on a pipe would SIGPIPE tar)
grep -q 'doctor.txt' "$tmp/logs.list" || fail "logs.tar.xz lacks doctor.txt"
grep -q 'op_table_test.log' "$tmp/logs.list" || fail "logs.tar.xz lacks the suite logs"
grep -q '^- glibc: ' "$out/summary.md" || fail "summary lacks the machine's facts"
grep -q 'state: finished, 0 failing step' "$out/summary.md" || fail "summary does not say it finished"
if ! nvidia-smi -L >/dev/null 2>&1; then
  # Without a GPU every parity case skips: reported as skipped, never as ok.
  for s in cuda_backend_test cuda_loader_test cuda_train_step_test; do
    grep -q "^| $s | skipped | 0 | 0 | [1-9][0-9]* |" "$out/summary.md" ||
      fail "summary row for $s is not 'skipped': $(grep "^| $s " "$out/summary.md")"
  done
  # These suites have CPU-side cases that pass (and GPU ones that skip).
  for s in cuda_allocator_test op_table_test; do
    grep -q "^| $s | ok | [1-9][0-9]* | 0 | [1-9][0-9]* |" "$out/summary.md" ||
      fail "summary row for $s: $(grep "^| $s " "$out/summary.md")"
  done
  for s in bench_gpt2_bf16 bench_gpt2_bf16_flash zero_vs_ddp bench_dtrain_resnet50_bf16; do
    grep -q "^| $s | not run | - | - | - | 0 | no GPU |" "$out/summary.md" ||
      fail "summary row for $s is not 'not run: no GPU': $(grep "^| $s " "$out/summary.md")"
  done
fi
# Every step of the plan has its row, in the plan's order; a suite this
# bundle lacks says so.
plan_rows=$(sed -n 's/^| \([a-z0-9_-]*\)\( (2 ranks)\)\{0,1\} | .*/\1/p' "$out/summary.md" | grep -v '^step$')
[ "$plan_rows" = "$(awk '{ print $1 }' "$tmp/plan.txt")" ] ||
  fail "the summary's rows are not the plan's steps in order: $(echo $plan_rows)"
grep -q '^| op_table_attention_gemm_test | skipped | .* not available in this build |' "$out/summary.md" ||
  fail "a suite missing from the bundle: $(grep '^| op_table_attention_gemm_test ' "$out/summary.md")"

# The comparing steps a GPU run makes (gpt2-step, zero), on a stand-in
# dtrain that prints what the real one does: within tolerance they pass,
# beyond it they fail, naming the values.
fake="$tmp/fake_dtrain"
cat >"$fake" <<'FAKE'
#!/usr/bin/env bash
dev=cpu z=0
while [ $# -gt 0 ]; do
  case "$1" in --device) dev=$2; shift ;; --zero) z=$2; shift ;; esac
  shift
done
case "$dev:$z" in
  cpu:*) echo "breakdown: forward_ms=1 backward_ms=2 optimizer_ms=1 peak_mem=1MiB loss=10.9512" ;;
  cuda:0:*) echo "breakdown: forward_ms=1 backward_ms=2 optimizer_ms=1 peak_mem=1MiB loss=${FAKE_CUDA_LOSS:-10.9519}" ;;
  cuda:2) echo "test_accuracy=${FAKE_ZERO2_ACC:-0.8512}" ;;
  cuda:*) echo "test_accuracy=0.8510" ;;
esac
FAKE
chmod +x "$fake"
"$script" gpt2-step "$fake" >"$tmp/gpt2_ok.log" 2>&1 || { cat "$tmp/gpt2_ok.log"; fail "gpt2-step within tolerance failed"; }
grep -q '^gpt2 step: .*cpu 10.9512 cuda:0 10.9519' "$tmp/gpt2_ok.log" || fail "gpt2-step line: $(cat "$tmp/gpt2_ok.log")"
if FAKE_CUDA_LOSS=11.2 "$script" gpt2-step "$fake" >"$tmp/gpt2_bad.log" 2>&1; then
  fail "gpt2-step passed with the losses 10.9512 and 11.2"
fi
grep -q 'differs from the CPU' "$tmp/gpt2_bad.log" || fail "gpt2-step failure: $(cat "$tmp/gpt2_bad.log")"
"$script" zero "$fake" "$tmp" mpi >"$tmp/zero_ok.log" 2>&1 || { cat "$tmp/zero_ok.log"; fail "zero within tolerance failed"; }
grep -q '^zero over mpi, 2 ranks: test_accuracy ddp 0.8510 zero1 0.8510 zero2 0.8512' "$tmp/zero_ok.log" ||
  fail "zero line: $(cat "$tmp/zero_ok.log")"
if FAKE_ZERO2_ACC=0.80 "$script" zero "$fake" "$tmp" mpi >"$tmp/zero_bad.log" 2>&1; then
  fail "zero passed with accuracies 0.851 and 0.80"
fi
echo "comparing steps: ok"

# Killed at a random moment (SIGKILL: no trap runs), the run still leaves a
# complete summary of what had run by then.
for trial in 1 2 3; do
  k="$tmp/killed$trial"
  delay=$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.3 + rand() * 4 }')
  PYTHON=/bin/false "$script" run "$tarball" "$k" >/dev/null 2>&1 &
  pid=$!
  sleep "$delay"
  pkill -KILL -P "$pid" 2>/dev/null || true
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ -f "$k/summary.md" ] || fail "killed after $delay s: no summary.md"
  head -1 "$k/summary.md" | grep -qx '# dtrain GPU check' || fail "killed after $delay s: summary truncated"
  grep -q '^state: ' "$k/summary.md" || fail "killed after $delay s: summary has no state line"
  echo "killed after $delay s: $(grep '^state: ' "$k/summary.md")"
done

# The bundle's Open MPI works where none is installed: hide the system's
# (a private mount namespace with empty directories over it) and start 2
# ranks with the bundled mpirun.
if [ -d "$tmp/unpacked/gpu_bundle/mpi/usr/bin" ] && command -v unshare >/dev/null &&
  unshare -m true 2>/dev/null; then
  bdir="$tmp/unpacked/gpu_bundle"
  mkdir -p "$tmp/empty"
  # with the MCA settings dtrain launch passes (run takes them the same way)
  mca=$(DT_MPIRUN="$(command -v mpirun)" "$ws/launch/dtrain" launch --dry-run -n 2 -- train 2>&1 |
    grep -o -- '--mca [^ ]* [^ ]*' | tr '\n' ' ')
  [ -n "$mca" ] || fail "dtrain launch --dry-run printed no --mca settings"
  grep -q -- "- mpirun: .*MCA from dtrain launch: --mca btl self,vader" "$out/summary.md" ||
    fail "run did not take its MCA settings from dtrain launch: $(grep -- '- mpirun' "$out/summary.md")"
  unshare -m --propagation private bash -c '
    set -e
    for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /etc/openmpi; do
      [ -d "$d" ] && mount --bind "$1" "$d"
    done
    for f in /usr/bin/mpirun /usr/bin/orterun /usr/bin/orted /usr/bin/mpiexec; do
      [ -e "$f" ] && mount --bind /dev/null "$f"
    done
    for f in /usr/lib/x86_64-linux-gnu/libmpi.so* /usr/lib/x86_64-linux-gnu/libopen-*.so*; do
      [ -e "$f" ] && mount --bind /dev/null "$f"
    done
    ! mpirun --version >/dev/null 2>&1
    export OPAL_PREFIX="$2/mpi/usr" LD_LIBRARY_PATH="$2/lib"
    export PMIX_MCA_mca_base_component_path="$2/mpi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
    read -ra mca <<<"$3"
    "$2/mpi/usr/bin/mpirun" --allow-run-as-root --oversubscribe --bind-to none "${mca[@]}" \
      -np 2 hostname
  ' _ "$tmp/empty" "$bdir" "$mca" >"$tmp/mpi_hidden.log" 2>&1 ||
    { cat "$tmp/mpi_hidden.log"; fail "the bundled mpirun does not run with the system's Open MPI hidden"; }
  [ "$(grep -c . "$tmp/mpi_hidden.log")" -ge 2 ] || { cat "$tmp/mpi_hidden.log"; fail "mpirun -np 2 did not start 2 ranks"; }
  echo "bundled mpirun, system Open MPI hidden: ok ($(tr '\n' ' ' <"$tmp/mpi_hidden.log"))"
else
  echo "SKIP: mount namespaces unavailable here: the hidden-MPI relocation check did not run"
fi
echo "PASS"
