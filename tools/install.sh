#!/usr/bin/env bash
# Installs dtrain as a library (docs/api.md): libdtrain.so, libdtrain.a,
# the headers under include/dtrain/ and a pkg-config file. Idempotent: a
# second run leaves the same files (the header folder is replaced whole).
#
#   tools/install.sh PREFIX
#       builds //:dtrain with Bazel (tools/setup.sh first, the configuration
#       ./dtrain builds with), then installs as below
#   tools/install.sh --from-bazel-bin DIR [--source-dir SRC] PREFIX
#       installs files already built: DIR/libdtrain.{so,a,libs,keep} (Bazel's
#       bazel-bin, or a test's runfiles); the headers are dtrain.h and what it
#       includes, transitively, from SRC (default: this repository)
#
# It writes
#   PREFIX/lib/libdtrain.so, PREFIX/lib/libdtrain.a
#   PREFIX/include/dtrain/dtrain.h, PREFIX/include/dtrain/core/*.h, ...
#   PREFIX/lib/pkgconfig/dtrain.pc
# and then
#   cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs dtrain)
# builds a program that runs without LD_LIBRARY_PATH; statically, against
# libdtrain.a:
#   cc prog.c $(pkg-config --cflags dtrain) \
#     $(pkg-config --static --libs dtrain | sed 's/-ldtrain/-l:libdtrain.a/')
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

usage() {
  sed -n '2,23p' "$(readlink -f "${BASH_SOURCE[0]}")" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "install: error: $*" >&2
  exit 1
}

bin=""
src=$root
prefix=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --from-bazel-bin)
      [ "$#" -ge 2 ] || usage
      bin=$2
      shift 2
      ;;
    --source-dir)
      [ "$#" -ge 2 ] || usage
      src=$2
      shift 2
      ;;
    -h | --help) usage ;;
    -*)
      echo "install: unknown option '$1'" >&2
      usage
      ;;
    *)
      [ -z "$prefix" ] || usage
      prefix=$1
      shift
      ;;
  esac
done
[ -n "$prefix" ] || usage

# ---- build ---------------------------------------------------------------
if [ -z "$bin" ]; then
  "$root/tools/setup.sh" --quiet >&2
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  echo "install: building //:dtrain (libdtrain.so, libdtrain.a)..." >&2
  if ! (cd "$root" && bazel build --noshow_progress --ui_event_filters=-info --show_result=0 \
    //:dtrain) >"$log" 2>&1; then
    cat "$log" >&2
    die "the build failed (see above)"
  fi
  rm -f "$log"
  trap - EXIT
  bin="$root/bazel-bin"
fi

for f in libdtrain.so libdtrain.a libdtrain.libs libdtrain.keep; do
  [ -f "$bin/$f" ] || die "$bin/$f is missing (bazel build //:dtrain)"
done
[ -f "$src/dtrain.h" ] || die "$src/dtrain.h is missing: --source-dir must be the repository"

mkdir -p "$prefix" || die "cannot create $prefix"
prefix=$(cd "$prefix" && pwd)
libdir=$prefix/lib
incdir=$prefix/include/dtrain

# ---- headers: dtrain.h and the closure of its #include "..." lines ----------
# Staged next to the destination, then swapped in, so that a failure leaves
# the previous installation as it was.
mkdir -p "$prefix/include" "$libdir/pkgconfig"
stage=$(mktemp -d "$prefix/include/.dtrain.XXXXXX")
trap 'rm -rf "$stage"' EXIT
queue=(dtrain.h)
declare -A seen=([dtrain.h]=1)
while [ "${#queue[@]}" -gt 0 ]; do
  h=${queue[0]}
  queue=("${queue[@]:1}")
  [ -f "$src/$h" ] || die "$h (included by an installed header) is not in $src"
  install -D -m 644 "$src/$h" "$stage/$h"
  while IFS= read -r inc; do
    [ -n "${seen[$inc]:-}" ] && continue
    seen[$inc]=1
    queue+=("$inc")
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src/$h")
done
rm -rf "$incdir.old"
[ -e "$incdir" ] && mv "$incdir" "$incdir.old"
mv "$stage" "$incdir"
chmod 755 "$incdir"
rm -rf "$incdir.old"
trap - EXIT

# ---- libraries (install(1) replaces a file, so running programs keep theirs)
install -m 755 "$bin/libdtrain.so" "$libdir/libdtrain.so"
install -m 644 "$bin/libdtrain.a" "$libdir/libdtrain.a"

# ---- pkg-config ----------------------------------------------------------
# libdtrain.so carries the run paths of what it needs (MPI, OpenBLAS, CUDA),
# where the linker and the loader find them: a dynamic link names only
# libdtrain. A static link adds what its objects need (Libs.private): the
# symbols that keep the objects registering backends from constructors,
# then the libraries the build linked.
keep=$(cat "$bin/libdtrain.keep")
libs=$(cat "$bin/libdtrain.libs")
cat >"$libdir/pkgconfig/dtrain.pc.tmp" <<PC
prefix=$prefix
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: dtrain
Description: Distributed deep-learning trainer: tensors, autograd, modules, optimizers, data, DDP and the trainer (C11 + CUDA)
Version: 0.1.0
Cflags: -I\${includedir}/dtrain
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldtrain
Libs.private: $keep $libs
PC
mv "$libdir/pkgconfig/dtrain.pc.tmp" "$libdir/pkgconfig/dtrain.pc"

echo "install: dtrain installed under $prefix ($(find "$incdir" -type f | wc -l) headers);" \
  "build with: cc prog.c \$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs dtrain)"
