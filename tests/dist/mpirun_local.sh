#!/usr/bin/env bash
# mpirun for tests on one machine: root needs --allow-run-as-root, more ranks
# than cores need --oversubscribe; one BLAS/OpenMP thread per rank.
#   mpirun_local.sh NP PROGRAM [ARGS...]
set -euo pipefail
np=$1
shift
args=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x DT_NUM_THREADS=1)
if [ "$(id -u)" = 0 ]; then
  args+=(--allow-run-as-root)
fi
exec mpirun "${args[@]}" -np "$np" "$@"
