#!/usr/bin/env bash
# dtrain as an installed library (tools/install.sh, docs/api.md): installs
# the built libdtrain.so / libdtrain.a and the headers into a scratch
# PREFIX, twice (the same files), then, with nothing but the installed files
# and pkg-config, compiles dtrain.h alone from C11 and C++17 with -Wall
# -Werror, and builds tests/install_smoke.c (an MLP's forward, backward and
# SGD step on the CPU) against libdtrain.so and statically against
# libdtrain.a: both run without LD_LIBRARY_PATH and print the same losses.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "${TEST_SRCDIR:-}" ]; then
  files="$TEST_SRCDIR/dtrain" # the built libraries and the headers, as runfiles
else
  files="$here/.."
  [ -f "$files/bazel-bin/libdtrain.so" ] && bin="$files/bazel-bin"
fi
bin=${bin:-$files}
install_sh="$files/tools/install.sh"
smoke_c="$files/tests/install_smoke.c"
# tmp, ok, not_ok and check (check_lib.sh; the installed files, not the
# dtrain binary, are what this test runs).
check_lib_without_dtrain=1
. "$(dirname "$(readlink -f "$0")")/check_lib.sh"
prefix="$tmp/prefix"
unset LD_LIBRARY_PATH

# ---- usage ------------------------------------------------------------------
"$install_sh" >"$tmp/usage.out" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q "tools/install.sh PREFIX" "$tmp/usage.out"; then
  ok "no argument: usage, exit 2"
else
  not_ok "no argument: exit $rc, expected 2 with the usage"
fi

# ---- install, twice -----------------------------------------------------------
listing() { (cd "$prefix" && find . -type f -exec sha256sum {} + | sort -k2) }
check "install into a scratch prefix" "$install_sh" --from-bazel-bin "$bin" --source-dir "$files" \
  "$prefix"
[ -s "$prefix/lib/pkgconfig/dtrain.pc" ] || { echo "$checks checks, the install failed"; exit 1; }
listing >"$tmp/first.txt"
check "install again" "$install_sh" --from-bazel-bin "$bin" --source-dir "$files" "$prefix"
listing >"$tmp/second.txt"
check "the second install leaves the same files" diff "$tmp/first.txt" "$tmp/second.txt"
for f in lib/libdtrain.so lib/libdtrain.a lib/pkgconfig/dtrain.pc include/dtrain/dtrain.h \
  include/dtrain/core/tensor.h include/dtrain/core/op_table.def \
  include/dtrain/core/env_params.def \
  include/dtrain/train/train_loop.h include/dtrain/dist/ddp.h include/dtrain/models/models.h; do
  check "installed: $f" test -s "$prefix/$f"
done
# Every quoted #include of an installed header is installed (the .def
# X-macro lists among them; core/autocast_policy.def and
# models/gpt2_sizes.def are .c files' only, so not installed).
missing=$(cd "$prefix/include/dtrain" && find . -type f -exec sed -n \
  's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' {} + | sort -u |
  while read -r inc; do [ -f "$inc" ] || echo "$inc"; done)
if [ -z "$missing" ]; then ok "the installed headers include only installed headers"; else
  not_ok "included but not installed: $missing"
fi
if ls "$prefix"/include/dtrain/*/*_internal.h >/dev/null 2>&1; then
  not_ok "private headers installed: $(ls "$prefix"/include/dtrain/*/*_internal.h)"
else
  ok "no *_internal.h installed"
fi

# ---- pkg-config ---------------------------------------------------------------
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags dtrain)
libs=$(pkg-config --libs dtrain)
static_libs=$(pkg-config --static --libs dtrain | sed 's/-ldtrain/-l:libdtrain.a/')
echo "pkg-config --cflags --libs dtrain: $cflags $libs"
check "Cflags name the installed headers" grep -q -- "-I$prefix/include/dtrain" <<<"$cflags"
check "Libs link libdtrain with a run path" grep -q -- "-Wl,-rpath,$prefix/lib -ldtrain" <<<"$libs"

# ---- the umbrella header alone, C11 and C++17 ------------------------------------
cd "$tmp" || exit 1 # nothing of the source tree on the include path
printf '#include <dtrain.h>\nint main(void) { return dt_last_error() == 0; }\n' >umbrella.c
cp umbrella.c umbrella.cc
# shellcheck disable=SC2086
check "dtrain.h compiles as C11 with -Wall -Werror" cc -std=c11 -Wall -Wextra -Werror $cflags \
  -c umbrella.c -o umbrella_c.o
# shellcheck disable=SC2086
check "dtrain.h compiles as C++17 with -Wall -Werror" c++ -std=c++17 -Wall -Wextra -Werror \
  $cflags -c umbrella.cc -o umbrella_cc.o
# shellcheck disable=SC2086
check "a C++ program links against libdtrain.so (extern \"C\")" c++ umbrella_cc.o $libs \
  -o umbrella_cc

# ---- the smoke program, dynamic and static ----------------------------------------
# shellcheck disable=SC2086
check "install_smoke.c builds against libdtrain.so" cc -std=c11 -Wall -Werror "$smoke_c" \
  $cflags $libs -o smoke_dynamic
# shellcheck disable=SC2086
check "install_smoke.c builds statically against libdtrain.a (pkg-config --static)" \
  cc -std=c11 -Wall -Werror "$smoke_c" $cflags $static_libs -o smoke_static
check "the dynamic program needs libdtrain.so" grep -q "libdtrain.so" \
  <(readelf -d smoke_dynamic 2>&1 | grep NEEDED)
if readelf -d smoke_static 2>&1 | grep NEEDED | grep -q libdtrain; then
  not_ok "the static program needs libdtrain.so"
else
  ok "the static program does not need libdtrain.so"
fi
check "the dynamic program runs (no LD_LIBRARY_PATH)" ./smoke_dynamic
cp "$tmp/cmd.out" dynamic.out
check "the static program runs" ./smoke_static
cp "$tmp/cmd.out" static.out
echo "dynamic: $(cat dynamic.out)"
echo "static:  $(cat static.out)"
check "both print a loss" grep -Eq '^loss [0-9.]+ -> [0-9.]+$' dynamic.out
check "both print the same losses" cmp dynamic.out static.out

echo "$checks checks, $failures failures"
[ "$failures" = 0 ]
