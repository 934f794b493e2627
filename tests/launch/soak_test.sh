#!/usr/bin/env bash
# Issue 9's soak: jobs of 2 and 3 ranks, each with one fault injected at a
# random moment (start-up included): kill -9, SIGSTOP or SIGTERM of a random
# rank, a bad flag or a drifted setting on one rank, or other data behind the
# same flags. Every job must end within --comm-timeout + 10 s, non-zero, with
# a message naming the rank and the cause, and leave no process behind.
# Issue 32's trials at the end of the job (below): SIGSTOP or SIGKILL of a
# rank as a run ends, named by its pid.
#   SOAK_TRIALS (default 8; the note quotes 20) and SOAK_SEED choose the runs;
#   SOAK_END_TRIALS (default 20) those at the end of the job (below);
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

# A trial's end: a sanitizer's report in LOG is a problem, and so is a
# process of the trial (its --data-dir DIR) still there (then killed).
after_trial() { # after_trial DIR LOG
  grep -q "Sanitizer" "$2" && problems+=("a sanitizer report")
  sleep 0.5
  local left
  left=$(pgrep -f -- "--data-dir $1( |/|$)" || true)
  if [ -n "$left" ]; then
    problems+=("processes left behind: $left")
    kill -9 $left 2>/dev/null
  fi
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
  # and its peers' exit, is seen by no rank (plain mpirun waits; the trials at
  # the end of the job below run under dtrain launch, which watches for it).
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
  after_trial "$dir" "$dir/err"
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

# ---- the end of the job (issue 32) ----
# `dtrain launch -n 2` of the cheapest run (MLP, 10 steps), rank 0 or 1
# stopped (SIGSTOP; one trial in four SIGKILL) 0-40 ms after rank 0 printed
# one of the run's last lines: the last step's progress line (the final
# evaluation comes next), the evaluation's line (the last checkpoint's),
# the checkpoint's (its agreement, the result) or the result (the end of
# the run, the barrier before MPI_Finalize, MPI_Finalize, the exit). Each
# job must end within --comm-timeout + 10 s of the signal, non-zero, with a
# message naming the rank that was signalled (its pid), and leave nothing
# behind. SOAK_END_TRIALS (default 20).
end_trials=${SOAK_END_TRIALS:-20}
end_timeout=3
triggers=("^epoch 1 step 10/10 " "^epoch 1 train_loss=" "checkpoint .* saved" "^test_accuracy=")
trigger_names=("the last step's line" "the evaluation's line" "the checkpoint's line" "the result line")
end_failures=0
for ((t = 1; t <= end_trials; t++)); do
  k=$((RANDOM % ${#triggers[@]}))
  sig=STOP
  ((RANDOM % 4 == 0)) && sig=KILL # (not in a subshell: SOAK_SEED must choose it)
  victim=$((RANDOM % 2))
  delay_ms=$((RANDOM % 41))
  dir="$tmp/end$t"
  mkdir -p "$dir"
  ln -sfn "$data_dir/fashion-mnist" "$dir/fashion-mnist"
  mkfifo "$dir/lines"
  timeout -k 5 $((end_timeout + 40)) "$dtrain" launch -n 2 --threads 1 -- train --model mlp \
    --max-steps 10 --log-interval 10 --comm-timeout "$end_timeout" --data-dir "$dir" \
    --run-dir "$dir/run" >"$dir/lines" 2>&1 &
  job=$!
  pid="" fired=0 signalled=0 start=0
  # Rank 0's lines as they come (the launcher's stdout and stderr): the
  # victim's pid is known before the trigger, which signals it at once.
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$dir/log"
    [ "$fired" = 1 ] && continue
    [ -n "$pid" ] || pid=$(rank_pid "$dir" "$victim")
    [[ $line =~ ${triggers[k]} ]] || continue
    fired=1
    sleep "$(awk -v ms="$delay_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
    # (a rank already exited, or a zombie, is not signalled)
    if [ -n "$pid" ] && [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ] &&
      kill -s "$sig" "$pid" 2>/dev/null; then
      signalled=1
    fi
    start=$(date +%s%N)
  done <"$dir/lines"
  wait "$job"
  rc=$?
  elapsed=$((($(date +%s%N) - ${start:-0}) / 1000000))
  problems=() want=""
  if [ "$fired" = 0 ]; then
    problems+=("${trigger_names[k]} never came")
  elif [ "$signalled" = 0 ] || { [ "$rc" = 0 ] && grep -q "^test_accuracy=" "$dir/log"; }; then
    # The rank had exited (or was exiting) before the signal: nothing to see.
    [ "$rc" = 0 ] || problems+=("exit $rc although the rank had exited before the signal")
  else
    [ "$rc" = 0 ] && problems+=("exit 0 despite the SIG$sig")
    [ "$rc" = 124 ] || [ "$rc" = 137 -a "$sig" = STOP ] && problems+=("hung (killed by timeout)")
    [ "$elapsed" -gt $(((end_timeout + 10) * 1000)) ] &&
      problems+=("took ${elapsed} ms after the signal, more than --comm-timeout + 10 s")
    if [ "$sig" = STOP ]; then
      want="rank $victim \\(pid $pid, stopped"
    else
      want="process rank $victim .*signal 9|rank $victim's process died|rank $victim \\(pid $pid, gone"
    fi
    grep -Eq -- "$want" "$dir/log" || problems+=("no message naming rank $victim (/$want/)")
  fi
  after_trial "$dir" "$dir/log"
  what="end trial $t: SIG$sig to rank $victim ${delay_ms} ms after ${trigger_names[k]}: exit $rc"
  [ "$signalled" = 1 ] && what+=" ${elapsed} ms after the signal" || what+=" (the rank had exited)"
  if [ ${#problems[@]} -eq 0 ]; then
    echo "ok: $what"
    [ "$signalled" = 1 ] && grep -Em1 -- "$want" "$dir/log" | cut -c1-400 | sed 's/^/  /'
  else
    end_failures=$((end_failures + 1))
    echo "FAIL: $what: ${problems[*]}"
    grep -v "^ *$" "$dir/log" | grep -v "^dtrain launch: mpirun" | tail -12 | sed 's/^/  log: /'
  fi
done
echo "soak_test: $trials trials, $failures failed; $end_trials end-of-job trials, $end_failures failed"
[ "$failures" = 0 ] && [ "$end_failures" = 0 ]
