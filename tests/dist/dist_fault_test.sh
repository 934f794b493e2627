#!/usr/bin/env bash
# Failure handling across processes: nobody hangs.
#  1. A rank that stops calling collectives: the others' watchdog (3 s)
#     prints which collective is stuck and the rank that did not arrive
#     (its pid, state and last completed collective), and aborts the job.
#  1b. A rank stopped (SIGSTOP) after the last collective: the others, at
#     the barrier before MPI_Finalize, name the step and the stopped rank and
#     end the job (exit 70).
#  1c. A rank stopped as it enters MPI_Finalize (past that barrier): the
#     others, whose MPI_Finalize waits for it, name the step and the rank and
#     end the job (exit 70) instead of waiting for ever.
#  2. A rank killed with SIGKILL: mpirun ends the job (the watchdog is set
#     to 120 s so that it is mpirun, not the watchdog, that ends it).
#  3. A rank killed in the middle of a large all-reduce on the shared-memory
#     transport, under mpirun --enable-recovery (which does not end the
#     others): they fail it naming the dead rank within a second or two of
#     a 20 s deadline, and (the communicator's abort_on_timeout being on)
#     the first to see it ends the job with exit 69, which `dtrain launch
#     --max-restarts` restarts on. The same with the all-reduce in place
#     over a shared buffer (DDP's gradients). No job leaves a segment of
#     ours in /dev/shm.
set -uo pipefail
here=$(dirname "$0")
tool="$here/dist_fault_tool"
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# job DESCRIPTION NP ARGS...: the tool on NP ranks under a 60 s deadline,
# output in $log; sets rc and elapsed.
job() {
  local what=$1 start
  shift
  start=$(date +%s)
  timeout 60 "$here/mpirun_local.sh" "$@" >"$log" 2>&1
  rc=$?
  elapsed=$(($(date +%s) - start))
  echo "--- $what: exit $rc after ${elapsed}s"
  cat "$log"
}
check() { # check PROBLEM COMMAND...: the test fails, naming PROBLEM, unless COMMAND succeeds
  "${@:2}" || { echo "FAIL: $1"; status=1; }
}
lacks() { ! grep -q -- "$1" "$log"; }

job "stuck rank" 3 "$tool" stuck 3
check "the job should have been aborted by the watchdog with exit 70 (got $rc; 124 = hung)" \
  [ "$rc" -eq 70 ]
check "no watchdog message naming the rank that did not arrive" grep -Eq "dtrain: rank [01]: collective #2 \(allreduce, 4096 bytes, peers ranks 0-2\) did not complete within 3 s: rank 2 \(pid [0-9]+, running, its last completed collective #1\) did not arrive; aborting the job" "$log"
check "took ${elapsed}s, expected about 3s" [ "$elapsed" -le 30 ]

job "rank late for the communicator" 2 "$tool" late 3
check "the job should have been ended by the start-up deadline with exit 70 (got $rc; 124 = hung)" \
  [ "$rc" -eq 70 ]
check "no message naming the step rank 0 waited for" grep -Eq "dtrain: error: rank 0: creating the mpi communicator \(MPI_Comm_dup, every rank\) did not complete within 3 s" "$log"
check "took ${elapsed}s, expected about 3s" [ "$elapsed" -le 30 ]

job "rank stopped after the last collective" 2 "$tool" stop-at-end 3
check "the job should have been ended by the end-of-job deadline with exit 70 (got $rc; 124 = hung)" \
  [ "$rc" -eq 70 ]
check "no message naming the step rank 0 waited for and the stopped rank" grep -Eq "dtrain: error: rank 0: the end of the job \(a barrier of every rank before MPI_Finalize\) did not complete within 3 s: rank 1 \(pid [0-9]+, stopped, .*\) did not arrive" "$log"
check "took ${elapsed}s, expected about 3s" [ "$elapsed" -le 30 ]

job "rank stopped entering MPI_Finalize" 2 "$tool" stop-in-finalize 3
check "the job should have been ended by MPI_Finalize's deadline with exit 70 (got $rc; 124 = hung)" \
  [ "$rc" -eq 70 ]
check "no message naming MPI_Finalize and the stopped rank" grep -Eq "dtrain: error: rank 0: the end of the job \(MPI_Finalize, every rank\) did not complete within 3 s: every rank on this host arrived, but rank 1 \(pid [0-9]+, stopped, last in the end of the job \(MPI_Finalize\), .*\) cannot finish it" "$log"
check "took ${elapsed}s, expected about 3s" [ "$elapsed" -le 30 ]

job "killed rank" 3 "$tool" kill
check "the job should have ended with an error (exit $rc; 124 = hung)" \
  [ "$rc" -ne 0 -a "$rc" -ne 124 ]
check "a rank finished without noticing the dead peer" lacks "finished without noticing"
check "took ${elapsed}s to end the job" [ "$elapsed" -le 30 ]
ours() { ls /dev/shm 2>/dev/null | grep -E "^dtrain-$(id -u)-" | sort; }
before=$(ours)
for mode in die die-shared; do
  MPIRUN_LOCAL_ARGS=--enable-recovery job "rank dead mid-collective ($mode)" 3 "$tool" "$mode" 20
  # Both survivors see it; the first one's abort may end the other before it prints.
  check "$mode: no surviving rank named the dead rank" grep -Eq "rank [01]: (allreduce failed after [0-9.]+ s of a 20 s deadline: |collective #2 \\(allreduce.* failed: ).*rank 2's process died" "$log"
  check "$mode: a rank finished without noticing the dead peer" lacks "finished without noticing"
  check "$mode: took ${elapsed}s, expected well under the 20 s deadline" [ "$elapsed" -le 15 ]
done
after=$(ours)
check "segments left in /dev/shm: $(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')" \
  [ "$before" = "$after" ]
[ "$status" -eq 0 ] && echo "PASS"
exit "$status"
