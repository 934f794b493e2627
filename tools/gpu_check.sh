#!/usr/bin/env bash
# Checks the CUDA path on a GPU machine that has no Bazel (see
# ../shared/recipes/gpu-check.md). Two steps:
#
#   tools/gpu_check.sh bundle [TARBALL]      on the development machine
#   tools/gpu_check.sh run [TARBALL] [OUT]   on the GPU machine
#
# bundle: builds the CUDA test suites (every //tests target whose name has
#   cuda, nccl or gpu in it) and dtrain, and packs them with the shared
#   libraries the GPU machine lacks (the workspace's own .so files, OpenBLAS,
#   libgfortran, libgomp, libstdc++, ...; never glibc nor the CUDA libraries,
#   which are large and present there) and Fashion-MNIST into TARBALL
#   (default out/gpu_bundle.tar.xz, git-ignored), which must stay under 64 MiB.
#   Prints the contents and the size.
# run: unpacks TARBALL, finds libcudart/libcublas/libcudnn/libnccl (the CUDA
#   toolkit, then pip's nvidia/*/lib under python3's site-packages), sets
#   LD_LIBRARY_PATH, prints nvidia-smi and the versions, runs every suite
#   (logs and gtest XML to OUT, default $OUT or out/gpu_results), then
#   `dtrain doctor`, a short LeNet-5 and MLP training run on cuda:0 and
#   `dtrain bench --device cuda:0` beside tools/bench_torch.py on the same GPU,
#   and writes OUT/summary.md. Exit status: 0 when every suite passed.
set -uo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
mode=${1:-}
say() { echo "gpu_check: $*"; }
die() {
  echo "gpu_check: error: $*" >&2
  exit 1
}

# Libraries the GPU machine has (glibc) or must provide itself (CUDA, driver).
skip_lib() {
  case "$(basename "$1")" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | \
      libcuda.so* | libcudart.so* | libcublas* | libcudnn* | libnccl* | libnvidia*) return 0 ;;
  esac
  return 1
}

