#!/usr/bin/env bash
# A real Slurm cluster on this machine runs the launch/slurm/ batch scripts
# (see ../shared/recipes/slurm-and-mpi-local.md for the recipe):
#
#   one_node_srun       one node (this host), 2 tasks, one-node.sbatch
#   two_nodes_srun      two "nodes" made of network namespaces joined by a
#                       bridge, 2 tasks each, multi-node-srun.sbatch
#   two_nodes_mpirun    the same nodes, multi-node-mpirun.sbatch
#   preempt_requeue     preemptible.sbatch sent USR1: saves, requeues itself,
#                       resumes to the bits of an uninterrupted job
#
# Each job trains LeNet-5 for a few steps with DDP; the test checks the job's
# OUTPUT FILE (the header names the world size; the last line is
# test_accuracy=...), not only its state: a drained node can leave a job
# COMPLETED with no output at all. The cluster (slurmctld + slurmd, AuthType
# auth/none, no munge) lives in a scratch folder on non-default ports and is
# torn down on exit: jobs cancelled, daemons killed by their pid files,
# namespaces and links deleted.
#
# Where the machine cannot create network namespaces (no root, no
# CAP_NET_ADMIN, no `ip netns`), the two-node cases are reported as SKIPPED
# with the reason, in the JUnit XML that ./test.sh counts; without root the
# whole test is skipped the same way. Everything else that goes wrong fails.
set -uo pipefail

say() { echo "slurm_test: $*"; }

# ---- inputs -----------------------------------------------------------------
# shellcheck source=tests/check_lib.sh
. "$(dirname "$(readlink -f "$0")")/../check_lib.sh"
scripts=$(dirname "$(find_source launch/slurm/one-node.sbatch)") || exit 1
netns_lib=$(find_source launch/mpirun/netns_lib.sh) || exit 1
# shellcheck source=launch/mpirun/netns_lib.sh
. "$netns_lib"
data_dir=$(find_data_dir fashion-mnist) || exit 1

# ---- results as JUnit XML ---------------------------------------------------
cases=()   # "name|status|seconds|message", status pass, fail or skip
record() { cases+=("$1|$2|$3|$4"); say "$2: $1${4:+: $4}"; }
xml_escape() { sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g'; }
write_xml() {
  local n=${#cases[@]} f=0 s=0 c name status secs msg
  for c in "${cases[@]}"; do
    IFS='|' read -r name status secs msg <<<"$c"
    [ "$status" = fail ] && f=$((f + 1))
    [ "$status" = skip ] && s=$((s + 1))
  done
  [ -n "${XML_OUTPUT_FILE:-}" ] || return 0
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo '<testsuites>'
    echo "<testsuite name=\"slurm_test\" tests=\"$n\" failures=\"$f\" errors=\"0\" skipped=\"$s\">"
    for c in "${cases[@]}"; do
      IFS='|' read -r name status secs msg <<<"$c"
      msg=$(printf '%s' "$msg" | xml_escape)
      echo "  <testcase name=\"$name\" classname=\"slurm_test\" time=\"$secs\">"
      [ "$status" = fail ] && echo "    <failure message=\"$msg\"/>"
      [ "$status" = skip ] && echo "    <skipped message=\"$msg\"/>"
      echo "  </testcase>"
    done
    echo '</testsuite>'
    echo '</testsuites>'
  } >"$XML_OUTPUT_FILE"
}
finish() {
  write_xml
  local c failed=0
  for c in "${cases[@]}"; do
    case "$c" in *"|fail|"*) failed=1 ;; esac
  done
  exit "$failed"
}

if [ "$(id -u)" != 0 ]; then
  for c in one_node_srun preempt_requeue two_nodes_srun two_nodes_mpirun; do
    record "$c" skip 0 "needs root to run slurmctld/slurmd as SlurmUser=root"
  done
  finish
fi
for tool in slurmctld slurmd sbatch scontrol sinfo srun mpirun ip nsenter unshare; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    record setup fail 0 "$tool is missing: run tools/setup.sh (it installs Slurm and Open MPI)"
    finish
  fi
done

