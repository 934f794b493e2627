#!/usr/bin/env bash
# Two (or more) "nodes" on one machine for trying multi-node runs: one network
# namespace per node, joined by a bridge, each with its own host name, with
# mpirun starting its daemons in them through a tiny rsh agent (no sshd).
# Optionally throttles the links to imitate a slower network: --netem (tc
# netem: delay and rate; needs a kernel with CONFIG_NET_SCH_NETEM) or --rate
# (tc tbf: bandwidth only, for kernels without netem). Needs root
# (CAP_NET_ADMIN). Everything it creates is removed on exit.
#
#   launch/mpirun/netns-nodes.sh [--nodes N] [--ranks-per-node R]
#       [--netem "delay 1ms rate 1gbit" | --rate 1gbit] -- <dtrain binary> bench ...
#
# runs
#   mpirun -np N*R --hostfile <nodes> --map-by slot --bind-to none
#          --mca plm_rsh_agent <agent> --mca btl tcp,self
#          --mca btl_tcp_if_include <subnet> --mca oob_tcp_if_include <subnet>
#          -x OMP_NUM_THREADS -x DT_NUM_THREADS -x DT_DATA_DIR <command>
# with DT_NUM_THREADS / OMP_NUM_THREADS taken from the environment (default 1).
set -euo pipefail

nodes=2
per_node=1
netem=""
rate=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --ranks-per-node) per_node=$2; shift 2 ;;
    --netem) netem=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "netns-nodes: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ "$#" -gt 0 ] || { echo "netns-nodes: give the command after --" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "netns-nodes: needs root (network namespaces)" >&2; exit 1; }

# shellcheck source=launch/mpirun/netns_lib.sh
. "$(dirname "$(readlink -f "$0")")/netns_lib.sh"

tag=$(($$ % 10000))
subnet="10.$((150 + ($$ % 50))).$(($$ % 250))"
bridge="dtbr$tag"
dir=$(mktemp -d /tmp/dtnetns.XXXXXX)
created=()
cleanup() {
  set +e
  netns_remove "$bridge" "${created[@]}"
  rm -rf "$dir"
}
trap cleanup EXIT

netns_bridge "$bridge" "$subnet"
: >"$dir/hosts"
for i in $(seq "$nodes"); do
  ns="dtnode$tag-$i"
  veth="dtv${tag}n$i"
  created+=("$ns")
  netns_node "$ns" "$veth" "$bridge" "$subnet.$i"
  # Both directions: the host end shapes traffic into the node, eth0 out of it.
  if [ -n "$netem" ]; then
    # shellcheck disable=SC2086  # netem is a list of tc words
    tc qdisc add dev "$veth" root netem $netem || {
      echo "netns-nodes: tc netem failed: this kernel may lack sch_netem" \
        "(CONFIG_NET_SCH_NETEM); --rate RATE shapes bandwidth with tbf instead" >&2
      exit 1
    }
    # shellcheck disable=SC2086
    tc -n "$ns" qdisc add dev eth0 root netem $netem
  elif [ -n "$rate" ]; then
    tc qdisc add dev "$veth" root tbf rate "$rate" burst 256kb latency 100ms
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
  fi
  echo "$subnet.$i slots=$per_node" >>"$dir/hosts"
done

# mpirun calls `<agent> [options] <host> <command...>` to start its daemon
# on <host>: enter that node's namespace, with its own host name.
cat >"$dir/agent" <<AGENT
#!/bin/sh
while [ "\$#" -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
i=\${host##*.}
exec nsenter --net=/run/netns/dtnode$tag-\$i unshare --uts /bin/sh -c "hostname node\$i; exec \$*"
AGENT
chmod +x "$dir/agent"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${DT_NUM_THREADS:-1}}
export DT_NUM_THREADS=${DT_NUM_THREADS:-$OMP_NUM_THREADS}
args=(-np $((nodes * per_node)) --hostfile "$dir/hosts" --map-by slot --bind-to none
  --mca plm_rsh_agent "$dir/agent" --mca btl tcp,self
  --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24"
  -x OMP_NUM_THREADS -x DT_NUM_THREADS)
[ -z "${DT_DATA_DIR:-}" ] || args+=(-x DT_DATA_DIR)
[ "$(id -u)" != 0 ] || args+=(--allow-run-as-root)
echo "netns-nodes: $nodes nodes on $subnet.0/24${netem:+, netem '$netem'}${rate:+, tbf rate $rate}: mpirun ${args[*]} $*" >&2
mpirun "${args[@]}" "$@"
