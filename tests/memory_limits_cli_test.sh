#!/usr/bin/env bash
# Host memory limits through the binary (issue 32, defects 4 and 5):
#   - without DT_CPU_MEMORY_LIMIT the CPU allocator has a cap derived from
#     what the process may use, and doctor says where it came from;
#     DT_CPU_MEMORY_LIMIT=0 is refused;
#   - a runaway batch under an address-space limit (ulimit -v) fails with
#     the out-of-memory breakdown naming the default cap, at once;
#   - under ulimit -v values around what dtrain's libraries map, the binary
#     runs or exits with a clear error within seconds: OpenBLAS 0.3.21
#     retries a buffer mmap that fails for ever, so it used to spin before
#     main (--help) or at the first GEMM (bench with 2 threads).
# The limits are set with ulimit in a subshell that execs the binary under
# `timeout -s KILL`, so a spinning process is ended and reported (137).
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/check_lib.sh"

# under_limit KIB SECONDS ARGS...: dtrain ARGS under ulimit -v KIB, killed
# after SECONDS.
under_limit() {
  local kib=$1 seconds=$2
  shift 2
  (
    ulimit -v "$kib" || exit 99
    exec timeout -s KILL "$seconds" "$dtrain" "$@"
  ) >"$out" 2>"$err"
  rc=$?
}

# ---- the default cap, DT_CPU_MEMORY_LIMIT=0 ---------------------------------
env -u DT_CPU_MEMORY_LIMIT "$dtrain" doctor >"$out" 2>"$err"
expect_cap() { grep -Eq "$1" "$out" && ok "$2" || fail "$2: stdout does not match /$1/"; }
expect_cap "^  cpu memory cap [0-9.]+ [KMGT]iB \(default: [0-9.]+ [KMGT]iB of the [0-9.]+ [KMGT]iB (MemAvailable|the cgroup's memory limit)" \
  "doctor: the default cap and where it came from"
DT_CPU_MEMORY_LIMIT=2G "$dtrain" doctor >"$out" 2>"$err"
expect_cap "^  cpu memory cap 2\.00 GiB \(DT_CPU_MEMORY_LIMIT\)$" "doctor: a cap set by DT_CPU_MEMORY_LIMIT"

for zero in 0 0M; do
  DT_CPU_MEMORY_LIMIT=$zero run bench --steps 1 --warmup 0
  expect 1 err "^dtrain: error: environment variable DT_CPU_MEMORY_LIMIT: invalid value '$zero': expected a byte count of at least 1" \
    "DT_CPU_MEMORY_LIMIT=$zero is refused"
done
DT_CPU_MEMORY_LIMIT=0 run doctor
expect 1 out "^    PROBLEM: environment variable DT_CPU_MEMORY_LIMIT: invalid value '0'" \
  "doctor flags DT_CPU_MEMORY_LIMIT=0"

# ---- a runaway batch under ulimit -v ----------------------------------------
# dtrain's libraries and OpenBLAS's start-up buffers take about 1.2 GiB of
# address space; 1.5 GiB leaves a few hundred MiB and a default cap of about
# half of that. A batch of 40000 images needs more (its input is 125 MiB, each
# hidden activation 78 MiB), and the address space would still hold the
# first of them: without the cap the run went on until malloc failed.
under_limit 1600000 60 bench --model mlp --batch 40000 --steps 1 --warmup 0 --threads 1
expect 1 err "CPU out of memory: tried to allocate .* \(over the cap\); the CPU devices have .* allocated, cap .* \(default: .* the address-space limit \(RLIMIT_AS, ulimit -v\)" \
  "a runaway batch under ulimit -v: the out-of-memory breakdown names the default cap"
expect_not err "malloc failed" "the cap, not malloc, stops the runaway batch"

# ---- ulimit -v around what the libraries map: run, or a clear error ---------
# The error (before main) names the limit and the least that works; a
# limit below the libraries themselves is the dynamic loader's error.
clear_or_ran() { # clear_or_ran DESCRIPTION
  checks=$((checks + 1))
  if [ "$rc" = 0 ]; then
    echo "ok: $1 (ran)"
  elif [ "$rc" = 1 ] && grep -Eq "^dtrain: error: the address-space limit \(ulimit -v\) is .*raise the limit to at least .* \(ulimit -v [0-9]+\)" "$err"; then
    echo "ok: $1 (refused: $(grep -o 'raise the limit.*' "$err"))"
  elif [ "$rc" = 127 ] && grep -q "error while loading shared libraries" "$err"; then
    echo "ok: $1 (the dynamic loader's error)"
  else
    fail "$1: exit status $rc (137: killed after the time limit: it hung)"
  fi
}
for kib in 900000 1000000 1050000 1100000 1150000 1200000 1250000 1300000 1400000; do
  under_limit "$kib" 20 --help
  clear_or_ran "dtrain --help under ulimit -v $kib"
done
# Two threads need OpenBLAS buffers beyond its start-up pool: fewer threads
# (said on stderr) rather than a spin at the first GEMM.
for kib in 1300000 1450000 1600000; do
  under_limit "$kib" 60 bench --model mlp --steps 2 --warmup 0 --threads 2
  clear_or_ran "bench --threads 2 under ulimit -v $kib"
done

echo "$test_name: $checks checks, $failures failed"
[ "$failures" = 0 ]
