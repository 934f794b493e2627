# Shared by the shell tests that run dtrain. Source it first thing, through
# the script's own location (Bazel's runfiles link to the source tree):
#   . "$(dirname "$(readlink -f "$0")")/check_lib.sh"      (in tests/)
#   . "$(dirname "$(readlink -f "$0")")/../check_lib.sh"   (in tests/*/)
# It sets
#   test_name  the test ("cli_test"), for its messages
#   repo       the source tree
#   dtrain     the built binary, absolute: the runfiles' one under Bazel,
#              else $repo/bazel-bin/launch/dtrain; exit 1 when there is none
#              (not looked for when the test sets check_lib_without_dtrain=1
#              before sourcing: a test of the installed library)
#   tmp        a scratch folder (TEST_TMPDIR under Bazel)
# and gives `run` (dtrain with stdout to $out, stderr to $err, status in
# $rc; a test may define its own), `expect RC WHERE PATTERN DESCRIPTION`
# (the last run exited RC and WHERE, out or err, matches the extended
# regex), `expect_not WHERE PATTERN DESCRIPTION`, `check_status
# STATUS DESCRIPTION`, `ok DESCRIPTION` and `not_ok DESCRIPTION` (a check
# that passed or failed), `check DESCRIPTION COMMAND...`, `fail`,
# `find_file`, `find_built`, `find_source` and `find_data_dir`. $failures
# and $checks count.
test_name=$(basename "$0" .sh)
repo=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

find_file() { # find_file PATH...: the first that exists, absolute
  local f
  for f in "$@"; do
    [ -e "$f" ] && { readlink -f "$f"; return 0; }
  done
  return 1
}

# find_built PATH: the built file PATH (launch/dtrain), absolute: the
# runfiles' one under Bazel, else $repo/bazel-bin's.
find_built() {
  find_file "${TEST_SRCDIR:-/nonexistent}/dtrain/$1" "$repo/bazel-bin/$1" ||
    { echo "$test_name: $1 not found (bazel build //${1%/*}:${1##*/})" >&2; return 1; }
}

# find_source PATH: the source file PATH (README.md), absolute: the
# runfiles' one under Bazel, else $repo's.
find_source() {
  find_file "${TEST_SRCDIR:-/nonexistent}/dtrain/$1" "$repo/$1" ||
    { echo "$test_name: $1 not found" >&2; return 1; }
}

if [ "${check_lib_without_dtrain:-0}" != 1 ]; then
  dtrain=$(find_built launch/dtrain) || exit 1
fi
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# find_data_dir SET...: the folder holding the named data sets: $DT_DATA_DIR,
# else the repository's data/ (tools/setup.sh), else /usr/share/datasets.
find_data_dir() {
  local dir set dirs=("$repo/data" /usr/share/datasets)
  [ -n "${DT_DATA_DIR:-}" ] && dirs=("$DT_DATA_DIR")
  for dir in "${dirs[@]}"; do
    for set in "$@"; do
      [ -d "$dir/$set" ] || continue 2
    done
    readlink -f "$dir"
    return 0
  done
  echo "$test_name: no $* under ${DT_DATA_DIR:-$repo/data or /usr/share/datasets}:" \
    "run tools/setup.sh or set DT_DATA_DIR" >&2
  return 1
}

# numpy_reader: sets py (Debian's python3, which has python3-numpy; not
# one earlier on PATH) and numpy_tool (tests/launch/ckpt_numpy.py, the
# checkpoint reader that uses no dtrain code).
numpy_reader() {
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  numpy_tool="$repo/tests/launch/ckpt_numpy.py"
}

# small_brown_data SRC: $tmp/data, a data folder with SRC's gpt2 and
# fashion-mnist and a small Brown set (ca01..ca03 of SRC/brown/raw, the last
# for validation: the evaluation at the end of a run stays short), made the
# default (DT_DATA_DIR).
small_brown_data() {
  local src=$1
  data="$tmp/data"
  mkdir -p "$data"
  ln -sfn "$src/gpt2" "$data/gpt2"
  ln -sfn "$src/fashion-mnist" "$data/fashion-mnist"
  run tokenize --brown --in "$src/brown/raw/ca01" "$src/brown/raw/ca02" "$src/brown/raw/ca03" \
    --val-fraction 0.34 --out "$data/brown" --data-dir "$data"
  expect 0 out "3 files \(2 train, 1 val\)" "a small Brown data set"
  export DT_DATA_DIR="$data"
}

# small_image_data SRC TRAIN TEST: $data, a data folder whose fashion-mnist
# holds the first TRAIN training and TEST test images of SRC's (idx files),
# for short runs of the image models. Sets py (numpy_reader).
small_image_data() {
  numpy_reader
  data="$tmp/small-images"
  mkdir -p "$data/fashion-mnist"
  "$py" - "$1/fashion-mnist" "$data/fashion-mnist" "$2" "$3" <<'PY' || return 1
import gzip, os, sys
src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for kind, n in (("train", n_train), ("t10k", n_test)):
    for what in ("images-idx3", "labels-idx1"):
        name = f"{kind}-{what}-ubyte"
        path = os.path.join(src, name)
        raw = gzip.open(path + ".gz").read() if os.path.exists(path + ".gz") else open(path, "rb").read()
        nd, per = raw[3], 1
        for i in range(1, nd):
            per *= int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big")
        head = raw[:4] + n.to_bytes(4, "big") + raw[8:4 + 4 * nd]
        open(os.path.join(dst, name), "wb").write(head + raw[4 + 4 * nd:4 + 4 * nd + n * per])
PY
}

