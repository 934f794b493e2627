#!/usr/bin/env bash
# `dtrain tokenize`: usage errors, shards from files and folders (llm.c's
# header, the split by file), a Brown folder detagged, and `--brown` alone
# writing data/brown/{train,val}.bin once. GPT-2's files come from
# $DT_DATA_DIR or the repository's data/ (tools/setup.sh).
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/check_lib.sh"

data=$(find_data_dir gpt2) || exit 1
if [ ! -s "$data/gpt2/encoder.json" ]; then
  echo "tokenize_cli_test: no GPT-2 tokenizer files in $data/gpt2: run tools/setup.sh" >&2
  exit 1
fi
unset DT_DATA_DIR

# The header's int32 at byte offset $2 of file $1.
header_int() { od -An -t d4 -j "$2" -N 4 "$1" | tr -d ' '; }

run help tokenize
expect 0 out "usage: dtrain tokenize --in" "dtrain help tokenize"
run --help
expect 0 out "tokenize" "dtrain --help lists tokenize"
run tokenize
expect 2 err "no input" "no input"
run tokenize --in
expect 2 err "--in needs at least one" "--in without values"
run tokenize --in x
expect 2 err "give --out DIR" "no --out"
run tokenize --in x --out "$tmp/o" --val-fraction 1.5
expect 2 err "invalid value '1.5' for --val-fraction" "bad --val-fraction"
run tokenize --in x --out "$tmp/o" --frobnicate
expect 2 err "dtrain tokenize: unknown flag --frobnicate \(see dtrain tokenize --help\)" \
  "unknown flag"
run tokenize --in x --out
expect 2 err "flag --out needs a value" "--out without its value"
run tokenize --in x --out "$tmp/o" --brown=maybe
expect 2 err "invalid value 'maybe' for --brown: expected true or false" "bad --brown"
run tokenize --in x stray --out "$tmp/o" extra
expect 2 err "unexpected argument 'extra'" "an argument after the flags"
# The help comes from the flag table: accepted values and defaults.
run tokenize --help
expect 0 out "--val-fraction F +share of files for validation; \[0, 1\) \(default: 0.1\)" \
  "--help from the flag table"
run tokenize --in "$tmp/missing" --out "$tmp/o" --vocab "$data/gpt2"
expect 1 err "cannot read $tmp/missing" "missing input"
run tokenize --in "$tmp" --out "$tmp/o" --vocab "$tmp/novocab"
expect 1 err "tools/setup.sh" "missing tokenizer files"

# Ten files in a folder and one more by name: the 10th (d9.txt) goes to validation.
mkdir -p "$tmp/docs"
for i in 0 1 2 3 4 5 6 7 8 9; do
  printf 'Document number %s says hello.\n' "$i" >"$tmp/docs/d$i.txt"
done
printf 'The eleventh.\n' >"$tmp/extra.txt"
run tokenize --in "$tmp/docs" "$tmp/extra.txt" --out "$tmp/shards" --vocab "$data/gpt2"
expect 0 out "11 files \(10 train, 1 val\)" "a folder and a file"
expect 0 out "wrote $tmp/shards/train.bin and $tmp/shards/val.bin" "names the shards"
checks=$((checks + 1))
magic=$(header_int "$tmp/shards/val.bin" 0)
version=$(header_int "$tmp/shards/val.bin" 4)
count=$(header_int "$tmp/shards/val.bin" 8)
size=$(stat -c %s "$tmp/shards/val.bin")
if [ "$magic" = 20240520 ] && [ "$version" = 1 ] && [ "$size" = $((1024 + 2 * count)) ] &&
  [ "$count" -gt 5 ]; then
  echo "ok: val.bin has llm.c's header (magic, version, $count tokens)"
else
  fail "val.bin header: magic $magic version $version count $count size $size"
fi

# One file, split by tokens; --val-fraction 0 writes no val.bin.
run tokenize --in "$tmp/extra.txt" --out "$tmp/one" --vocab "$data/gpt2" --val-fraction 0
expect 0 out "wrote $tmp/one/train.bin$" "no validation shard at fraction 0"

# Inputs that are not files: a pipe of this process is read to its end (up
# to --pipe-limit-mb); a named FIFO given by name, a device or a socket is
# refused at once, naming it and what it is. Each run is bounded in time
# (timeout: before this, a FIFO and /dev/zero hung) and in memory (ulimit -v:
# /dev/zero or an endless pipe read on into all of it).
bounded() { # bounded SECONDS ARGS...: run_within, under 4 GiB of address space
  (
    ulimit -v 4194304
    run_within "$@"
    exit "$rc"
  )
  rc=$?
}
mkfifo "$tmp/fifo"
bounded 20 tokenize --in "$tmp/fifo" --out "$tmp/fifo_out" --vocab "$data/gpt2"
expect 1 err "$tmp/fifo is a named pipe \(FIFO\): opening it waits, for ever, for a writer" \
  "a named FIFO is refused at once"
