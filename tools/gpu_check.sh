#!/usr/bin/env bash
# Checks the CUDA path on a GPU machine that has no Bazel (see
# ../shared/recipes/gpu-check.md).
#
#   tools/gpu_check.sh bundle [TARBALL]            on the development machine
#   tools/gpu_check.sh run [TARBALL] [OUT] [--deadline S] [--extended]   on the GPU machine
#   tools/gpu_check.sh --plan [--extended]         the steps of a run: NAME CAP_SECONDS
#   tools/gpu_check.sh size [CARRIED...]           what travels to the GPU machine
#   tools/gpu_check.sh pack [--no-data] TARBALL EXE...   bundle's packing step
#   tools/gpu_check.sh list TARBALL                what a bundle holds
#
# bundle: builds every cc_test / cc_binary under //tests/... whose name has
#   cuda, nccl, gpu or op_table in it (not the CPU selfcheck variants), and
#   //launch:dtrain, then packs them
#   (`pack`) into TARBALL (default out/gpu_bundle.tar.xz, git-ignored) and
#   checks with `size` that the working tree plus the tarball stay under
#   64 MiB (the device tool's limit for everything that travels).
# pack: stages EXE... into bin/ with the shared libraries the GPU machine may
#   lack (the workspace's own .so files, OpenBLAS, libgfortran, libgomp,
#   Open MPI's libraries, ...; never glibc, the driver, cuBLAS, cuDNN or
#   NCCL, which are large and present there; libstdc++/libgcc_s and
#   libcudart go to fallback/, used only where the machine's are missing or
#   older), Open MPI's mpirun with its plugins (mpi/, relocatable through
#   OPAL_PREFIX) when this machine has it, Fashion-MNIST (unless --no-data)
#   and tools/bench_torch.py; writes MANIFEST.txt, tars and lists.
# run: unpacks TARBALL, finds libcudart/libcublas/libcudnn/libnccl (the CUDA
#   toolkit, then pip's nvidia/*/lib under python3's site-packages), and
#   writes exactly two files into OUT (default $OUT, else out/gpu_results):
#   summary.md and logs.tar.xz (every step's log, nvidia-smi, dtrain doctor).
#   The summary opens with the machine's facts (GPU, driver, CUDA runtime,
#   cuDNN and NCCL loaded vs built against, glibc) and has a row per step,
#   in the plan's order (`--plan`; plan_steps below), most valuable first:
#   the parity suites (ops with every dtype, the attention rows on the GEMM
#   path, the backend: cuBLASLt, cuDNN in 16 bits), GPT-2 124M in bf16 at
#   T=1024 with both attention paths (the heads' GEMMs, auto's path, and
#   the fused flash kernels; tokens/s and MFU against the goal of the GPU's
#   kind: llm.c's ~468K on an H100, 550K on an H200) and PyTorch under bf16
#   autocast beside them, the training-step parity (with the CPU's GPT-2
#   124M step at T=1024, once), the allocator and loader suites, NCCL and
#   the host-staged backend (2 ranks under the bundled mpirun, with dtrain
#   launch's MCA settings), ZeRO 1/2 against DDP, LeNet-5 in bf16 on
#   cuda:0, ResNet-50 bf16 at 224 px beside torchvision's, then
#   channels-last (--channels-last) with its ratio to NCHW. Each step runs
#   within its cap, and the caps add up to at most 450 s; --extended adds
#   fp32 training, launch, traces, the other bench rows and ResNet-50 bf16
#   fed from a PNG folder (dtrain's loader against torchvision's
#   ImageFolder + DataLoader) beyond that.
#   A step whose subcommand, flag or model this build lacks is
#   "skipped: <command> not available in this build"; a suite whose cases
#   all skipped is "skipped", never "ok". The whole run has a deadline
#   (default 480 s, --deadline or GPU_CHECK_DEADLINE): each step gets what is
#   left (`timeout -k`), and the summary and the log tarball are rewritten
#   after every step (temporary name, then rename), so a run killed at any
#   moment leaves a complete summary of what ran. Without a GPU the suites
#   skip and the steps that need one are "not run: no GPU". Exit
#   status: 0 when no step failed.
set -uo pipefail

self=$(readlink -f "${BASH_SOURCE[0]}")
root=$(cd "$(dirname "$self")/.." && pwd)
mode=${1:-}
say() { echo "gpu_check: $*"; }
die() {
  echo "gpu_check: error: $*" >&2
  exit 1
}
limit=$((64 * 1024 * 1024))

# ---- packing (development machine) ----

# Libraries never bundled: glibc (the machine's own), the driver, and the
# CUDA libraries (large; the GPU machine has them).
skip_lib() {
  case "$(basename "$1")" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | \
      libresolv.so* | libutil.so* | libcuda.so* | libcublas* | libcudnn* | libnccl* | \
      libnvidia* | libnvrtc* | libnvJitLink*) return 0 ;;
  esac
  return 1
}

# Libraries bundled as fallbacks only (the machine's own win when present
# and new enough): the C++ runtime and the CUDA runtime.
fallback_lib() {
  case "$(basename "$1")" in
    libstdc++.so* | libgcc_s.so* | libcudart.so*) return 0 ;;
  esac
  return 1
}

# Copies the shared libraries of ELF file $1 into $2/lib or $2/fallback.
copy_deps() {
  local f=$1 stage=$2 lib
  ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }' | while read -r lib; do
    skip_lib "$lib" && continue
    if fallback_lib "$lib"; then
      cp -Ln "$lib" "$stage/fallback/" 2>/dev/null
    else
      cp -Ln "$lib" "$stage/lib/" 2>/dev/null
    fi
  done
}

