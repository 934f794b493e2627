#!/usr/bin/env bash
# Checks the CUDA path on a GPU machine that has no Bazel (see
# ../shared/recipes/gpu-check.md).
#
#   tools/gpu_check.sh bundle [TARBALL]            on the development machine
#   tools/gpu_check.sh run [TARBALL] [OUT]         on the GPU machine
#   tools/gpu_check.sh pack [--no-data] TARBALL EXE...   bundle's packing step
#   tools/gpu_check.sh list TARBALL                what a bundle holds
#
# bundle: builds every cc_test / cc_binary under //tests/... whose name has
#   cuda, nccl, gpu or op_table in it (not the CPU selfcheck variants), and
#   //launch:dtrain, then packs them (`pack`)
#   into TARBALL (default out/gpu_bundle.tar.xz, git-ignored), which must
#   stay under 64 MiB. Prints the contents and the size.
# pack: stages EXE... into bin/ with the shared libraries the GPU machine may
#   lack (the workspace's own .so files, OpenBLAS, libgfortran, libgomp,
#   Open MPI's libraries, ...; never glibc, the driver, cuBLAS, cuDNN or
#   NCCL, which are large and present there; libstdc++/libgcc_s and
#   libcudart go to fallback/, used only where the machine's are missing or
#   older), Open MPI's mpirun with its plugins (mpi/, relocatable through
#   OPAL_PREFIX) when this machine has it, Fashion-MNIST (unless --no-data)
#   and tools/bench_torch.py; writes MANIFEST.txt, tars and lists.
# run: unpacks TARBALL, finds libcudart/libcublas/libcudnn/libnccl (the CUDA
#   toolkit, then pip's nvidia/*/lib under python3's site-packages), prints
#   nvidia-smi and the versions, runs every *_test suite (and every other
#   bin/ program under the bundled mpirun with 2 ranks), `dtrain doctor`, a
#   short training run on cuda:0 (LeNet-5 one epoch with test accuracy, MLP
#   --max-steps), `dtrain launch -n 2 -- train --device cuda` (two ranks:
#   on one GPU they share it through the host-staged fallback) and the
#   launcher's one-rank-per-GPU default (--dry-run),
#   `dtrain bench --device cuda:0` beside tools/bench_torch.py
#   --device cuda for MLP batch 128 and LeNet-5 batch 64, and writes logs and
#   OUT/summary.md (OUT default: $OUT, else out/gpu_results). Without a GPU
#   the suites skip and the training/bench steps are left out (said so in
#   the summary). Every step has a timeout; the whole run stays under ~5
#   minutes on an H200. Exit status: 0 when every suite passed and, with a
#   GPU, training and bench ran.
set -uo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
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

