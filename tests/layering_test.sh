#!/usr/bin/env bash
# The layering of DESIGN.md and core/BUILD, checked on the #include lines
# (Bazel here builds without a sandbox, so headers a target does not export
# would still be found on disk: this test is what keeps them private).
#   - folders: core/ includes only core/; cuda/ and models/ only core/ and
#     themselves; dist/ core/, cuda/ and itself; launch/ anything.
#   - core/ libraries, lowest first: status, backend, cpu | tensor, ops,
#     module, optim | data. A file includes only headers of its own library
#     or of one below it; the CPU backend and the tensor layer do not see
#     each other.
#   - private headers: core/*_internal.h only from core/ and tests/;
#     core/cpu_internal.h only from the CPU backend; cuda/ and dist/
#     internals only from their folder and tests/.
set -uo pipefail
# The source tree (under Bazel the script is a symlink into it).
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1

fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

# core/ file -> its library, and the libraries it may include from.
lib_of() {
  case "$(basename "$1")" in
    status.* | rng.* | parse.* | trace.*) echo status ;;
    backend.h | backend_registry.c | device.* | env.* | env_params.def | half* | kernels.c | \
      memory.* | op_table.def) echo backend ;;
    cpu.h | cpu_*) echo cpu ;;
    tensor* | autograd* | amp.* | autocast_policy.def) echo tensor ;;
    ops*) echo ops ;;
    module.* | nn.h | nn_* | param_arena.c) echo module ;;
    optim*) echo optim ;;
    step.*) echo step ;;
    checkpoint.h | ckpt_*) echo checkpoint ;;
    data* | text.h) echo data ;;
    *) echo unknown ;;
  esac
}
allowed() { # library -> libraries it may include
  case "$1" in
    status) echo "status" ;;
    backend) echo "status backend" ;;
    cpu) echo "status backend cpu" ;;
    tensor) echo "status backend tensor" ;;
    ops) echo "status backend tensor ops" ;;
    module) echo "status backend tensor ops module" ;;
    optim) echo "status backend tensor ops module optim" ;;
    data) echo "status backend tensor data" ;;
    step) echo "status backend tensor ops module optim step" ;;
    checkpoint) echo "status backend tensor ops module optim checkpoint" ;;
  esac
}

checked=0
while IFS= read -r f; do
  dir=${f%%/*}
  while IFS= read -r inc; do
    checked=$((checked + 1))
    idir=${inc%%/*}
    case "$dir:$idir" in
      core:core | cuda:core | cuda:cuda | models:core | models:models | dist:core | dist:dist | \
        dist:cuda | launch:* | tests:* | tools:*) ;;
      *) bad "$f includes $inc: $dir/ may not use $idir/" ;;
    esac
    case "$inc" in
      core/cpu_internal.h)
        case "$f" in core/cpu_*) ;; *) bad "$f includes $inc (private to the CPU backend)" ;; esac
        ;;
      core/*_internal.h)
        case "$dir" in core | tests) ;; *) bad "$f includes $inc (private to core/)" ;; esac
        ;;
      cuda/*_internal.h | cuda/*.cuh | cuda/cuda_check.h | cuda/block_pool.h)
        case "$dir" in cuda | tests | dist) ;; *) bad "$f includes $inc (private to cuda/)" ;; esac
        ;;
      dist/*_internal.h | dist/mpi_util.h | dist/nccl_check.h)
        case "$dir" in dist | tests) ;; *) bad "$f includes $inc (private to dist/)" ;; esac
        ;;
    esac
    if [ "$dir" = core ] && [ "$idir" = core ]; then
      from=$(lib_of "$f")
      to=$(lib_of "$inc")
      [ "$from" = unknown ] && bad "$f: not in any core/ library of this test (update lib_of)"
      case " $(allowed "$from") " in
        *" $to "*) ;;
        *) bad "$f ($from) includes $inc ($to): $from may use only $(allowed "$from")" ;;
      esac
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\/[^"]*\)".*/\1/p' "$f")
done < <(find core cuda dist models launch -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
  -o -name '*.cuh' -o -name '*.def' \) | sort)

[ "$checked" -gt 100 ] || bad "only $checked include lines found: is the tree there?"
if [ "$fail" = 0 ]; then
  echo "PASS: $checked include lines respect the layering"
fi
exit "$fail"