# Open MPI's launcher with its plugins, laid out under mpi/usr so that
# OPAL_PREFIX relocates it (Debian's prefix is /usr); its libraries go to
# lib/. Returns 1 when this machine has no Open MPI.
stage_mpi() {
  local stage=$1 m="$1/mpi/usr" mpirun libdir
  mpirun=$(command -v mpirun) || return 1
  case "$("$mpirun" --version 2>/dev/null)" in *"Open MPI"* | *OpenRTE*) ;; *) return 1 ;; esac
  mpirun=$(readlink -f "$mpirun")
  libdir=$(ompi_info --path libdir --parsable 2>/dev/null | sed -n 's/^path:libdir:\(.*\)/\1/p')
  [ -n "$libdir" ] || libdir=/usr/lib/x86_64-linux-gnu/openmpi/lib
  mkdir -p "$m/bin" "$m/share"
  cp -L "$mpirun" "$m/bin/mpirun"
  [ -x /usr/bin/orted ] && cp -L /usr/bin/orted "$m/bin/orted"
  local rel=${libdir#/usr/}
  mkdir -p "$m/$rel"
  [ -d "$libdir/openmpi3" ] && cp -rL "$libdir/openmpi3" "$m/$rel/"
  [ -d /usr/share/openmpi ] && cp -rL /usr/share/openmpi "$m/share/"
  local pmix=/usr/lib/x86_64-linux-gnu/pmix2
  if [ -d "$pmix/lib/pmix" ]; then
    mkdir -p "$m/${pmix#/usr/}/lib"
    cp -rL "$pmix/lib/pmix" "$m/${pmix#/usr/}/lib/"
  fi
  local f
  for f in "$m"/bin/* $(find "$m" -name '*.so'); do
    copy_deps "$f" "$stage"
  done
  return 0
}

pack() {
  local with_data=1
  if [ "${1:-}" = --no-data ]; then
    with_data=0
    shift
  fi
  local tarball=${1:-}
  [ -n "$tarball" ] || die "pack: usage: pack [--no-data] TARBALL EXE..."
  shift
  [ $# -gt 0 ] || die "pack: no executables given"
  local stage
  stage=$(mktemp -d)
  local b="$stage/gpu_bundle"
  mkdir -p "$b/bin" "$b/lib" "$b/fallback" "$b/data"
  local exe
  for exe in "$@"; do
    [ -x "$exe" ] || die "pack: $exe is not an executable (was it built?)"
    cp -L "$exe" "$b/bin/"
    copy_deps "$exe" "$b"
  done
  if stage_mpi "$b"; then
    say "bundled Open MPI's mpirun ($(mpirun --version 2>/dev/null | head -1))"
  else
    say "no Open MPI here: the two-rank runs will need mpirun on the GPU machine"
  fi
  if [ "$with_data" = 1 ]; then
    if [ -d "$root/data/fashion-mnist" ]; then
      cp -rL "$root/data/fashion-mnist" "$b/data/"
    else
      say "warning: data/fashion-mnist missing (tools/setup.sh): the training runs will be skipped"
    fi
  fi
  cp "$root/tools/bench_torch.py" "$b/"
  {
    echo "gpu_bundle built $(date -u +%FT%TZ) on $(hostname)"
    echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
      git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    (cd "$stage" && find gpu_bundle -type f -printf '%10s  %p\n' | sort -k2)
  } >"$b/MANIFEST.txt"
  mkdir -p "$(dirname "$tarball")"
  tar -C "$stage" -cf - gpu_bundle | xz -T0 "-${GPU_CHECK_XZ_LEVEL:-6}" >"$tarball" ||
    die "tar/xz failed"
  rm -rf "$stage"
  list "$tarball"
}

list() {
  local tarball=${1:-}
  [ -f "$tarball" ] || die "list: $tarball not found"
  tar -tvJf "$tarball" | awk '$1 !~ /^d/ { printf "%10s  %s\n", $3, $6 }'
  local size
  size=$(stat -c %s "$tarball")
  say "$tarball: $(tar -tJf "$tarball" | grep -vc '/$') files, $((size / 1024 / 1024)) MiB ($size bytes) of 64 MiB"
  [ "$size" -lt "$limit" ] || die "$tarball is over 64 MiB: drop data or libraries"
}

bundle() {
  local tarball=${1:-$root/out/gpu_bundle.tar.xz}
  cd "$root" || die "no repository at $root"
  local targets
  targets=$(bazel query --noshow_progress \
    'attr(name, "cuda|nccl|gpu|op_table", kind("cc_test|cc_binary", //tests/...)) except attr(name, "selfcheck", //tests/...)' 2>/dev/null)
  [ -n "$targets" ] || die "bazel query found no CUDA test targets under //tests"
  say "building: $(echo $targets) //launch:dtrain"
  bazel build --noshow_progress $targets //launch:dtrain >/dev/null 2>&1 ||
    die "bazel build failed: run it by hand"
  local bin exes=() t
  bin=$(bazel info bazel-bin 2>/dev/null)
  for t in $targets //launch:dtrain; do
    exes+=("$bin/$(echo "${t#//}" | tr : /)")
  done
  pack "$tarball" "${exes[@]}"
  size "$tarball"
}

# ---- running (GPU machine) ----

# Highest GLIBCXX_3.4.N in a libstdc++ (0 when unreadable).
glibcxx_level() {
  grep -ao 'GLIBCXX_3\.4\.[0-9]*' "$1" 2>/dev/null | sed 's/GLIBCXX_3\.4\.//' | sort -n | tail -1
}

# Directory holding $1 among the toolkit and pip's nvidia packages, or "".
find_lib() {
  local name=$1 d
  for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/local/cuda/targets/*/lib "${site_dirs[@]}"; do
    [ -e "$d/$name" ] && { echo "$d"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }' | xargs -r dirname
}

# Passed / failed / skipped counts of a gtest log; the failing test names.
gtest_counts() {
  local log=$1
  printf '%s %s %s\n' "$(grep -c '^\[       OK \]' "$log")" \
    "$(grep -c '^\[  FAILED  \] .*(' "$log")" "$(grep -c '^\[  SKIPPED \] .*(' "$log")"
}
gtest_failures() {
  grep '^\[  FAILED  \] .*(' "$1" | sed 's/^\[  FAILED  \] //; s/ (.*//' | tr '\n' ' '
}

# ---- the summary: rewritten after every step, so a run killed at any
# moment still leaves one (written to a temporary name, then renamed) ----

summary_rows=()  # "step|result|passed|failed|skipped|seconds|note"
facts=()         # "- key: value" lines for the top of the summary

