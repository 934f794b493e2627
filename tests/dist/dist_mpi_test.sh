#!/usr/bin/env bash
# Runs the multi-rank suite under mpirun with 2 and 3 ranks.
set -euo pipefail
here=$(dirname "$0")
for np in 2 3; do
  echo "=== dist_mpi_test with $np ranks"
  timeout 240 "$here/mpirun_local.sh" "$np" "$here/dist_mpi_test_bin"
done