# ---- scratch folder, names, ports -------------------------------------------
# Short paths: slurmd puts unix sockets in its spool folder (108-byte limit).
dir=$(mktemp -d /tmp/dtslurm.XXXXXX)
tag=$(($$ % 10000))
host=$(hostname -s)
ctl_port=$((20000 + ($$ % 20000)))
d_port=$((ctl_port + 1))
subnet="10.$((200 + ($$ % 50))).$(($$ % 250))"
bridge="dtbr$tag"
namespaces=()
export SLURM_CONF="$dir/slurm.conf"
# Every test cluster numbers its jobs from 1, and Open MPI names its
# shared-memory segments and session folders after the job: two slurm_tests
# at once on one machine (parallel builds) mapped each other's segments and
# crashed in the vader transport. Give this cluster's jobs folders of their own.
mkdir -p "$dir/shm" "$dir/ompi"
export OMPI_MCA_btl_vader_backing_directory="$dir/shm" OMPI_MCA_orte_tmpdir_base="$dir/ompi"

teardown() {
  set +e
  if [ -f "$SLURM_CONF" ] && [ -f "$dir/slurmctld.pid" ]; then
    # shellcheck disable=SC2046  # one argument per job id
    scancel --quiet $(squeue -h -o %i 2>/dev/null) >/dev/null 2>&1
  fi
  for pidfile in "$dir"/slurmd.*.pid "$dir"/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
  done
  for _ in $(seq 50); do # up to 5 s for the daemons to exit
    alive=0
    for pidfile in "$dir"/slurmd.*.pid "$dir"/slurmctld.pid; do
      [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pidfile in "$dir"/slurmd.*.pid "$dir"/slurmctld.pid; do
    [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null
  done
  netns_remove "$bridge" "${namespaces[@]}"
  rm -rf "$dir"
}
trap teardown EXIT
trap 'exit 1' INT TERM

# ---- can this machine make network namespaces? ------------------------------
netns_reason=""
probe="dtprobe$tag"
if ! out=$(ip netns add "$probe" 2>&1); then
  netns_reason="cannot create network namespaces here (ip netns add: $out)"
else
  ip netns del "$probe"
  if ! out=$(netns_bridge "$bridge" "$subnet" 2>&1); then
    netns_reason="cannot create a bridge here (ip link add type bridge: $out)"
  fi
fi

make_nodes() { # two namespaces dtn1, dtn2 on the bridge; controller at .254
  for i in 1 2; do
    local ns="dtns$tag-$i"
    namespaces+=("$ns")
    netns_node "$ns" "dtv${tag}h$i" "$bridge" "$subnet.$i" || return 1
  done
}
if [ -z "$netns_reason" ] && ! make_nodes >"$dir/netns.log" 2>&1; then
  netns_reason="setting up the namespace nodes failed: $(tail -2 "$dir/netns.log" | tr '\n' ' ')"
fi
if [ -n "$netns_reason" ]; then
  say "SKIP (two-node cases): $netns_reason"
  ctl_addr=127.0.0.1
else
  ctl_addr="$subnet.254"
fi

# ---- the cluster ------------------------------------------------------------
mkdir -p "$dir/state" "$dir/spool" "$dir/tmp" "$dir/jobs"
cpus=$(nproc)
{
  cat <<CONF
ClusterName=dtraintest
SlurmctldHost=$host($ctl_addr)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
TmpFS=$dir/tmp/%n
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  if [ -z "$netns_reason" ]; then
    cat <<CONF
NodeName=dtn1 NodeAddr=$subnet.1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=dtn2 NodeAddr=$subnet.2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=ns Nodes=dtn1,dtn2 MaxTime=INFINITE State=UP
CONF
  fi
} >"$SLURM_CONF"
mkdir -p "$dir/tmp/$host" "$dir/spool/$host" "$dir/tmp/dtn1" "$dir/tmp/dtn2" \
  "$dir/spool/dtn1" "$dir/spool/dtn2"

cluster_fail() {
  local why=$1
  say "$why"
  for f in "$dir"/*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }
  done
  for c in one_node_srun preempt_requeue two_nodes_srun two_nodes_mpirun; do
    record "$c" fail 0 "$why"
  done
  finish
}

slurmctld >"$dir/slurmctld.out" 2>&1 || cluster_fail "slurmctld did not start"
slurmd -N "$host" >"$dir/slurmd.out" 2>&1 || cluster_fail "slurmd did not start"
if [ -z "$netns_reason" ]; then
  for i in 1 2; do
    nsenter --net="/run/netns/dtns$tag-$i" unshare --uts /bin/sh -c \
      "hostname dtn$i && exec slurmd -N dtn$i" >"$dir/slurmd-dtn$i.out" 2>&1 ||
      cluster_fail "slurmd for dtn$i did not start"
  done
fi

wait_idle() { # wait_idle NODE...: every node idle within 30 s
  local node state
  for _ in $(seq 300); do
    local all=1
    for node in "$@"; do
      state=$(sinfo -h -N -n "$node" -o %t 2>/dev/null | head -1)
      case "$state" in idle*) ;; *) all=0 ;; esac
    done
    [ "$all" = 1 ] && return 0
    sleep 0.1
  done
  sinfo -N -l
  return 1
}
wait_idle "$host" || cluster_fail "node $host did not become idle"
say "cluster up: slurmctld on $ctl_addr:$ctl_port, node $host idle"

# ---- jobs -------------------------------------------------------------------
# run_job CASE EXPECTED_WORLD SBATCH_ARGS... -- SCRIPT ARGS...: submits, waits
# (at most 150 s), checks the output file.
run_job() {
  local name=$1 world=$2
  shift 2
  local sbatch_args=()
  while [ "$1" != "--" ]; do sbatch_args+=("$1"); shift; done
  shift
  local start id state out
  start=$(date +%s)
  if ! id=$(cd "$dir/jobs" && sbatch --parsable "${sbatch_args[@]}" \
    --export="ALL,DTRAIN=$dtrain,DT_DATA_DIR=$data_dir" "$@" 2>"$dir/sbatch.err"); then
    record "$name" fail 0 "sbatch failed: $(cat "$dir/sbatch.err")"
    return
  fi
  id=${id%%;*}
  state=""
  for _ in $(seq 1500); do
    state=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case "$state" in
      PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.1 ;;
      *) break ;;
    esac
  done
  local secs=$(($(date +%s) - start))
  out="$dir/jobs/dtrain-$id.out"
  echo "--- job $id ($name): state $state after ${secs}s; $out:"
  [ -f "$out" ] && cat "$out"
  local last
  last=$(tail -1 "$out" 2>/dev/null)
  if [ "$state" != COMPLETED ]; then
    scancel "$id" 2>/dev/null
    record "$name" fail "$secs" "job $id ended in state '${state:-unknown}', not COMPLETED"
  elif [ ! -s "$out" ]; then
    record "$name" fail "$secs" "job $id COMPLETED but wrote no output file $out"
  elif ! grep -q "ddp world $world " "$out"; then
    record "$name" fail "$secs" "job $id output has no 'ddp world $world' header"
  elif ! [[ "$last" =~ ^test_accuracy=0\.[0-9]{4}$ ]]; then
    record "$name" fail "$secs" "job $id output does not end with test_accuracy=: '$last'"
  else
    record "$name" pass "$secs" ""
  fi
}

job_args=(train --model lenet --batch 32 --max-steps 100 --log-interval 50 --eval-batch 500)
run_job one_node_srun 2 -p local -- "$scripts/one-node.sbatch" "${job_args[@]}"

# ---- preemption: USR1, save, requeue, resume ---------------------------------
# preemptible.sbatch gets USR1 once its first checkpoint is complete: the
# ranks stop after their step and save, the script requeues the job, and the
# requeued run resumes (--resume auto) to the same final parameters, bit for
# bit, as the same training run uninterrupted (one-node.sbatch).
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
preempt_case() {
  local steps=600 start id ref state restarts out
  local args=(train --model mlp --batch 32 --max-steps $steps --log-interval 0 --save-every 100)
  start=$(date +%s)
  ref=$(cd "$dir/jobs" && sbatch --parsable -p local \
    --export="ALL,DTRAIN=$dtrain,DT_DATA_DIR=$data_dir" "$scripts/one-node.sbatch" \
    "${args[@]}" --run-dir "$dir/jobs/ref") || { record preempt_requeue fail 0 "sbatch failed"; return; }
  id=$(cd "$dir/jobs" && sbatch --parsable -p local \
    --export="ALL,DTRAIN=$dtrain,DT_DATA_DIR=$data_dir" "$scripts/preemptible.sbatch" \
    "${args[@]}") || { record preempt_requeue fail 0 "sbatch failed"; return; }
  ref=${ref%%;*} id=${id%%;*}
  local run="$dir/jobs/runs/slurm-$id" signalled=0
  for _ in $(seq 3000); do # at most 300 s
    state=$(job_state "$id")
    if [ "$signalled" = 0 ] && [ -f "$run/checkpoints/step_00000100/manifest.json" ]; then
      scancel --signal=USR1 "$id" && signalled=1
    fi
    # A requeued job may wait for its begin time: let it start, but not in
    # the second its old credential was revoked (slurmd compares whole
    # seconds and kills the new run: "Job credential revoked").
    if [ "$state" = PENDING ] && [ "$signalled" = 1 ]; then
      pending=$((${pending:-0} + 1))
      [ "$pending" = 25 ] && scontrol update JobId="$id" StartTime=now >/dev/null 2>&1
    fi
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    sleep 0.1
  done
  for _ in $(seq 1500); do
    case "$(job_state "$ref")" in PENDING | RUNNING | CONFIGURING | COMPLETING | "") sleep 0.1 ;; *) break ;; esac
  done
  restarts=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
  out="$dir/jobs/dtrain-$id.out"
  echo "--- job $id (preempt_requeue): state $state, restarts ${restarts:-?}; $out:"
  [ -f "$out" ] && cat "$out"
  local final="checkpoints/step_$(printf %08d $steps)" secs=$(($(date +%s) - start))
  if [ "$state" != COMPLETED ]; then
    scontrol show job "$id" 2>&1 | sed 's/^/  job: /'
    grep -h "JobId=$id\b\|job_id=$id\b\|JobID=$id\b" "$dir"/slurmctld.log "$dir"/slurmd.*.log 2>/dev/null |
      tail -20 | sed 's/^/  log: /'
    record preempt_requeue fail "$secs" "job $id ended in state '${state:-unknown}'"
  elif [ "$signalled" != 1 ]; then
    record preempt_requeue fail "$secs" "job $id finished before its first checkpoint was seen"
  elif ! grep -q "stopped by SIGUSR1 after optimizer step" "$out"; then
    record preempt_requeue fail "$secs" "job $id: no 'stopped by SIGUSR1' line after the signal"
  elif ! grep -q "requeueing" "$out" || [ "${restarts:-0}" -lt 1 ]; then
    record preempt_requeue fail "$secs" "job $id was not requeued (restarts ${restarts:-0})"
  elif ! grep -q "resumed from .*step_" "$out"; then
    record preempt_requeue fail "$secs" "job $id: the requeued run did not resume"
  elif ! cmp "$run/$final/model.safetensors" "$dir/jobs/ref/$final/model.safetensors" ||
    ! cmp "$run/$final/trainer_state.bin" "$dir/jobs/ref/$final/trainer_state.bin"; then
    record preempt_requeue fail "$secs" "the final parameters differ from the uninterrupted job $ref"
  else
    record preempt_requeue pass "$secs" ""
  fi
}
preempt_case

if [ -n "$netns_reason" ]; then
  record two_nodes_srun skip 0 "$netns_reason"
  record two_nodes_mpirun skip 0 "$netns_reason"
elif ! wait_idle dtn1 dtn2; then
  record two_nodes_srun fail 0 "namespace nodes dtn1/dtn2 did not become idle"
  record two_nodes_mpirun fail 0 "namespace nodes dtn1/dtn2 did not become idle"
  for f in "$dir"/slurmd.dtn*.log; do echo "--- $f"; tail -20 "$f"; done
else
  # Keep Open MPI on the bridge (each namespace also has lo).
  export OMPI_MCA_btl_tcp_if_include="$subnet.0/24" OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
  run_job two_nodes_srun 4 -p ns -N 2 --ntasks-per-node=2 -- \
    "$scripts/multi-node-srun.sbatch" "${job_args[@]}"
  run_job two_nodes_mpirun 4 -p ns -N 2 --ntasks-per-node=2 -- \
    "$scripts/multi-node-mpirun.sbatch" "${job_args[@]}"
fi
finish