write_summary() {
  local state=$1 tmp="$out/.summary.md.tmp" row
  {
    echo "# dtrain GPU check"
    echo
    echo "$manifest"
    echo
    echo "state: $state; $((SECONDS - started)) s of the $deadline_s s deadline used; logs of every step in logs.tar.xz"
    echo
    echo "## machine"
    echo
    printf '%s\n' "${facts[@]}"
    echo
    echo "## steps (most valuable first)"
    echo
    echo "| step | result | passed | failed | skipped | seconds | note |"
    echo "|---|---|---|---|---|---|---|"
    for row in "${summary_rows[@]}"; do
      echo "| ${row//|/ | } |"
    done
    if [ -s "$logs/extra_lines.txt" ]; then
      echo
      echo "## measured (timeline, allocator, GPT-2, ZeRO)"
      echo
      echo '```'
      cat "$logs/extra_lines.txt"
      echo '```'
    fi
    local part
    for part in gpt2.md bench_table.md extra.md; do
      if [ -f "$logs/$part" ]; then cat "$logs/$part"; fi
    done
  } >"$tmp" && mv -f "$tmp" "$out/summary.md"
  tar -C "$logs" -cJf "$out/.logs.tar.xz.tmp" . 2>/dev/null && mv -f "$out/.logs.tar.xz.tmp" "$out/logs.tar.xz"
}

# Seconds left before the deadline.
time_left() { echo $((deadline - SECONDS)); }

# cli_has COMMAND WORD...: `dtrain COMMAND --help` mentions every WORD (a
# subcommand, flag or model that other work adds; absent in older builds).
cli_has() {
  local cmd=$1 help w
  shift
  help=$(timeout -k 2 20 "$dtrain" "$cmd" --help 2>&1) || return 1
  for w in "$@"; do
    grep -q -- "$w" <<<"$help" || return 1
  done
}

# skipped_row NAME WHAT: a row for a step this build cannot run yet.
skipped_row() {
  summary_rows+=("$1|skipped|-|-|-|0|skipped: $2 not available in this build")
  write_summary running
}

# step NAME LIMIT KIND COMMAND...: runs COMMAND with what is left of the
# deadline (at most LIMIT s; `timeout -k 5`), its output in logs/NAME.log,
# and adds a summary row. KIND gtest counts the cases (a suite whose cases
# all skipped is "skipped", never "ok"); KIND plain only looks at the exit.
step() {
  local name=$1 limit=$2 kind=$3
  shift 3
  local left t0 rc pass=- fail=- skip=- result note="" log="$logs/$name.log"
  left=$(time_left)
  if [ "$left" -lt 10 ]; then
    summary_rows+=("$name|not run|-|-|-|0|the deadline was reached")
    failed=$((failed + 1))
    write_summary running
    return 0
  fi
  [ "$limit" -lt "$left" ] || limit=$((left - 5))
  summary_rows+=("$name|running|-|-|-|-|limit ${limit} s")
  write_summary running
  t0=$SECONDS
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  rc=$?
  if [ "$kind" = gtest ]; then
    read -r pass fail skip <<<"$(gtest_counts "$log")"
  fi
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    result="TIMED OUT"
    note="killed after ${limit} s"
  elif [ "$rc" != 0 ]; then
    result="FAILED"
    note="exit $rc; $(gtest_failures "$log")see $name.log"
  elif [ "$kind" = gtest ] && [ "$pass" = 0 ] && [ "$skip" != 0 ]; then
    result="skipped"
    note=$(grep -m1 -o 'no CUDA device: .*' "$log" | cut -c1-160)
  else
    result="ok"
  fi
  case "$result" in FAILED | "TIMED OUT") failed=$((failed + 1)) ;; esac
  unset 'summary_rows[${#summary_rows[@]}-1]'
  summary_rows+=("$name|$result|$pass|$fail|$skip|$((SECONDS - t0))|${note//|//}")
  write_summary running
  say "$name: $result ($pass passed, $fail failed, $skip skipped, $((SECONDS - t0)) s)"
  return 0
}

# ---- the plan: the steps of a run in order, NAME CAP_SECONDS ----
#
# Most valuable first: the parity suites, then GPT-2 124M in bf16 at T=1024
# with both attention paths (auto's default is chosen by that measurement)
# and PyTorch beside it, then the rest. A lease may be a single call of a
# few minutes: the caps add up to at most 450 s against the 480 s default
# deadline, so no step is cut by it. The CPU's GPT-2 124M step at T=1024
# runs once (in cuda_train_step_test; `gpt2-step` repeats it with TF32 off
# and is left to --extended). --extended adds the steps beyond that budget
# (fp32 training, launch, traces, the other bench rows, ResNet-50 from a
# PNG folder) for a longer lease; give --deadline to match.
plan_steps() {
  cat <<'PLAN'
op_table_test 45
op_table_attention_gemm_test 30
cuda_backend_test 45
bench_gpt2_bf16 35
bench_gpt2_bf16_flash 20
plan_gpt2_bf16 20
bench_torch_gpt2_bf16 40
cuda_train_step_test 60
cuda_allocator_test 5
cuda_loader_test 15
dist_nccl_test 20
dist_gpu_staged 20
zero_vs_ddp 30
train_lenet_cuda_bf16 15
bench_dtrain_resnet50_bf16 15
bench_torch_resnet50_bf16 20
bench_dtrain_resnet50_bf16_cl 15
PLAN
  [ "${1:-0}" = 1 ] || return 0
  cat <<'PLAN'
cuda_stub_test 20
gpt2_step_vs_cpu 200
launch_2_ranks_cuda 120
train_lenet_cuda 120
train_mlp_cuda 120
observe_cuda 120
top_once 60
bench_dtrain_mlp 120
bench_torch_mlp 180
bench_dtrain_lenet 120
bench_torch_lenet 180
bench_dtrain_lenet_bf16 120
bench_torch_lenet_bf16 180
bench_dtrain_gpt2-tiny 120
bench_torch_gpt2-tiny 180
bench_dtrain_gpt2-tiny_bf16 120
bench_torch_gpt2-tiny_bf16 180
bench_dtrain_gpt2 120
bench_torch_gpt2 180
bench_dtrain_resnet50 120
bench_torch_resnet50 180
train_resnet50_bf16_folder 180
torch_resnet50_bf16_folder 180
bench_torch_resnet50_bf16_cl 20
PLAN
}

