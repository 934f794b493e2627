#!/usr/bin/env bash
# Issue 32, defect 1: one run per run directory (train/run_lock.h), through
# the dtrain binary:
#   - a second `train --run-dir D` while D's run is alive: refused at start
#     (exit 1) naming D, the holder's pid and host; the first run ends
#     intact: exit 0, its own config.json, checkpoint and train.log, a
#     metrics.jsonl of one JSON record a line, and `dtrain report D` works;
#   - `--resume auto` of D while its run is alive: refused the same way;
#   - a 2-rank job on D while its run is alive: refused on every rank;
#   - a run killed by SIGKILL leaves run.lock with its record: the next run
#     (--resume auto) takes the directory over, saying so;
#   - a 2-rank job with ZeRO (every rank writes there) on one directory
#     trains; ranks that see two different directories are refused, the
#     rank that does not see rank 0's lock named.
# The holder is kept alive without timing: its stdout is a FIFO that this
# script stops reading after the "run directory" line, and its log lines
# (~100 KB) cannot fit in the pipe, so it cannot end before the script
# reads on.
set -uo pipefail
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist) || exit 1
export DT_DATA_DIR="$data_dir" DT_NUM_THREADS=1
host=$(uname -n)
py=/usr/bin/python3
[ -x "$py" ] || py=python3
quick=(train --model mlp --max-steps 3 --log-interval 0)
run() { timeout 120 "$dtrain" "$@" >"$out" 2>"$err"; rc=$?; }

holder=
trap '[ -n "$holder" ] && kill -9 "$holder" 2>/dev/null' EXIT
# start_holder DIR ARGS...: a long `train` on DIR, alive and holding DIR
# (its "run directory" line read) on return; $holder is its pid, fd 3 its
# stdout (the rest of it: finish_holder).
start_holder() {
  local dir=$1 line
  shift
  rm -f "$tmp/fifo" "$tmp/holder.out"
  mkfifo "$tmp/fifo"
  (exec "$dtrain" train --model mlp --max-steps 800 --batch 4 --lr 0.005 --log-interval 1 \
    --run-dir "$dir" "$@" >"$tmp/fifo" 2>"$tmp/holder.err") &
  holder=$!
  exec 3<"$tmp/fifo"
  while read -r -t 120 -u 3 line; do
    echo "$line" >>"$tmp/holder.out"
    case $line in *"run directory $dir") return 0 ;; esac
  done
  not_ok "the holder on $dir did not start: $(cat "$tmp/holder.err")"
  return 1
}
finish_holder() { # the holder's remaining output read; its exit status in $holder_rc
  cat <&3 >>"$tmp/holder.out"
  exec 3<&-
  wait "$holder"
  holder_rc=$?
  holder=
}
refused() { # refused DIR DESCRIPTION: the last run was refused for DIR's live holder
  expect 1 err "run directory $1 is in use by another run: pid $holder on host $host \(since [0-9T:.-]+Z\); its lock file $1/run.lock: .*--run-dir" "$2"
  expect_not out "^epoch|step " "$2: before any step"
}

# ---- a second run, a resume and a 2-rank job on a live run's directory ----
d="$tmp/busy"
start_holder "$d" --seed 7 || exit 1
run "${quick[@]}" --run-dir "$d" --seed 8
refused "$d" "a second run on a live run's directory"
run "${quick[@]}" --run-dir "$d" --seed 7 --resume auto
refused "$d" "--resume auto of a live run's directory"
timeout 120 "$dtrain" launch -n 2 --threads 1 -- "${quick[@]}" --run-dir "$d" >"$out" 2>"$err"
rc=$?
refused "$d" "a 2-rank job on a live run's directory"
finish_holder
rc=$holder_rc
out="$tmp/holder.out" expect 0 out "^test_accuracy=0\.[0-9]{4}$" "the first run ends: exit 0 and its result"
check "its config.json is its own (seed 7)" grep -q '"seed": 7,' "$d/config.json"
check "its checkpoint alone" test "$(ls "$d/checkpoints")" = step_00000800
check "train.log is its own (one run)" test "$(grep -c "run directory" "$d/train.log")" = 1
check "metrics.jsonl: one JSON record a line, one run" "$py" -c '
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
assert sum(r["type"] == "run" for r in recs) == 1, "not one run record"' "$d/metrics.jsonl"
run report "$d"
expect 0 out "wrote .*report.html" "dtrain report of the first run's directory"
check "run.lock is cleared at the end" test -e "$d/run.lock" -a ! -s "$d/run.lock"

# ---- a run killed by SIGKILL does not block its directory ----
d="$tmp/killed"
start_holder "$d" || exit 1
killed=$holder
kill -9 "$holder"
finish_holder
check "the killed run's record stays in run.lock" grep -q "^pid $killed$" "$d/run.lock"
run "${quick[@]}" --run-dir "$d" --resume auto
expect 0 out "note: run directory $d was last held by pid $killed on host $host .*did not release it" \
  "a SIGKILLed run's lock: the next run takes the directory over"

# ---- ranks of one job share their directory ----
d="$tmp/two"
timeout 120 "$dtrain" launch -n 2 --threads 1 -- "${quick[@]}" --optimizer adamw --zero 1 \
  --run-dir "$d" >"$out" 2>"$err"
rc=$?
expect 0 out "^test_accuracy=0\.[0-9]{4}$" "a 2-rank job (ZeRO: every rank writes) on one directory"
check "both ranks' optimizer shards" test -s "$d/checkpoints/step_00000003/optimizer.rank00001.bin"
# Rank 1 in another working directory: the same --run-dir is another directory.
mpi_args=(--oversubscribe --bind-to none -x DT_NUM_THREADS=1 -x DT_DATA_DIR)
[ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)
mkdir -p "$tmp/w0" "$tmp/w1"
args=("${quick[@]}" --optimizer adamw --zero 1 --comm-timeout 20 --run-dir rel)
timeout 120 mpirun "${mpi_args[@]}" -np 1 -wdir "$tmp/w0" "$dtrain" "${args[@]}" : \
  -np 1 -wdir "$tmp/w1" "$dtrain" "${args[@]}" >"$out" 2>"$err"
rc=$?
expect 1 err "rank 1: this rank \(1\) cannot open the run directory's lock file rel/run.lock that rank 0 holds" \
  "ranks that see different directories are refused, naming the rank"

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]
