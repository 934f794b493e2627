#!/usr/bin/env bash
# Issue 27: the examples as an embedder builds them. Installs the built
# library into a scratch prefix (tools/install.sh --from-bazel-bin), then
# for each examples/*.c: builds it with a plain
#   cc FILE $(pkg-config --cflags --libs dtrain)
# and runs that build and Bazel's with no arguments under mpirun: 2 ranks
# (DDP) and 1 rank; every run exits 0, and the DDP run's val_loss equals the
# single process's within 0.01 (amp_cli_test's bf16 DDP tolerance: the
# examples train in bf16), as do the two builds' results.
set -uo pipefail

files="${TEST_SRCDIR:-}/dtrain"
[ -n "${TEST_SRCDIR:-}" ] || files=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/bazel-bin
src="${TEST_SRCDIR:+$TEST_SRCDIR/dtrain}"
src=${src:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# tmp, ok and not_ok (check_lib.sh; this test runs its own builds, not the
# dtrain binary).
check_lib_without_dtrain=1
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
prefix="$tmp/prefix"
mpirun_local="$src/tests/dist/mpirun_local.sh"
unset LD_LIBRARY_PATH

within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }

if ! "$src/tools/install.sh" --from-bazel-bin "$files" --source-dir "$src" "$prefix" >"$tmp/install.out" 2>&1; then
  cat "$tmp/install.out"
  echo "FAIL: tools/install.sh"
  exit 1
fi
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"

# run NAME NP PROGRAM: runs PROGRAM on NP ranks in a scratch folder (the
# run directory goes under it), its output in $tmp/NAME.out; prints val_loss.
run() {
  local name=$1 np=$2 prog=$3
  mkdir -p "$tmp/$name"
  if (cd "$tmp/$name" && timeout 600 "$mpirun_local" "$np" "$prog") >"$tmp/$name.out" 2>&1; then
    sed -n 's/^val_loss=\([0-9.]*\)$/\1/p' "$tmp/$name.out" | tail -1
  else
    echo "exit $?"
  fi
}

n=0
for c in "$src"/examples/*.c; do
  n=$((n + 1))
  name=$(basename "$c" .c)
  # shellcheck disable=SC2046
  if cc -std=c11 -Wall -Werror "$c" $(pkg-config --cflags --libs dtrain) -o "$tmp/$name" \
    >"$tmp/$name.cc.out" 2>&1; then
    ok "$name: cc FILE \$(pkg-config --cflags --libs dtrain)"
  else
    not_ok "$name: cc against the installed copy"
    sed 's/^/  /' "$tmp/$name.cc.out" | tail -20
    continue
  fi
  lines=$(wc -l <"$c")
  [ "$lines" -le 150 ] && ok "$name: $lines lines" || not_ok "$name: $lines lines, at most 150"
  ddp=$(run "$name-cc-2" 2 "$tmp/$name")
  single=$(run "$name-cc-1" 1 "$tmp/$name")
  bazel_ddp=$(run "$name-bazel-2" 2 "$src/examples/$name")
  for r in "cc-2:$ddp" "cc-1:$single" "bazel-2:$bazel_ddp"; do
    case "${r#*:}" in
      [0-9]*) ok "$name ${r%%:*}: val_loss=${r#*:}" ;;
      *) not_ok "$name ${r%%:*}: no val_loss line (${r#*:})"; tail -15 "$tmp/$name-${r%%:*}.out" ;;
    esac
  done
  grep -q "checkpoint of step" "$tmp/$name-cc-2.out" && ok "$name: a checkpoint saved (hook)" ||
    not_ok "$name: no checkpoint_saved hook line"
  within "$ddp" "$single" 0.01 && ok "$name: DDP $ddp = one process $single (within 0.01)" ||
    not_ok "$name: DDP val_loss $ddp, one process $single: want within 0.01"
  within "$ddp" "$bazel_ddp" 0.01 && ok "$name: cc build $ddp = Bazel build $bazel_ddp" ||
    not_ok "$name: cc build $ddp, Bazel build $bazel_ddp"
done
[ "$n" -gt 0 ] || not_ok "no examples/*.c"
echo "$checks checks, $failures failed"
[ "$failures" = 0 ]
