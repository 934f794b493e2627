#!/usr/bin/env bash
# Failure handling across processes: nobody hangs.
#  1. A rank that stops calling collectives: the others' watchdog (3 s)
#     prints which collective is stuck and aborts the job.
#  2. A rank killed with SIGKILL: mpirun ends the job (the watchdog is set
#     to 120 s so that it is mpirun, not the watchdog, that ends it).
set -uo pipefail
here=$(dirname "$0")
tool="$here/dist_fault_tool"
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

start=$(date +%s)
timeout 60 "$here/mpirun_local.sh" 3 "$tool" stuck 3 >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
echo "--- stuck rank: exit $rc after ${elapsed}s"
cat "$log"
if [ "$rc" -ne 70 ]; then
  echo "FAIL: the job should have been aborted by the watchdog with exit 70 (got $rc; 124 = hung)"
  status=1
fi
if ! grep -Eq "dtrain: rank [01]: collective #2 \(allreduce, 4096 bytes, peers ranks 0-2\) did not complete within 3 s; aborting the job" "$log"; then
  echo "FAIL: no watchdog message"
  status=1
fi
if [ "$elapsed" -gt 30 ]; then
  echo "FAIL: took ${elapsed}s, expected about 3s"
  status=1
fi

start=$(date +%s)
timeout 60 "$here/mpirun_local.sh" 2 "$tool" late 3 >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
echo "--- rank late for the communicator: exit $rc after ${elapsed}s"
cat "$log"
if [ "$rc" -ne 70 ]; then
  echo "FAIL: the job should have been ended by the start-up deadline with exit 70 (got $rc; 124 = hung)"
  status=1
fi
if ! grep -Eq "dtrain: error: rank 0: creating the mpi communicator \(MPI_Comm_dup, every rank\) did not complete within 3 s" "$log"; then
  echo "FAIL: no message naming the step rank 0 waited for"
  status=1
fi
if [ "$elapsed" -gt 30 ]; then
  echo "FAIL: took ${elapsed}s, expected about 3s"
  status=1
fi

start=$(date +%s)
timeout 60 "$here/mpirun_local.sh" 3 "$tool" kill >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
echo "--- killed rank: exit $rc after ${elapsed}s"
cat "$log"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  echo "FAIL: the job should have ended with an error (exit $rc; 124 = hung)"
  status=1
fi
if grep -q "finished without noticing" "$log"; then
  echo "FAIL: a rank finished without noticing the dead peer"
  status=1
fi
if [ "$elapsed" -gt 30 ]; then
  echo "FAIL: took ${elapsed}s to end the job"
  status=1
fi
[ "$status" -eq 0 ] && echo "PASS"
exit "$status"