# The GPU's kind from nvidia-smi's name (h100, h200, or other).
gpu_kind_of() {
  case "$1" in
    *H200*) echo h200 ;;
    *H100*) echo h100 ;;
    *) echo other ;;
  esac
}

# GPT-2 124M bf16 tokens/s goals per GPU kind: llm.c's ~468K on an H100,
# issue 12's 550K on an H200.
gpt2_goal() {
  case "$1" in
    h100) echo 468000 ;;
    *) echo 550000 ;;
  esac
}

# Bench configurations: model batch steps warmup precision [flags...].
bench_config() {
  case "$1" in
    resnet50_bf16) echo "resnet50 32 30 5 bf16 --image-size 224 --channels 3" ;;
    resnet50_bf16_cl) echo "resnet50 32 30 5 bf16 --image-size 224 --channels 3 --channels-last" ;;
    resnet50) echo "resnet50 32 30 5 fp32 --image-size 224 --channels 3" ;;
    mlp) echo "mlp 128 300 20 fp32" ;;
    lenet) echo "lenet 64 300 20 fp32" ;;
    lenet_bf16) echo "lenet 64 300 20 bf16" ;;
    gpt2-tiny) echo "gpt2-tiny 16 100 10 fp32 --ctx 64 --optimizer adamw" ;;
    gpt2-tiny_bf16) echo "gpt2-tiny 16 100 10 bf16 --ctx 64 --optimizer adamw" ;;
    gpt2) echo "gpt2 4 20 3 fp32 --ctx 1024 --optimizer adamw" ;;
  esac
}

