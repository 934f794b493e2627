#!/usr/bin/env bash
# The layout of every C, C++ and CUDA source of the project is the checked-in
# .clang-format's (clang-format 14, which tools/setup.sh installs): a change
# that leaves a file unformatted fails here, naming the file and the first
# lines clang-format would change. Fix with: clang-format -i FILE.
# Generated files (core/data_unicode_tables.c) are left as generated.
# Also STYLE.md's size: no product source (outside tests/, not generated)
# over 800 lines; a file that passes it is usually two ideas.
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1

fmt=$(command -v clang-format-14 || command -v clang-format) ||
  { echo "FAIL: no clang-format (tools/setup.sh installs clang-format-14)"; exit 1; }
[ -f .clang-format ] || { echo "FAIL: no .clang-format"; exit 1; }

fail=0
n=0
while IFS= read -r f; do
  n=$((n + 1))
  if ! "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1; then
    fail=1
    echo "FAIL: $f is not formatted (clang-format -i $f):"
    "$fmt" "$f" | diff "$f" - | head -12 | sed 's/^/  /'
  fi
done < <(find core cuda dist models train launch tests tools examples dtrain.h -type f \
  \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) \
  ! -name data_unicode_tables.c | sort)

while IFS= read -r f; do
  lines=$(wc -l <"$f")
  [ "$lines" -le 800 ] || {
    fail=1
    echo "FAIL: $f has $lines lines: split it (at most 800)"
  }
done < <(find core cuda dist models train launch examples -type f \( -name '*.c' -o -name '*.h' \
  -o -name '*.cu' -o -name '*.cuh' \) ! -name data_unicode_tables.c | sort)

[ "$n" -gt 100 ] || { echo "FAIL: only $n sources found: is the tree there?"; exit 1; }
[ "$fail" = 0 ] && echo "PASS: $n sources formatted as .clang-format says, none of the product's over 800 lines"
exit "$fail"
