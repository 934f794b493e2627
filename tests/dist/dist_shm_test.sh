#!/usr/bin/env bash
# The shared-memory transport and MPI's under mpirun with 2, 3 and 4 ranks,
# then the 4-rank run again with DT_COMM_SHM=0 (the suite's own
# communicator on MPI's path; its tests still make one of each).
set -euo pipefail
here=$(dirname "$0")
for np in 2 3 4; do
  echo "=== dist_shm_test with $np ranks"
  timeout 240 "$here/mpirun_local.sh" "$np" "$here/dist_shm_test_bin"
done
echo "=== dist_shm_test with 2 ranks, DT_COMM_SHM=0"
DT_COMM_SHM=0 timeout 240 "$here/mpirun_local.sh" 2 "$here/dist_shm_test_bin"