# run_step NAME CAP (inside run): one step of the plan, with its
# preconditions (a suite in the bundle, a GPU, mpirun, data, the build's
# flags); what cannot run gets a row saying why.
run_step() {
  local name=$1 cap=$2 exe
  local needs_gpu=1
  case "$name" in *_test | dist_gpu_staged) needs_gpu=0 ;; esac
  if [ "$needs_gpu" = 1 ] && { [ "$gpu" != 1 ] || [ ! -x "$dtrain" ]; }; then
    summary_rows+=("$name|not run|-|-|-|0|no GPU")
    write_summary running
    return 0
  fi
  case "$name" in
    op_table_attention_gemm_test)
      # the attention rows on the GEMM path, every dtype (its Bazel env)
      exe="$b/bin/$name"
      [ -x "$exe" ] || { skipped_row "$name" "$name"; return 0; }
      step "$name" "$cap" gtest env DT_ATTENTION=gemm GTEST_FILTER='*causal_attention*' "$exe" ;;
    dist_gpu_staged)
      exe="$b/bin/$name"
      [ -x "$exe" ] || { skipped_row "$name" "$name"; return 0; }
      if [ -z "$mpirun" ]; then
        summary_rows+=("$name (2 ranks)|not run|-|-|-|0|no mpirun on this machine")
        write_summary running
        return 0
      fi
      step "$name" "$cap" gtest "$mpirun" "${mpi_args[@]}" -np 2 "$exe" ;;
    *_test)
      exe="$b/bin/$name"
      [ -x "$exe" ] || { skipped_row "$name" "$name"; return 0; }
      step "$name" "$cap" gtest "$exe"
      case "$name" in
        cuda_backend_test) grep -h '^gemm counts: ' "$logs/$name.log" >>"$logs/extra_lines.txt" 2>/dev/null ;;
        cuda_loader_test | cuda_allocator_test)
          grep -h '^loader timeline: \|^allocator: ' "$logs/$name.log" >>"$logs/extra_lines.txt" 2>/dev/null ;;
      esac ;;
    bench_gpt2_bf16)
      cli_has bench gpt2 --ctx --precision || { skipped_row "$name" "dtrain bench --model gpt2 --precision"; return 0; }
      step "$name" "$cap" plain bash "$self" gpt2-bf16 "$dtrain" "$gpt2_batch"
      gpt2_batch=$(sed -n 's/^gpt2-bf16: batch \([0-9]*\).*/\1/p' "$logs/$name.log" | tail -1)
      gpt2_batch=${gpt2_batch:-${GPU_CHECK_GPT2_BATCH:-16}}
      gpt2_section ;;
    bench_gpt2_bf16_flash)
      cli_has bench gpt2 --ctx --precision || { skipped_row "$name" "dtrain bench --model gpt2 --precision"; return 0; }
      # the fused tensor-core flash kernels (DT_ATTENTION=fused) against the
      # heads' GEMMs (auto's path) of the step before, at the same batch
      step "$name" "$cap" plain env DT_ATTENTION=fused "$dtrain" bench --model gpt2 --ctx 1024 \
        --batch "$gpt2_batch" --steps 5 --warmup 2 --optimizer adamw --precision bf16 --device cuda:0
      gpt2_section ;;
    plan_gpt2_bf16)
      # issue 29: the plan's prediction for this GPU beside the measured step
      # (its probe runs on this machine's CPU, at a context of 64, in bf16:
      # 21 s on the 2-core development machine, nine steps with ZeRO 2's
      # traced pair; hence 20 s of the budget, 10 of them from the bench
      # row above, whose 7 steps take about 1 s on an H100)
      cli_has plan --json || { skipped_row "$name" "dtrain plan --json"; return 0; }
      [ "$gpu_kind" != other ] || { skipped_row "$name" "a plan device for this GPU (h100, h200)"; return 0; }
      step "$name" "$cap" plain "$dtrain" plan --model gpt2 --device "$gpu_kind" --ctx 1024 \
        --batch "$gpt2_batch" --precision bf16 --optimizer adamw --json
      gpt2_section ;;
    bench_torch_gpt2_bf16)
      step "$name" "$cap" plain env LD_LIBRARY_PATH="$orig_ld" "$python" "$b/bench_torch.py" \
        --model gpt2 --ctx 1024 --batch "$gpt2_batch" --steps 10 --warmup 3 --optimizer adamw \
        --precision bf16 --device cuda
      gpt2_section ;;
    gpt2_step_vs_cpu)
      cli_has bench gpt2 --ctx || { skipped_row "$name" "dtrain bench --model gpt2 --ctx"; return 0; }
      step "$name" "$cap" plain env DT_CUDA_TF32=0 bash "$self" gpt2-step "$dtrain"
      grep -h '^gpt2 step:' "$logs/$name.log" >>"$logs/extra_lines.txt" 2>/dev/null ;;
    zero_vs_ddp)
      # ZeRO stages 1 and 2 against plain DDP, 2 ranks: over NCCL with a GPU
      # per rank, else over the host-staged backend (NCCL refuses two ranks
      # on one GPU)
      cli_has train --zero || { skipped_row "$name" "dtrain train --zero"; return 0; }
      if [ -z "$mpirun" ] || [ ! -d "$b/data/fashion-mnist" ]; then
        summary_rows+=("$name|not run|-|-|-|0|no mpirun or no data/fashion-mnist in the bundle")
        write_summary running
        return 0
      fi
      local ngpu zero_backend=mpi
      ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
      [ "${ngpu:-0}" -ge 2 ] && zero_backend=nccl
      step "$name" "$cap" plain env DT_MPIRUN="$mpirun" bash "$self" zero "$dtrain" "$b/data" \
        "$zero_backend"
      grep -h '^zero ' "$logs/$name.log" >>"$logs/extra_lines.txt" 2>/dev/null ;;
    launch_2_ranks_cuda)
      if [ -z "$mpirun" ] || [ ! -d "$b/data/fashion-mnist" ]; then
        summary_rows+=("$name|not run|-|-|-|0|no mpirun or no data/fashion-mnist in the bundle")
        write_summary running
        return 0
      fi
      step "$name" "$cap" plain env DT_MPIRUN="$mpirun" "$dtrain" launch -n 2 \
        --mpirun-arg --oversubscribe -- train --model mlp --device cuda --max-steps 200 \
        --log-interval 100 --data-dir "$b/data" ;;
    train_resnet50_bf16_folder | torch_resnet50_bf16_folder)
      # ResNet-50 bf16 at 224 px fed from a PNG folder (Fashion-MNIST written
      # out by dtrain images), so the loader and the host-to-device copies
      # show beside the synthetic rows: dtrain's --workers and copy stream
      # against torchvision's ImageFolder + DataLoader
      if [ ! -d "$b/data/fashion-mnist" ]; then
        summary_rows+=("$name|not run|-|-|-|0|the bundle has no data/fashion-mnist")
        write_summary running
        return 0
      fi
      local png="$work/fm_png"
      [ -d "$png/train" ] || timeout -k 2 60 "$dtrain" images --from fashion-mnist \
        --data-dir "$b/data" --out "$png" >"$logs/images.log" 2>&1 ||
        { skipped_row "$name" "dtrain images --from fashion-mnist"; return 0; }
      local folder_args=(--model resnet50 --data "$png" --image-size 224 --channels 3 --workers 8
        --batch 32 --precision bf16)
      if [ "$name" = train_resnet50_bf16_folder ]; then
        step "$name" "$cap" plain "$dtrain" train "${folder_args[@]}" --device cuda:0 \
          --max-steps 60 --log-interval 20
      else
        step "$name" "$cap" plain env LD_LIBRARY_PATH="$orig_ld" "$python" "$b/bench_torch.py" \
          "${folder_args[@]}" --steps 40 --warmup 10 --device cuda
        echo "resnet50 bf16 from a PNG folder, 8 workers: dtrain samples/s" \
          "$(grep -o 'samples/s [0-9.]*' "$logs/train_resnet50_bf16_folder.log" 2>/dev/null |
            tail -1 | cut -d' ' -f2) (the last 20 steps), PyTorch" \
          "$(last_value "$logs/$name.log" samples_per_s)" >>"$logs/extra_lines.txt"
      fi ;;
    train_* | observe_cuda)
      if [ ! -d "$b/data/fashion-mnist" ]; then
        summary_rows+=("$name|not run|-|-|-|0|the bundle has no data/fashion-mnist")
        write_summary running
        return 0
      fi
      local args=(--data fashion-mnist --data-dir "$b/data" --device cuda:0)
      case "$name" in
        train_lenet_cuda) step "$name" "$cap" plain "$dtrain" train --model lenet "${args[@]}" --epochs 1 ;;
        train_lenet_cuda_bf16)
          # LeNet-5 in bf16 (cuDNN's 16-bit convolutions)
          cli_has train --precision || { skipped_row "$name" "dtrain train --precision"; return 0; }
          step "$name" "$cap" plain "$dtrain" train --model lenet "${args[@]}" --epochs 1 --precision bf16 ;;
        train_mlp_cuda) step "$name" "$cap" plain "$dtrain" train --model mlp "${args[@]}" --epochs 1 --max-steps 400 ;;
        observe_cuda)
          # the trace's gpu lane (CUDA timing events), the metrics
          step "$name" "$cap" plain "$dtrain" train --model lenet "${args[@]}" --max-steps 40 \
            --log-interval 10 --metrics "$logs/observe_metrics.jsonl" \
            --trace "$logs/observe_trace-{rank}.json" --trace-steps 5:10
          {
            echo
            echo "## traces and metrics on cuda:0"
            echo
            echo '```'
            echo "trace spans per lane (cat): $(grep -o '"cat":"[a-z-]*"' "$logs"/observe_trace-0.json 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')"
            echo "metrics records: $(wc -l <"$logs/observe_metrics.jsonl" 2>/dev/null)"
            echo '```'
          } >>"$logs/extra.md" ;;
      esac
      grep -H 'test_accuracy=' "$logs/$name.log" 2>/dev/null | sed 's|.*/||' >>"$logs/extra_lines.txt" ;;
    top_once) step "$name" "$cap" plain "$dtrain" top --once ;;
    bench_dtrain_* | bench_torch_*)
      local tag=${name#bench_*_} model batch n warm prec extra
      read -r model batch n warm prec extra <<<"$(bench_config "$tag")"
      [ -n "$model" ] || { skipped_row "$name" "a bench configuration for $tag"; return 0; }
      if [ "$prec" = bf16 ]; then
        cli_has bench --precision || { skipped_row "$name" "dtrain bench --precision"; return 0; }
        extra="$extra --precision bf16"
      fi
      if [ "${extra#*--channels-last}" != "$extra" ]; then
        cli_has bench --channels-last || { skipped_row "$name" "dtrain bench --channels-last"; return 0; }
      fi
      if [ "${name#bench_dtrain_}" != "$name" ]; then
        # shellcheck disable=SC2086 # $extra is a list of flags
        step "$name" "$cap" plain "$dtrain" bench --model "$model" --batch "$batch" --steps "$n" \
          --warmup "$warm" --device cuda:0 $extra
        [ "$tag" != resnet50_bf16_cl ] || layout_line
      else
        # shellcheck disable=SC2086
        step "$name" "$cap" plain env LD_LIBRARY_PATH="$orig_ld" "$python" "$b/bench_torch.py" \
          --model "$model" --batch "$batch" --steps "$n" --warmup "$warm" --device cuda $extra
        bench_row "$tag" "$model" "$batch" "$prec"
      fi ;;
    *) summary_rows+=("$name|not run|-|-|-|0|no such step in this script") ;;
  esac
  return 0
}

