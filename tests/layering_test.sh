#!/usr/bin/env bash
# The layering of DESIGN.md and core/BUILD, checked on the #include lines
# (Bazel here builds without a sandbox, so headers a target does not export
# would still be found on disk: this test is what keeps them private).
#   - folders: core/ includes only core/; cuda/ and models/ only core/ and
#     themselves; dist/ core/, cuda/ and itself; train/ (the trainer)
#     core/, cuda/, dist/, models/ and itself; launch/ anything; examples/
#     only dtrain.h (the public API) and the C library.
#   - core/ libraries (core/libraries.bzl): a file includes only headers
#     of its own library or of one it builds on; the CPU backend and the
#     tensor layer, say, do not see each other.
#   - private headers: core/*_internal.h only from core/ and tests/;
#     core/cpu_internal.h only from the CPU backend; cuda/ and dist/
#     internals only from their folder and tests/.
set -uo pipefail
# core/'s libraries (core/libraries.bzl) as //core:libraries.txt: lines
# "file PATTERN LIBRARY" (a core/ file name pattern) and "allow LIBRARY
# LIBRARIES..." (the library and those it builds on).
libraries_txt=$(readlink -f "${1:?usage: layering_test.sh path/to/core/libraries.txt}")
# The source tree (under Bazel the script is a symlink into it).
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1

fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

patterns=()
pattern_libs=()
declare -A allowed_of
while read -r kind name rest; do
  case "$kind" in
    file)
      patterns+=("$name")
      pattern_libs+=("$rest")
      ;;
    allow) allowed_of[$name]=$rest ;;
  esac
done <"$libraries_txt"
[ "${#patterns[@]}" -gt 0 ] || bad "no core/ library in $libraries_txt"

# core/ file -> its library, and the libraries it may include from.
lib_of() {
  local base i
  base=$(basename "$1")
  for i in "${!patterns[@]}"; do
    # shellcheck disable=SC2254 # a file name pattern
    case "$base" in ${patterns[$i]})
      echo "${pattern_libs[$i]}"
      return
      ;;
    esac
  done
  echo unknown
}
allowed() { echo "${allowed_of[$1]:-}"; }

checked=0
while IFS= read -r f; do
  dir=${f%%/*}
  while IFS= read -r inc; do
    checked=$((checked + 1))
    idir=${inc%%/*}
    case "$dir:$idir" in
      core:core | cuda:core | cuda:cuda | models:core | models:models | dist:core | dist:dist | \
        dist:cuda | train:core | train:cuda | train:dist | train:models | train:train | \
        launch:* | tests:* | tools:*) ;;
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
      [ "$from" = unknown ] && bad "$f: not in any core/ library (add it to core/libraries.bzl)"
      case " $(allowed "$from") " in
        *" $to "*) ;;
        *) bad "$f ($from) includes $inc ($to): $from may use only $(allowed "$from")" ;;
      esac
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\/[^"]*\)".*/\1/p' "$f")
done < <(find core cuda dist models train launch examples -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \
  -o -name '*.cuh' -o -name '*.def' \) | sort)

# examples/ use the public API only: dtrain.h and the C library.
for f in examples/*.c; do
  [ -e "$f" ] || continue
  while IFS= read -r inc; do
    case "$inc" in
      '"dtrain.h"' | '<'[a-z]*'.h>') ;;
      *) bad "$f includes $inc: an example uses only "dtrain.h" (and the C library)" ;;
    esac
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\([<"][^>"]*[>"]\).*/\1/p' "$f")
done

[ "$checked" -gt 100 ] || bad "only $checked include lines found: is the tree there?"
if [ "$fail" = 0 ]; then
  echo "PASS: $checked include lines respect the layering"
fi
exit "$fail"
