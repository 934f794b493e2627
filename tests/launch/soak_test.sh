#!/usr/bin/env bash
# Issue 9's soak: jobs of 2 and 3 ranks, each with one fault injected at a
# random moment (start-up included): kill -9, SIGSTOP or SIGTERM of a random
# rank, a bad flag or a drifted setting on one rank, or other data behind the
# same flags. Every job must end within --comm-timeout + 10 s, non-zero, with
# a message naming the rank and the cause, and leave no process behind.
#   SOAK_TRIALS (default 8; the note quotes 20) and SOAK_SEED choose the runs;
#   SOAK_DTRAIN another binary (a sanitizer build: any report fails a trial).
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
unshare_test_files
data_dir=$(find_data_dir fashion-mnist mnist) || exit 1
# SOAK_DTRAIN: another build to soak (e.g. --config=asan's; see the note).
if [ -n "${SOAK_DTRAIN:-}" ]; then
  dtrain=$(find_file "$SOAK_DTRAIN") || { echo "soak_test: no $SOAK_DTRAIN" >&2; exit 1; }
fi

trials=${SOAK_TRIALS:-8}
RANDOM=${SOAK_SEED:-$$}
timeout_s=5
mpi_args=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x DT_NUM_THREADS=1)
[ -n "${ASAN_OPTIONS:-}" ] && mpi_args+=(-x ASAN_OPTIONS)
[ "$(id -u)" = 0 ] && mpi_args+=(--allow-run-as-root)
faults=(kill9 stop term badflag drift data)
failures=0

# The pids of this trial's ranks (their --data-dir is the trial's folder).
rank_pid() { # rank_pid TRIAL_DIR RANK
  local pid
  for pid in $(pgrep -f -- "--data-dir $1( |$)"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}

for ((t = 1; t <= trials; t++)); do
  np=$((2 + RANDOM % 2))
  fault=${faults[RANDOM % ${#faults[@]}]}
  victim=$((RANDOM % np))
  delay_ms=$((RANDOM % 2500))
  dir="$tmp/trial$t"
  mkdir -p "$dir"
  ln -sfn "$data_dir/fashion-mnist" "$dir/fashion-mnist"
  # Long enough (about 5 s on 2 cores) that the faults, at most 2.5 s in,
  # land before the end: a SIGSTOP in a rank's exit handlers, after MPI_Finalize
  # and its peers' exit, is seen by no rank (mpirun waits; see the note).
  common=(train --model lenet --epochs 3 --max-steps 1000 --log-interval 0 --comm-timeout "$timeout_s"
    --run-dir "$dir/run")
  # One app context per rank, so that one of them can differ.
  apps=()
  for ((r = 0; r < np; r++)); do
    args=("${common[@]}" --data-dir "$dir")
    if [ "$r" = "$victim" ]; then
      case $fault in
        badflag) args+=(--batch 0) ;;
        drift) args+=(--lr 0.07) ;;
        data)
          mkdir -p "$dir/other"
          ln -sfn "$data_dir/mnist" "$dir/other/fashion-mnist"
          args=("${common[@]}" --data-dir "$dir/other")
          ;;
      esac
    fi
    [ "$r" -gt 0 ] && apps+=(:)
    apps+=(-np 1 "$dtrain" "${args[@]}")
  done
  start=$(date +%s%N)
  timeout -k 5 $((timeout_s + 40)) mpirun "${mpi_args[@]}" "${apps[@]}" >"$dir/out" 2>"$dir/err" &
  job=$!
  pid=""
  case $fault in
    kill9 | stop | term)
      sleep "$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
      # The rank may not have started yet: wait for it (a fault is always injected).
      for ((w = 0; w < 200; w++)); do
        pid=$(rank_pid "$dir" "$victim")
        [ -n "$pid" ] && break
        sleep 0.05
      done
      sig=$([ "$fault" = kill9 ] && echo KILL || ([ "$fault" = stop ] && echo STOP || echo TERM))
      # A rank that already exited was not faulted: pid stays empty.
      [ -n "$pid" ] && { kill -s "$sig" "$pid" 2>/dev/null || pid=""; }
      ;;
  esac
  wait "$job"
  rc=$?
  elapsed=$((($(date +%s%N) - start) / 1000000))
  # What must hold: the job ended, non-zero, in time, with a named cause.
  # (A fault injected after the run finished leaves a clean exit 0.)
  problems=()
  finished_clean=0
  if [ "$rc" = 0 ]; then
    if [[ $fault =~ ^(kill9|stop|term)$ ]] && [ -z "$pid" ] && grep -q "^test_accuracy=" "$dir/out"; then
      finished_clean=1
    elif [ "$fault" = term ] && grep -q "^test_accuracy=" "$dir/out" &&
      grep -Eq "^(rank $victim: )?dtrain train: SIGTERM arrived after the last optimizer step: the run had finished" "$dir/err"; then
      finished_clean=1 # the signal came after the ranks' last agreement
    else
      problems+=("exit 0 despite the fault")
    fi
  fi
  # (mpirun itself exits 137 when a rank died of SIGKILL: time tells a hang;
  # a run the fault missed may take as long as training takes.)
  [ "$finished_clean" = 0 ] && [ "$elapsed" -gt $(((timeout_s + 10) * 1000 + 5000)) ] &&
    problems+=("took ${elapsed} ms: hung")
  grep -q "Sanitizer" "$dir/err" && problems+=("a sanitizer report")
  if [ "$rc" != 0 ]; then
    case $fault in
      kill9) want="rank $victim .*(signal 9|Killed)|process rank $victim .*signal 9|rank [0-9]+: .*(did not complete|peer)" ;;
      stop) want="rank [0-9]+: .*did not complete within $timeout_s s" ;;
      term) want="rank $victim .*(signal 15|Terminated)|process rank $victim .*signal 15|rank [0-9]+: .*(did not complete|peer)" ;;
      badflag) want="rank $victim: dtrain train: invalid value '0' for --batch|^dtrain train: invalid value '0' for --batch" ;;
      drift) want="ranks were started with different settings: rank 0 has --lr" ;;
      data) want="ranks were started with different settings: rank 0 has data train" ;;
    esac
    # SIGTERM after the signal handlers are in: every rank stops after the
    # step, saves a checkpoint and the job exits 75 (train/train_checkpoint.h).
    if [ "$fault" = term ] && [ "$rc" = 75 ]; then
      grep -q "stopped by SIGTERM after optimizer step" "$dir/out" ||
        problems+=("exit 75 without the stop line")
    else
      grep -Eq -- "$want" "$dir/err" || problems+=("no message naming the rank and cause (/$want/)")
    fi
  fi
  sleep 0.5
  left=$(pgrep -f -- "--data-dir $dir( |/|$)" || true)
  if [ -n "$left" ]; then
    problems+=("processes left behind: $left")
    kill -9 $left 2>/dev/null
  fi
  what="trial $t: $np ranks, $fault on rank $victim at ${delay_ms} ms: exit $rc after ${elapsed} ms"
  [ "$finished_clean" = 1 ] && what+=" (finished before the fault)"
  if [ ${#problems[@]} -eq 0 ]; then
    echo "ok: $what"
  else
    failures=$((failures + 1))
    echo "FAIL: $what: ${problems[*]}"
    sed 's/^/  err: /' "$dir/err" | grep -v "^  err: *$" | head -20
  fi
done
echo "soak_test: $trials trials, $failures failed"
[ "$failures" = 0 ]
