#!/usr/bin/env bash
# Lint-level checks of launch/slurm/*.sbatch that need no cluster (the real
# cluster runs the CPU scripts in slurm_test.sh; the GPU scripts need GPU
# nodes):
#   - every script parses (bash -n; shellcheck too where it is installed),
#     has `set -eo pipefail` and writes dtrain-%j.out;
#   - the GPU scripts request GPUs with --gpus-per-node, as many tasks per
#     node as GPUs and --cpus-per-task;
#   - a dry run of each GPU script, with srun replaced by a stub and a
#     faked job environment: the srun line it runs (--mpi=pmix, the CPUs per
#     task, the dtrain command with --device cuda added unless a device is
#     named), which the stub hands to `dtrain launch --dry-run` to check that
#     the command is one dtrain can run on several ranks.
set -uo pipefail

# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
scripts=$(dirname "$(find_source launch/slurm/one-node.sbatch)") || exit 1

check() { # check DESCRIPTION COMMAND...
  local what=$1
  shift
  checks=$((checks + 1))
  if "$@"; then
    echo "ok: $what"
  else
    failures=$((failures + 1))
    echo "FAIL: $what"
  fi
}
sbatch_value() { # sbatch_value SCRIPT OPTION: the value of "#SBATCH --OPTION=V"
  sed -n "s/^#SBATCH --$2=\\(.*\\)$/\\1/p" "$1" | head -1
}

for s in "$scripts"/*.sbatch; do
  name=$(basename "$s")
  check "$name parses" bash -n "$s"
  if command -v shellcheck >/dev/null 2>&1; then
    check "$name passes shellcheck" shellcheck "$s"
  fi
  check "$name has set -eo pipefail" grep -q '^set -eo pipefail$' "$s"
  check "$name writes dtrain-%j.out" grep -q '^#SBATCH --output=dtrain-%j.out$' "$s"
done

# A stub srun: records its arguments, then asks dtrain launch for the
# mpirun line of the same ranks (a dry run).
stub="$tmp/bin"
mkdir -p "$stub"
cat >"$stub/srun" <<'STUB'
#!/usr/bin/env bash
printf '%s\n' "$*" >"$SRUN_LOG"
while [ "$#" -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exe=$1
shift
exec "$exe" launch -n "$SLURM_NTASKS" --dry-run -- "$@"
STUB
chmod +x "$stub/srun"

# dry_run SCRIPT GPUS TASKS_PER_NODE NODES ARGS...: runs the script as a job would.
dry_run() {
  local script=$1 gpus=$2 per_node=$3 nodes=$4
  shift 4
  (cd "$tmp" && env PATH="$stub:$PATH" SRUN_LOG="$tmp/srun.log" DTRAIN="$dtrain" \
    SLURM_SUBMIT_DIR="$tmp" SLURM_JOB_ID=4242 SLURM_JOB_NODELIST="gpunode[1-$nodes]" \
    SLURM_JOB_NUM_NODES="$nodes" SLURM_NTASKS=$((per_node * nodes)) \
    SLURM_NTASKS_PER_NODE="$per_node" SLURM_GPUS_ON_NODE="$gpus" SLURM_CPUS_PER_TASK=6 \
    bash "$script" "$@" >"$tmp/job.out" 2>"$tmp/job.err")
}
matches() { grep -Eq -- "$2" "$1"; }

for name in gpu-one-node.sbatch gpu-multi-node.sbatch; do
  s="$scripts/$name"
  gpus=$(sbatch_value "$s" gpus-per-node)
  tasks=$(sbatch_value "$s" ntasks-per-node)
  check "$name requests GPUs (--gpus-per-node=$gpus)" test -n "$gpus"
  check "$name: --ntasks-per-node ($tasks) = --gpus-per-node ($gpus)" test "$tasks" = "$gpus"
  check "$name sets --cpus-per-task" test -n "$(sbatch_value "$s" cpus-per-task)"
  nodes=$(sbatch_value "$s" nodes)

  dry_run "$s" "$gpus" "$tasks" "$nodes"
  rc=$?
  check "$name: the default job runs (exit $rc)" test "$rc" = 0
  check "$name: srun --mpi=pmix with the CPUs per task and --device cuda added" \
    matches "$tmp/srun.log" "^--mpi=pmix --cpus-per-task=6 $dtrain train .*--device cuda$"
  check "$name: dtrain launch accepts the ranks' command" \
    matches "$tmp/job.err" "^dtrain launch: mpirun -np $((tasks * nodes)) .* train .*--device cuda$"
  check "$name: the job's first line names the job and its GPUs" \
    matches "$tmp/job.out" "^dtrain job 4242: $((tasks * nodes)) tasks .*$gpus GPUs"

  dry_run "$s" "$gpus" "$tasks" "$nodes" bench --model mlp --device cuda:0
  check "$name: arguments replace the default job, a named device is kept" \
    matches "$tmp/srun.log" "$dtrain bench --model mlp --device cuda:0$"

  SRUN_ARGS="--gpu-bind=single:1" dry_run "$s" "$gpus" "$tasks" "$nodes"
  check "$name: SRUN_ARGS reach srun" matches "$tmp/srun.log" "--gpu-bind=single:1 $dtrain train"

  dry_run "$s" 1 "$tasks" "$nodes"
  check "$name: more tasks than GPUs is pointed out" \
    matches "$tmp/job.err" "note: $tasks tasks but 1 GPUs"
done

echo "slurm_scripts_test: $checks checks, $failures failed"
[ "$failures" = 0 ]
