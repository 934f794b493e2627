#!/usr/bin/env bash
# Host-staged device tensors under mpirun with 2 ranks (stand-in device).
set -euo pipefail
here=$(dirname "$0")
echo "=== dist_staged_test with 2 ranks"
timeout 240 "$here/mpirun_local.sh" 2 "$here/dist_staged_test_bin"