bounded 20 tokenize --in "$tmp/extra.txt" /dev/zero --out "$tmp/zero_out" --vocab "$data/gpt2"
expect 1 err "/dev/zero is a character device, not a regular file" "/dev/zero is refused"
checks=$((checks + 1))
if [ ! -e "$tmp/zero_out" ]; then
  echo "ok: nothing written for a refused input"
else
  fail "$tmp/zero_out was written"
fi
# shellcheck disable=SC2030,SC2031 # rc is set in the subshell's parent
(
  ulimit -v 4194304
  yes | timeout 60 "$dtrain" tokenize --in /dev/stdin --out "$tmp/yes_out" --vocab "$data/gpt2" \
    --pipe-limit-mb 1 >"$out" 2>"$err"
  exit "${PIPESTATUS[1]}"
)
rc=$?
expect 1 err "/dev/stdin: more than 1 MiB came through the pipe and it has not ended.*--pipe-limit-mb" \
  "an endless pipe stops at --pipe-limit-mb"
run tokenize --in /dev/stdin --out "$tmp/o" --pipe-limit-mb 0
expect 2 err "--pipe-limit-mb" "--pipe-limit-mb 0"
printf 'Hello world' | "$dtrain" tokenize --in /dev/stdin --out "$tmp/piped" --vocab "$data/gpt2" \
  --val-fraction 0 >"$out" 2>"$err"
rc=$?
expect 0 out "1 files \(1 train, 0 val\).* 3 train" "a pipe: <|endoftext|> Hello world"
# A named FIFO the shell opens for it (< FIFO), its writer already gone; and
# a process substitution (/dev/fd/N) next to a file.
(printf 'Hello world' >"$tmp/fifo") &
bounded 20 tokenize --in /dev/stdin --out "$tmp/fifo_in" --vocab "$data/gpt2" --val-fraction 0 \
  <"$tmp/fifo"
expect 0 out "1 files \(1 train, 0 val\).* 3 train" "a FIFO as /dev/stdin"
bounded 20 tokenize --in <(printf 'Hello world') "$tmp/extra.txt" --out "$tmp/subst" \
  --vocab "$data/gpt2" --val-fraction 0
expect 0 out "2 files \(2 train, 0 val\)" "a process substitution and a file"

# --brown alone: data/brown/raw -> data/brown/{train,val}.bin, once.
mkdir -p "$tmp/data/brown/raw"
ln -s "$data/gpt2" "$tmp/data/gpt2"
for f in ca01 ca02 ca03 ca04 ca05 ca06 ca07 ca08 ca09 ca10; do
  printf '\tThe/at %s/np story/nn ,/, ``/`` he/pps said/vbd ./. '"''"'/'"''"'\n' "$f" \
    >"$tmp/data/brown/raw/$f"
done
echo "not part of the corpus" >"$tmp/data/brown/raw/README"
run tokenize --brown --data-dir "$tmp/data"
expect 0 out "brown/train.bin and val.bin are ready" "--brown alone"
checks=$((checks + 1))
if [ "$(header_int "$tmp/data/brown/train.bin" 8)" -gt 0 ] && [ -s "$tmp/data/brown/val.bin" ]; then
  echo "ok: data/brown/train.bin and val.bin written"
else
  fail "data/brown shards missing or empty"
fi
touch -d '2001-01-01' "$tmp/data/brown/train.bin"
before=$(stat -c %Y "$tmp/data/brown/train.bin")
DT_DATA_DIR="$tmp/data" "$dtrain" tokenize --brown >"$out" 2>"$err"
rc=$?
expect 0 out "ready" "--brown again (DT_DATA_DIR)"
checks=$((checks + 1))
if [ "$(stat -c %Y "$tmp/data/brown/train.bin")" = "$before" ]; then
  echo "ok: existing shards are left alone"
else
  fail "existing shards were rewritten"
fi

# Shards too short for one window of the context: the error names the file.
mkdir -p "$tmp/short"
printf 'One two three.' >"$tmp/five.txt"
run tokenize --in "$tmp/five.txt" --out "$tmp/short/brown" --val-fraction 0 --vocab "$data/gpt2"
expect 0 out "5 train and 0 val tokens" "a 5-token shard"
ln -s "$data/gpt2" "$tmp/short/gpt2"
cp "$tmp/short/brown/train.bin" "$tmp/short/brown/val.bin"
run train --model gpt2-tiny --ctx 16 --data-dir "$tmp/short" --max-steps 1
expect 1 err "short/brown/train.bin: a shard of 5 tokens holds no window of" \
  "training on a 5-token shard: exit 1 naming the file"
head -c 1024 "$tmp/short/brown/train.bin" >"$tmp/short/brown/val.bin"
printf '\0\0\0\0' | dd of="$tmp/short/brown/val.bin" bs=1 seek=8 conv=notrunc 2>/dev/null
cp "$tmp/short/brown/val.bin" "$tmp/short/brown/train.bin"
run train --model gpt2-tiny --ctx 16 --data-dir "$tmp/short" --max-steps 1
expect 1 err "short/brown/train.bin: a shard of 0 tokens holds no window of" \
  "training on an empty shard: exit 1 naming the file"

echo "$checks checks, $failures failures"
[ "$failures" = 0 ]
