#!/usr/bin/env bash
# Issue 27: the trainer library (train/) speaks of its configuration, not
# of a command line. Fails when
#   - a string literal in train/ names a command-line flag ("--lr"): its
#     messages name configuration fields between backquotes (`lr`), which
#     the command line rewrites to flags through its flag table;
#   - dt_train_config (train/train_config.h) has a string member other than
#     the paths and texts listed below: choices are enums;
#   - train/ compares strings against literals (strcmp(x, "sgd")): a choice
#     read from a string;
#   - train/ keeps mutable process-global state (a static variable outside a
#     function's constant tables).
set -uo pipefail
cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." || exit 1

fail=0
bad() {
  echo "FAIL: $*"
  fail=1
}

# String literals only (comments may name the flags that set a field).
flags=$(for f in train/*.c train/*.h; do
  gcc -fpreprocessed -dD -E -P -x c "$f" 2>/dev/null | grep '"[^"]*--[a-z][a-z-]*' | sed "s#^#$f: #"
done)
[ -z "$flags" ] || bad "flag names in train/'s strings:"$'\n'"$flags"

# The text and path members a configuration may hold as strings.
allowed="data_dir threads_note log_prefix agreed_config run_dir resume_path init_path image_folder"
members=$(awk '/^typedef struct dt_train_config \{/,/^\} dt_train_config;/' train/train_config.h |
  sed -n 's/^[[:space:]]*const char \*\([a-z_]*\);.*/\1/p')
[ -n "$members" ] || bad "no string members found in dt_train_config: is train/train_config.h there?"
for m in $members; do
  case " $allowed " in
    *" $m "*) ;;
    *) bad "dt_train_config.$m is a string: a choice must be an enum (paths and texts: $allowed)" ;;
  esac
done

# (mfu.c's peak table is looked up by its column's name, dt_mfu_gpu_peak.)
cmp=$(grep -n 'str\(n\)\?cmp([^)]*"[a-z0-9-]*"' train/*.c | grep -v 'gpu_peaks\[' || true)
[ -z "$cmp" ] || bad "train/ reads choices from strings:"$'\n'"$cmp"

globals=$(grep -n '^static [^(]*[;=]' train/*.c | grep -v '^[^:]*:[0-9]*:static const ' || true)
[ -z "$globals" ] || bad "process-global state in train/:"$'\n'"$globals"

[ "$fail" = 0 ] && echo "PASS: train/ names no flags, has no string-typed choices and no globals"
exit "$fail"