# layout_line (inside run): ResNet-50 bf16 channels-last against NCHW,
# from the two bench logs (issue 28: NHWC is the default candidate only
# where this ratio is above 1).
layout_line() {
  local nchw nhwc
  nchw=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$logs/bench_dtrain_resnet50_bf16.log" 2>/dev/null)
  nhwc=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$logs/bench_dtrain_resnet50_bf16_cl.log" 2>/dev/null)
  {
    echo
    echo "## ResNet-50 bf16, batch 32, 224 px: channels-last against NCHW"
    echo
    echo '```'
    echo "NCHW steps_per_s=${nchw:-n/a}  channels-last steps_per_s=${nhwc:-n/a}  ratio=$(awk -v a="${nhwc:-0}" -v b="${nchw:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "n/a" }')"
    echo '```'
  } >>"$logs/extra.md"
  write_summary running
}

# bench_row TAG MODEL BATCH PRECISION (inside run): the dtrain / PyTorch
# row of the throughput table, from the two bench logs.
bench_row() {
  local ours theirs ratio
  ours=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$logs/bench_dtrain_$1.log" 2>/dev/null)
  theirs=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$logs/bench_torch_$1.log" 2>/dev/null)
  ratio=$(awk -v a="${ours:-0}" -v b="${theirs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "n/a" }')
  [ -f "$logs/bench_table.md" ] || {
    echo
    echo '## throughput on the same GPU (steps/s, warm-up excluded; fp32 rows with TF32 on for both, bf16 rows autocast on both)'
    echo
    echo '| model | precision | dtrain cuda:0 | PyTorch cuda | dtrain / PyTorch |'
    echo '|---|---|---|---|---|'
  } >"$logs/bench_table.md"
  echo "| $2 batch $3 | $4 | ${ours:-n/a} | ${theirs:-n/a} | $ratio |" >>"$logs/bench_table.md"
  write_summary running
}

# gpt2_section (inside run): GPT-2 124M bf16 at T=1024, both attention
# paths and PyTorch, against the goal of this GPU's kind; rewritten after
# each of its steps.
gpt2_section() {
  local gemm flash theirs mfu goal verdict plan
  gemm=$(last_value "$logs/bench_gpt2_bf16.log" tokens_per_s)
  flash=$(last_value "$logs/bench_gpt2_bf16_flash.log" tokens_per_s)
  theirs=$(last_value "$logs/bench_torch_gpt2_bf16.log" tokens_per_s)
  mfu=$(grep -o 'mfu=[0-9.]*%' "$logs/bench_gpt2_bf16.log" 2>/dev/null | tail -1 | cut -d= -f2)
  goal=$(gpt2_goal "$gpu_kind")
  verdict=$(awk -v a="${gemm:-0}" -v f="${flash:-0}" -v g="$goal" 'BEGIN {
    if (f > a) a = f
    if (a <= 0) print "no figure (see the step logs)";
    else printf "%s: %.0f tokens/s (the faster path) is %.0f%% of %d\n", (a >= g ? "met" : "NOT met"), a, 100 * a / g, g }')
  {
    echo
    echo "## GPT-2 124M in bf16, T=1024, batch $gpt2_batch, cuda:0 (goal on this GPU ($gpu_kind): >= $goal tokens/s; H100: llm.c's ~468K, H200: 550K)"
    echo
    echo '```'
    echo "dtrain, attention as the heads' GEMMs (DT_ATTENTION=auto): tokens_per_s=${gemm:-n/a} mfu=${mfu:-n/a}"
    echo "dtrain, fused flash kernels (DT_ATTENTION=fused):       tokens_per_s=${flash:-n/a}"
    echo "PyTorch (bf16 autocast, the same model and step):       tokens_per_s=${theirs:-n/a}"
    echo "goal: $verdict"
    plan=$(grep -o '"tokens_per_s": [0-9.]*' "$logs/plan_gpt2_bf16.log" 2>/dev/null | tail -1 | cut -d' ' -f2)
    echo "dtrain plan's prediction for this GPU (docs/plan.md):    tokens_per_s=${plan:-n/a}"
    grep -h '^flops:\|^breakdown:' "$logs/bench_gpt2_bf16.log" 2>/dev/null | sed 's/^/dtrain /'
    echo '```'
  } >"$logs/gpt2.md"
  write_summary running
}

run() {
  local tarball="" deadline_s=${GPU_CHECK_DEADLINE:-480} pos=() extended=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --extended) extended=1; shift ;;
      --deadline) deadline_s=${2:?--deadline needs seconds}; shift 2 ;;
      --deadline=*) deadline_s=${1#*=}; shift ;;
      *) pos+=("$1"); shift ;;
    esac
  done
  case "$deadline_s" in '' | *[!0-9]*) die "--deadline $deadline_s: expected whole seconds" ;; esac
  tarball=${pos[0]:-$root/out/gpu_bundle.tar.xz}
  out=${pos[1]:-${OUT:-$root/out/gpu_results}}
  [ -f "$tarball" ] || die "$tarball not found: run 'tools/gpu_check.sh bundle' first"
  mkdir -p "$out" || die "cannot create $out"
  out=$(cd "$out" && pwd)
  started=$SECONDS
  deadline=$((SECONDS + deadline_s))
  local work
  work=$(mktemp -d)
  logs="$work/logs"
  mkdir -p "$logs"
  failed=0
  manifest="(unpacking the bundle)"
  trap 'write_summary "killed (signal)"; exit 143' TERM INT
  write_summary starting
  tar -C "$work" -xJf "$tarball" || die "cannot unpack $tarball"
  local b="$work/gpu_bundle"
  manifest=$(head -2 "$b/MANIFEST.txt" 2>/dev/null | tr '\n' ';' | sed 's/;$//')
  cp "$b/MANIFEST.txt" "$logs/" 2>/dev/null
  local python=${PYTHON:-python3}
  local orig_ld=${LD_LIBRARY_PATH:-}

  mapfile -t site_dirs < <("$python" - <<'PYEOF' 2>/dev/null
import glob, site, sys
dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for d in dirs:
    for lib in sorted(glob.glob(d + "/nvidia/*/lib")) + sorted(glob.glob(d + "/torch/lib")):
        if lib not in seen:
            seen.add(lib)
            print(lib)
PYEOF
)
  # bundle libs, then the machine's CUDA libraries, then fallbacks where
  # the machine lacks them.
  local ld="$b/lib" missing=() found=() d lib
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    d=$(find_lib "$lib")
    if [ -n "$d" ]; then
      found+=("$lib: $d/$(basename "$(readlink -f "$d/$lib")")")
      case ":$ld:" in *":$d:"*) ;; *) ld="$ld:$d" ;; esac
    else
      missing+=("$lib")
    fi
  done
  local fb="$work/fallback_use"
  mkdir -p "$fb"
  d=$(find_lib libcudart.so.13)
  [ -z "$d" ] && [ -e "$b/fallback/libcudart.so.13" ] && cp -a "$b"/fallback/libcudart.so.13* "$fb/"
  local sys_cxx ours_cxx
  sys_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" { print $NF; exit }')
  ours_cxx=$(glibcxx_level "$b/fallback/libstdc++.so.6")
  if [ -e "$b/fallback/libstdc++.so.6" ] &&
    { [ -z "$sys_cxx" ] || [ "$(glibcxx_level "$sys_cxx")" -lt "${ours_cxx:-0}" ]; }; then
    cp -a "$b"/fallback/libstdc++.so* "$b"/fallback/libgcc_s.so* "$fb/" 2>/dev/null
  fi
  ld="$ld:$fb"
  export LD_LIBRARY_PATH="$ld${orig_ld:+:$orig_ld}"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
  local gpu=0
  nvidia-smi -L >/dev/null 2>&1 && gpu=1
  local dtrain="$b/bin/dtrain"

  # ---- the machine's facts, once ----
  {
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    printf 'found %s\n' "${found[@]}"
    [ ${#missing[@]} -eq 0 ] || echo "MISSING libraries: ${missing[*]}"
    ls "$fb" | sed 's/^/using bundled fallback: /'
    LD_LIBRARY_PATH=$orig_ld "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1 | tail -1
  } >"$logs/environment.txt" 2>&1
  [ -x "$dtrain" ] && timeout -k 2 30 "$dtrain" doctor >"$logs/doctor.txt" 2>&1
  grep -q '^ *GPU 0: ' "$logs/doctor.txt" 2>/dev/null && gpu=1
  local q
  q=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -1)
  facts=("- GPU: ${q:-none visible to nvidia-smi}$([ "$gpu" = 1 ] || echo ' (the suites skip; training and bench are left out)')")
  facts+=("- $(grep -m1 'build:' "$logs/doctor.txt" 2>/dev/null | sed 's/^ *//' || echo 'build: dtrain doctor did not run')")
  facts+=("- $(grep -m1 'driver:' "$logs/doctor.txt" 2>/dev/null | sed 's/^ *//')")
  facts+=("- $(grep -m1 'cuDNN:' "$logs/doctor.txt" 2>/dev/null | sed 's/^ *//')")
  facts+=("- $(grep -m1 'NCCL:' "$logs/doctor.txt" 2>/dev/null | sed 's/^ *//')")
  facts+=("- glibc: $(ldd --version 2>&1 | head -1 | sed 's/^ldd //')")
  [ ${#missing[@]} -eq 0 ] || facts+=("- **missing libraries: ${missing[*]}**")
  facts+=("- doctor: $(grep -m1 '^verdict' "$logs/doctor.txt" 2>/dev/null || echo 'no verdict')")
  write_summary running

  # MPI: the bundled Open MPI (matching the bundled libmpi), else the machine's.
  local mpirun="" mpi_args=()
  if [ -x "$b/mpi/usr/bin/mpirun" ]; then
    mpirun="$b/mpi/usr/bin/mpirun"
    export OPAL_PREFIX="$b/mpi/usr"
    export PMIX_MCA_mca_base_component_path="$b/mpi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix"
    export PATH="$b/mpi/usr/bin:$PATH"
  elif command -v mpirun >/dev/null 2>&1; then
    mpirun=$(command -v mpirun)
  fi
  # The MCA settings are dtrain launch's (launch/mca_params.def), read from
  # the mpirun line it prints: one list for both.
  mpi_args=(--oversubscribe --bind-to none -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=1)
  if [ -n "$mpirun" ] && [ -x "$dtrain" ]; then
    local mca
    mca=$(DT_MPIRUN="$mpirun" timeout -k 2 30 "$dtrain" launch --dry-run -n 2 -- train 2>&1 |
      grep -o -- '--mca [^ ]* [^ ]*' | tr '\n' ' ')
    read -ra mca_args <<<"$mca"
    mpi_args+=("${mca_args[@]}")
    facts+=("- mpirun: $mpirun; MCA from dtrain launch: ${mca:-none}")
  fi
  [ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)

  # ---- the steps, in the plan's order, each within its cap ----
  gpu_kind=$(gpu_kind_of "$q")
  gpt2_batch=${GPU_CHECK_GPT2_BATCH:-16}
  local name cap
  while read -r name cap; do
    run_step "$name" "$cap"
  done < <(plan_steps "$extended")
  trap - TERM INT
  write_summary "finished, $failed failing step(s)"
  rm -rf "$work"
  cat "$out/summary.md"
  say "summary.md and logs.tar.xz in $out"
  [ "$failed" -eq 0 ]
}

# Bytes that travel to the GPU machine: the working tree as the device tool
# copies it (tracked files and untracked ones git does not ignore) plus the
# carried paths; the limit is 64 MiB in all.
size() {
  cd "$root" || die "no repository at $root"
  local tree carried=0 p total
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
  for p in "$@"; do
    [ -e "$p" ] || die "size: $p does not exist"
    carried=$((carried + $(du -sb "$p" | cut -f1)))
  done
  total=$((tree + carried))
  say "travels: working tree $((tree / 1024)) KiB + carried $((carried / 1024)) KiB = $((total / 1024 / 1024)) MiB ($total bytes) of 64 MiB"
  [ "$total" -lt "$limit" ] || die "over 64 MiB: what travels must shrink"
}

# ---- steps that compare two runs (run calls them as `gpu_check.sh MODE`) ----

# The value of KEY=... on the last line of $1 that has it.
last_value() { grep -o "$2=[-0-9.e+naif]*" "$1" 2>/dev/null | tail -1 | cut -d= -f2; }

# within A B TOL: |A - B| <= TOL * max(1, |B|).
within() {
  awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN {
    if (a == "" || b == "") exit 1
    d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; if (m < 1) m = 1
    exit !(d <= t * m) }'
}

# gpt2-bf16 DTRAIN BATCH: GPT-2 124M at T=1024 in bf16 on cuda:0, the LM's
# training step (AdamW, clipping), at BATCH, halved once if that runs out
# of memory; says which batch it ran ("gpt2-bf16: batch N").
gpt2_bf16() {
  local dtrain=$1 batch=$2 log
  log=$(mktemp)
  "$dtrain" bench --model gpt2 --ctx 1024 --batch "$batch" --steps 10 --warmup 3 \
    --optimizer adamw --precision bf16 --device cuda:0 >"$log" 2>&1
  local rc=$?
  cat "$log"
  if [ "$rc" != 0 ] && grep -qi 'out of memory\|DT_ERR_OOM\|OOM' "$log"; then
    batch=$((batch / 2))
    echo "gpt2-bf16: out of memory: batch halved to $batch"
    "$dtrain" bench --model gpt2 --ctx 1024 --batch "$batch" --steps 10 --warmup 3 \
      --optimizer adamw --precision bf16 --device cuda:0
    rc=$?
  fi
  rm -f "$log"
  echo "gpt2-bf16: batch $batch"
  return "$rc"
}

# gpt2-step DTRAIN: two GPT-2 124M training steps (AdamW) at T=1024 on one
# synthetic sequence, on the CPU and on cuda:0 (TF32 off: the caller sets
# DT_CUDA_TF32=0); the loss after the update must agree.
gpt2_step() {
  local dtrain=$1 dir k
  dir=$(mktemp -d)
  for k in cpu cuda:0; do
    "$dtrain" bench --model gpt2 --ctx 1024 --batch 1 --steps 2 --warmup 0 --seed 1 \
      --optimizer adamw --device "$k" >"$dir/${k%%:*}.log" 2>&1 ||
      { cat "$dir/${k%%:*}.log"; die "gpt2-step: dtrain bench on $k failed"; }
    cat "$dir/${k%%:*}.log"
  done
  local a b
  a=$(last_value "$dir/cpu.log" loss)
  b=$(last_value "$dir/cuda.log" loss)
  echo "gpt2 step: loss after one AdamW step, cpu ${a:-?} cuda:0 ${b:-?} (T=1024, batch 1, TF32 off)"
  within "$b" "$a" 2e-3 || die "gpt2-step: cuda:0 loss ${b:-missing} differs from the CPU's ${a:-missing}"
}

# zero DTRAIN DATA_DIR BACKEND: dtrain launch -n 2 -- train --device cuda with
# --zero 0, 1 and 2 over BACKEND; ZeRO must match plain DDP.
# (GPU_CHECK_ZERO_DEVICE=cpu runs the same comparison without a GPU.)
zero_equivalence() {
  local dtrain=$1 data=$2 backend=$3 dir z
  dir=$(mktemp -d)
  for z in 0 1 2; do
    "$dtrain" launch -n 2 --mpirun-arg --oversubscribe -- train --model mlp \
      --device "${GPU_CHECK_ZERO_DEVICE:-cuda}" \
      --comm-backend "$backend" --zero "$z" --max-steps 100 --log-interval 50 --seed 3 \
      --data-dir "$data" >"$dir/z$z.log" 2>&1 ||
      { cat "$dir/z$z.log"; die "zero: --zero $z failed"; }
    tail -3 "$dir/z$z.log"
  done
  local a0 a1 a2
  a0=$(last_value "$dir/z0.log" test_accuracy)
  a1=$(last_value "$dir/z1.log" test_accuracy)
  a2=$(last_value "$dir/z2.log" test_accuracy)
  echo "zero over $backend, 2 ranks: test_accuracy ddp ${a0:-?} zero1 ${a1:-?} zero2 ${a2:-?}"
  within "$a1" "$a0" 0.003 && within "$a2" "$a0" 0.003 ||
    die "zero: ZeRO differs from DDP beyond 0.003"
}

case "$mode" in
  --plan)
    shift
    [ "${1:-}" = --extended ] && plan_steps 1 || plan_steps 0 ;;
  gpt2-step) shift; gpt2_step "$@" ;;
  gpt2-bf16) shift; gpt2_bf16 "$@" ;;
  zero) shift; zero_equivalence "$@" ;;
  bundle) shift; bundle "$@" ;;
  pack) shift; pack "$@" ;;
  list) shift; list "$@" ;;
  run) shift; run "$@" ;;
  size) shift; size "$@" ;;
  -h | --help | "") sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "unknown mode '$mode' (bundle, run, --plan, size, pack or list; see --help)" ;;
esac