run() {
  local tarball=${1:-$root/out/gpu_bundle.tar.xz}
  local out=${2:-${OUT:-$root/out/gpu_results}}
  [ -f "$tarball" ] || die "$tarball not found: run 'tools/gpu_check.sh bundle' first"
  mkdir -p "$out" || die "cannot create $out"
  out=$(cd "$out" && pwd)
  local started=$SECONDS
  local work
  work=$(mktemp -d)
  tar -C "$work" -xJf "$tarball" || die "cannot unpack $tarball"
  local b="$work/gpu_bundle"
  local python=${PYTHON:-python3}
  local orig_ld=${LD_LIBRARY_PATH:-}

  mapfile -t site_dirs < <("$python" - <<'EOF' 2>/dev/null
import glob, site, sys
dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for d in dirs:
    for lib in sorted(glob.glob(d + "/nvidia/*/lib")) + sorted(glob.glob(d + "/torch/lib")):
        if lib not in seen:
            seen.add(lib)
            print(lib)
EOF
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

  {
    echo "# gpu_check $(date -u +%FT%TZ) on $(hostname)"
    head -3 "$b/MANIFEST.txt" 2>/dev/null
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    printf 'found %s\n' "${found[@]}"
    [ ${#missing[@]} -eq 0 ] || echo "MISSING libraries: ${missing[*]}"
    ls "$fb" | sed 's/^/using bundled fallback: /'
    LD_LIBRARY_PATH=$orig_ld "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1 | tail -1
  } 2>&1 | tee "$out/environment.txt"

  local summary="$out/summary.md" failed=0
  {
    echo "# dtrain GPU check"
    echo
    echo "$(head -2 "$b/MANIFEST.txt" 2>/dev/null | tr '\n' ';' | sed 's/;$//')"
    echo
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
    [ "$gpu" = 1 ] || echo "**nvidia-smi -L failed: unless dtrain doctor (below) finds a GPU, the suites skip and training and bench are left out**"
    [ ${#missing[@]} -eq 0 ] || echo "**missing libraries: ${missing[*]}**"
    echo
    echo "## test suites"
    echo
    echo "| suite | passed | failed | skipped | status |"
    echo "|---|---|---|---|---|"
  } >"$summary"

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
  mpi_args=(--oversubscribe --bind-to none -x LD_LIBRARY_PATH -x OMP_NUM_THREADS=1
    --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
  [ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)

  if [ -n "$mpirun" ]; then
    echo "mpirun: $mpirun ($("$mpirun" --version 2>&1 | head -1))" >>"$out/environment.txt"
    timeout 60 "$mpirun" "${mpi_args[@]}" -np 2 hostname >>"$out/environment.txt" 2>&1 &&
      echo "mpirun -np 2 hostname: ok" >>"$out/environment.txt" ||
      echo "mpirun -np 2 hostname: FAILED" >>"$out/environment.txt"
    tail -1 "$out/environment.txt"
  fi

  local exe name rc pass fail skip
  for exe in "$b"/bin/*; do
    name=$(basename "$exe")
    [ "$name" = dtrain ] && continue
    if [[ "$name" == *_test ]]; then
      timeout "${GPU_CHECK_SUITE_TIMEOUT:-240}" "$exe" --gtest_output="xml:$out/$name.xml" \
        >"$out/$name.log" 2>&1
      rc=$?
    elif [ -n "$mpirun" ]; then
      timeout "${GPU_CHECK_SUITE_TIMEOUT:-240}" "$mpirun" "${mpi_args[@]}" -np 2 "$exe" \
        >"$out/$name.log" 2>&1
      rc=$?
      name="$name (mpirun -np 2)"
    else
      echo "| $name | - | - | - | not run: no mpirun on this machine |" >>"$summary"
      say "$name: not run (no mpirun)"
      continue
    fi
    read -r pass fail skip <<<"$(gtest_counts "$out/$(basename "$exe").log")"
    local status="ok"
    if [ "$rc" -ne 0 ]; then
      failed=$((failed + 1))
      status="FAILED (exit $rc$([ "$rc" = 124 ] && echo ', timed out')): $(gtest_failures "$out/$(basename "$exe").log")see $(basename "$exe").log"
    fi
    echo "| $name | $pass | $fail | $skip | $status |" >>"$summary"
    say "$name: $pass passed, $fail failed, $skip skipped (exit $rc)"
  done

  local dtrain="$b/bin/dtrain"
  if [ -x "$dtrain" ]; then
    timeout 60 "$dtrain" doctor >"$out/doctor.txt" 2>&1
    # A GPU that dtrain sees counts even where nvidia-smi is missing.
    grep -q '^ *GPU 0: ' "$out/doctor.txt" && gpu=1
    { echo; echo '## dtrain doctor'; echo; echo '```'; cat "$out/doctor.txt"; echo '```'; } >>"$summary"
  else
    echo "dtrain is not in the bundle" >>"$summary"
  fi

  if [ -x "$dtrain" ] && [ "$gpu" = 1 ]; then
    { echo; echo '## training on cuda:0'; echo; } >>"$summary"
    if [ -d "$b/data/fashion-mnist" ]; then
      local model args
      for model in lenet mlp; do
        args=(train --model "$model" --device cuda:0 --data fashion-mnist --data-dir "$b/data")
        if [ "$model" = lenet ]; then
          args+=(--epochs 1)
        else
          args+=(--epochs 1 --max-steps 400)
        fi
        local t0=$SECONDS
        timeout 300 "$dtrain" "${args[@]}" >"$out/train_$model.log" 2>&1
        rc=$?
        [ "$rc" -eq 0 ] || failed=$((failed + 1))
        local acc
        acc=$(sed -n 's/^.*test_accuracy=\([0-9.]*\).*$/\1/p' "$out/train_$model.log" | tail -1)
        echo "- \`dtrain ${args[*]/#$b/BUNDLE}\`: exit $rc, test_accuracy ${acc:-n/a}, $((SECONDS - t0)) s" >>"$summary"
        { echo '```'; tail -n 4 "$out/train_$model.log"; echo '```'; } >>"$summary"
      done
    else
      echo "- skipped: the bundle has no data/fashion-mnist" >>"$summary"
    fi

    # dtrain launch on GPUs: the one-rank-per-GPU default, and 2 ranks with
    # --device cuda (sharing the GPU when there is one: auto falls back to
    # the host-staged mpi backend; with two GPUs: nccl).
    { echo; echo '## dtrain launch --device cuda'; echo; } >>"$summary"
    if [ -n "$mpirun" ] && [ -d "$b/data/fashion-mnist" ]; then
      DT_MPIRUN="$mpirun" timeout 60 "$dtrain" launch --dry-run -- train --device cuda \
        >"$out/launch_dry_run.log" 2>&1
      echo "- launch without -n: \`$(grep -m1 'GPU' "$out/launch_dry_run.log")\`" >>"$summary"
      local t0=$SECONDS
      DT_MPIRUN="$mpirun" timeout 300 "$dtrain" launch -n 2 --mpirun-arg --oversubscribe -- \
        train --model mlp --device cuda --max-steps 200 --log-interval 100 \
        --data-dir "$b/data" >"$out/launch_cuda.log" 2>&1
      rc=$?
      [ "$rc" -eq 0 ] || failed=$((failed + 1))
      echo "- \`dtrain launch -n 2 -- train --model mlp --device cuda --max-steps 200\`: exit $rc, $((SECONDS - t0)) s" >>"$summary"
      { echo '```'; grep -E 'ddp world|nccl|host-staged|test_accuracy=|error' "$out/launch_cuda.log" | head -8; echo '```'; } >>"$summary"
    else
      echo "- skipped: needs mpirun and data/fashion-mnist in the bundle" >>"$summary"
    fi

    {
      echo
      echo '## throughput on the same GPU (steps/s, warm-up excluded, TF32 on for both)'
      echo
      echo '| model | dtrain cuda:0 | PyTorch cuda | dtrain / PyTorch |'
      echo '|---|---|---|---|'
    } >>"$summary"
    local config model batch ours theirs ratio
    for config in "mlp 128" "lenet 64"; do
      read -r model batch <<<"$config"
      timeout 120 "$dtrain" bench --model "$model" --batch "$batch" --steps 300 --warmup 20 \
        --device cuda:0 >"$out/bench_dtrain_${model}.log" 2>&1 || failed=$((failed + 1))
      ours=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$out/bench_dtrain_${model}.log")
      LD_LIBRARY_PATH=$orig_ld timeout 180 "$python" "$b/bench_torch.py" --model "$model" \
        --batch "$batch" --steps 300 --warmup 20 --device cuda >"$out/bench_torch_${model}.log" 2>&1
      theirs=$(sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p' "$out/bench_torch_${model}.log")
      ratio=$(awk -v a="${ours:-0}" -v b="${theirs:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "n/a" }')
      echo "| $model batch $batch | ${ours:-n/a} | ${theirs:-n/a} | $ratio |" >>"$summary"
    done
    { echo; echo 'breakdowns:'; echo '```'; grep -h '^breakdown\|bench:' "$out"/bench_*.log; echo '```'; } >>"$summary"
  elif [ "$gpu" = 0 ]; then
    { echo; echo "training and bench: left out (no GPU)"; } >>"$summary"
  fi

  echo >>"$summary"
  echo "total time $((SECONDS - started)) s; $failed failing step(s)" >>"$summary"
  rm -rf "$work"
  cat "$summary"
  say "logs and summary in $out"
  [ "$failed" -eq 0 ]
}

case "$mode" in
  bundle) shift; bundle "$@" ;;
  pack) shift; pack "$@" ;;
  list) shift; list "$@" ;;
  run) shift; run "$@" ;;
  -h | --help | "") sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0" ;;
  *) die "unknown mode '$mode' (bundle, run, pack or list; see --help)" ;;
esac
