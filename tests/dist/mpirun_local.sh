#!/usr/bin/env bash
# mpirun for tests on one machine: root needs --allow-run-as-root, more ranks
# than cores need --oversubscribe; one BLAS/OpenMP thread per rank.
#   mpirun_local.sh NP PROGRAM [ARGS...]
# MPIRUN_LOCAL_ARGS: more mpirun options (split at spaces).
set -euo pipefail
np=$1
shift
# Bazel's per-test files must not be shared by several ranks.
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE TEST_SHARD_STATUS_FILE GTEST_OUTPUT
args=(--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x DT_NUM_THREADS=1)
if [ "$(id -u)" = 0 ]; then
  args+=(--allow-run-as-root)
fi
# shellcheck disable=SC2206
args+=(${MPIRUN_LOCAL_ARGS:-})
exec mpirun "${args[@]}" -np "$np" "$@"