# llama_cpp_prompts SCRIPT CTX: the five prompts of the llama.cpp tests in
# ${prompts[@]}, tokenized by dtrain (each after <|endoftext|>) as
# $tmp/prompts/train.bin and padded to CTX as $tmp/tokens (lm_logits_tool's
# input) by SCRIPT (tests/launch/gguf_llama_cpp.mjs).
llama_cpp_prompts() {
  local i files=()
  prompts=("The quick brown fox jumps over the lazy dog." "Hello, world! It's 2024."
    "  leading spaces and	tabs" "Numbers: 3.14159 and 1,000,000" "The jury said it did find that")
  for i in "${!prompts[@]}"; do
    printf '%s' "${prompts[$i]}" >"$tmp/prompt$i"
    files+=("$tmp/prompt$i")
  done
  run tokenize --in "${files[@]}" --val-fraction 0 --out "$tmp/prompts"
  expect 0 out "wrote" "the prompts tokenized by dtrain"
  check "the prompts' tokens, padded to the context" node "$1" prep "$tmp/prompts/train.bin" "$2" \
    "$tmp/tokens"
}

# greedy_samples CKPT N: `dtrain sample --temperature 0 --sample-len N` of
# CKPT for each of ${prompts[@]} as CKPT-greedy/sampleI (llama.cpp's greedy
# check in gguf_llama_cpp.mjs reads them).
greedy_samples() {
  local i
  mkdir -p "$1-greedy"
  for i in "${!prompts[@]}"; do
    run sample --checkpoint "$1" --prompt "${prompts[$i]}" --temperature 0 --sample-len "$2"
    [ "$rc" = 0 ] || not_ok "$1: dtrain sample of prompt $i exited $rc"
    cp "$out" "$1-greedy/sample$i"
  done
}

# within A B TOL: A and B are numbers at most TOL apart.
within() {
  [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { exit !(a - b <= t && b - a <= t) }'
}

# Ranks under mpirun must not share Bazel's per-test output files.
unshare_test_files() {
  unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE TEST_SHARD_STATUS_FILE GTEST_OUTPUT
}

failures=0
checks=0
out="$tmp/out"
err="$tmp/err"
rc=0

run() {
  "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}

# run_within SECONDS ARGS...: run, ended after SECONDS (nothing may hang).
run_within() {
  local seconds=$1
  shift
  timeout "$seconds" "$dtrain" "$@" >"$out" 2>"$err"
  rc=$?
}

fail() {
  failures=$((failures + 1))
  echo "FAIL: $*"
  echo "  stdout: $(tail -c 3000 "$out")"
  echo "  stderr: $(tail -c 3000 "$err")"
}

expect() {
  local want=$1 where=$2 pattern=$3 what=$4
  checks=$((checks + 1))
  if [ "$rc" != "$want" ]; then
    fail "$what: exit status $rc, expected $want"
  elif ! grep -Eq -- "$pattern" "${!where}"; then
    fail "$what: $where does not match /$pattern/"
  else
    echo "ok: $what"
  fi
}

ok() { # ok DESCRIPTION: a check that passed
  checks=$((checks + 1))
  echo "ok: $*"
}

not_ok() { # not_ok DESCRIPTION: a check that failed
  checks=$((checks + 1))
  failures=$((failures + 1))
  echo "FAIL: $*"
}

check_status() { # check_status STATUS DESCRIPTION: passed when STATUS is 0
  if [ "$1" = 0 ]; then ok "$2"; else not_ok "$2"; fi
}

# check DESCRIPTION COMMAND...: COMMAND succeeds (its output shown when not).
check() {
  local what=$1
  shift
  if "$@" >"$tmp/cmd.out" 2>&1; then ok "$what"; else
    not_ok "$what"
    sed 's/^/  /' "$tmp/cmd.out" | tail -30
  fi
}

expect_not() {
  local where=$1 pattern=$2 what=$3
  checks=$((checks + 1))
  if grep -Eq -- "$pattern" "${!where}"; then
    fail "$what: $where matches /$pattern/"
  else
    echo "ok: $what"
  fi
}

# expect_cmd DESCRIPTION COMMAND...: COMMAND (a checker) succeeds; its last
# line is shown, or its output when it fails.
expect_cmd() {
  local what=$1
  shift
  if "$@" >"$tmp/check.out" 2>&1; then
    ok "$what ($(tail -1 "$tmp/check.out"))"
  else
    not_ok "$what"
    sed 's/^/  /' "$tmp/check.out" | tail -20
  fi
}