bundle() {
  local tarball=${1:-$root/out/gpu_bundle.tar.xz}
  local limit=$((64 * 1024 * 1024))
  cd "$root" || die "no repository at $root"
  local targets
  targets=$(bazel query 'attr(name, "cuda|nccl|gpu", kind("cc_test", //tests:all))' 2>/dev/null)
  [ -n "$targets" ] || die "bazel query found no CUDA test targets under //tests"
  say "building: $(echo $targets) //launch:dtrain"
  bazel build $targets //launch:dtrain >/dev/null 2>&1 || die "bazel build failed: run it by hand"
  local bin
  bin=$(bazel info bazel-bin 2>/dev/null)
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/gpu_bundle/bin" "$stage/gpu_bundle/lib" "$stage/gpu_bundle/data"
  local exe
  for t in $targets //launch:dtrain; do
    exe="$bin/$(echo "${t#//}" | tr : /)"
    [ -x "$exe" ] || die "$exe was not built"
    cp -L "$exe" "$stage/gpu_bundle/bin/"
    ldd "$exe" | awk '/=> \// { print $3 }' | while read -r lib; do
      skip_lib "$lib" || cp -Ln "$lib" "$stage/gpu_bundle/lib/" 2>/dev/null
    done
  done
  if [ -d "$root/data/fashion-mnist" ]; then
    cp -rL "$root/data/fashion-mnist" "$stage/gpu_bundle/data/"
  else
    say "warning: data/fashion-mnist missing (tools/setup.sh): the training runs will be skipped"
  fi
  cp "$root/tools/bench_torch.py" "$stage/gpu_bundle/" 2>/dev/null
  mkdir -p "$(dirname "$tarball")"
  tar -C "$stage" -cJf "$tarball" gpu_bundle || die "tar failed"
  (cd "$stage" && find gpu_bundle -type f -printf '%10s  %p\n' | sort -k2)
  rm -rf "$stage"
  local size
  size=$(stat -c %s "$tarball")
  say "wrote $tarball ($((size / 1024 / 1024)) MiB of 64 MiB)"
  [ "$size" -lt "$limit" ] || die "$tarball is over 64 MiB: drop data or libraries"
}

# Directory holding $1 among the toolkit and pip's nvidia packages, or "".
find_lib() {
  local name=$1 d
  for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/local/cuda/targets/*/lib "${site_dirs[@]}"; do
    [ -e "$d/$name" ] && { echo "$d"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }' | xargs -r dirname
}

run() {
  local tarball=${1:-$root/out/gpu_bundle.tar.xz}
  local out=${2:-${OUT:-$root/out/gpu_results}}
  [ -f "$tarball" ] || die "$tarball not found: run 'tools/gpu_check.sh bundle' first"
  mkdir -p "$out"
  local work
  work=$(mktemp -d)
  tar -C "$work" -xJf "$tarball" || die "cannot unpack $tarball"
  local b="$work/gpu_bundle"

  local python=${PYTHON:-python3}
  mapfile -t site_dirs < <("$python" - <<'EOF' 2>/dev/null
import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for lib in sorted(glob.glob(d + "/nvidia/*/lib")):
        print(lib)
EOF
)
  local ld="$b/lib" missing=() d
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2; do
    d=$(find_lib "$lib")
    if [ -n "$d" ]; then
      case ":$ld:" in *":$d:"*) ;; *) ld="$ld:$d" ;; esac
    else
      missing+=("$lib")
    fi
  done
  export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

  {
    echo "# gpu_check $(date -u +%FT%TZ) on $(hostname)"
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    [ ${#missing[@]} -eq 0 ] || echo "MISSING libraries: ${missing[*]}"
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' 2>&1
  } | tee "$out/environment.txt"

  local summary="$out/summary.md" failed=0
  {
    echo "# dtrain GPU check"
    echo
    echo "| suite | passed | failed | skipped | status |"
    echo "|---|---|---|---|---|"
  } >"$summary"
  local exe name rc pass fail skip
  for exe in "$b"/bin/*_test; do
    name=$(basename "$exe")
    "$exe" --gtest_output="xml:$out/$name.xml" >"$out/$name.log" 2>&1
    rc=$?
    pass=$(grep -c '^\[       OK \]' "$out/$name.log")
    fail=$(grep -c '^\[  FAILED  \] .*(' "$out/$name.log")
    skip=$(grep -c '^\[  SKIPPED \] .*(' "$out/$name.log")
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    echo "| $name | $pass | $fail | $skip | $([ "$rc" -eq 0 ] && echo ok || echo "FAILED (exit $rc)") |" >>"$summary"
    say "$name: $pass passed, $fail failed, $skip skipped (exit $rc)"
  done

  local dtrain="$b/bin/dtrain"
  if [ -x "$dtrain" ]; then
    "$dtrain" doctor >"$out/doctor.txt" 2>&1
    echo >>"$summary"
    echo '## dtrain doctor' >>"$summary"
    { echo '```'; cat "$out/doctor.txt"; echo '```'; } >>"$summary"
    if [ -d "$b/data/fashion-mnist" ]; then
      echo >>"$summary"
      echo '## training (1 epoch, cuda:0)' >>"$summary"
      for model in lenet mlp; do
        timeout 600 "$dtrain" train --model "$model" --device cuda:0 --epochs 1 \
          --data fashion-mnist --data-dir "$b/data" >"$out/train_$model.log" 2>&1
        rc=$?
        echo "- $model: exit $rc; last lines:" >>"$summary"
        { echo '```'; tail -n 4 "$out/train_$model.log"; echo '```'; } >>"$summary"
      done
    fi
    echo >>"$summary"
    echo '## throughput (steps/s, warm-up excluded)' >>"$summary"
    echo '| model | dtrain cuda:0 | PyTorch cuda |' >>"$summary"
    echo '|---|---|---|' >>"$summary"
    for config in "mlp 128" "lenet 64"; do
      read -r model batch <<<"$config"
      local ours theirs
      ours=$("$dtrain" bench --model "$model" --batch "$batch" --steps 300 --device cuda:0 2>&1 |
        sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p')
      theirs=$("$python" "$b/bench_torch.py" --model "$model" --batch "$batch" --steps 300 \
        --device cuda 2>&1 | sed -n 's/^steps_per_s=\([0-9.]*\).*/\1/p')
      echo "| $model batch $batch | ${ours:-n/a} | ${theirs:-n/a} |" >>"$summary"
    done
  fi
  rm -rf "$work"
  cat "$summary"
  say "logs and summary in $out"
  [ "$failed" -eq 0 ]
}

case "$mode" in
  bundle) shift; bundle "$@" ;;
  run) shift; run "$@" ;;
  -h | --help | "") sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown mode '$mode' (bundle or run; see --help)" ;;
esac
