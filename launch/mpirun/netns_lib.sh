# shellcheck shell=bash
# Network-namespace "nodes" on one machine, joined by a bridge: what
# netns-nodes.sh and tests/slurm/slurm_test.sh build. Needs root
# (CAP_NET_ADMIN). Source it, then
#   netns_bridge BRIDGE SUBNET        a bridge with SUBNET.254/24 on it, up
#   netns_node NS VETH BRIDGE ADDR    namespace NS whose eth0 (ADDR/24) is
#                                     the peer of VETH on the bridge; lo up
#   netns_remove BRIDGE [NS...]       kills what runs in the namespaces,
#                                     deletes them and the bridge (quietly)
# netns_bridge and netns_node return non-zero at the first step that fails;
# record NS for netns_remove before calling netns_node.

netns_bridge() {
  ip link add "$1" type bridge &&
    ip addr add "$2.254/24" dev "$1" &&
    ip link set "$1" up
}

netns_node() {
  local ns=$1 veth=$2 bridge=$3 addr=$4
  ip netns add "$ns" &&
    ip link add "$veth" type veth peer name eth0 netns "$ns" &&
    ip link set "$veth" master "$bridge" up &&
    ip -n "$ns" addr add "$addr/24" dev eth0 &&
    ip -n "$ns" link set eth0 up &&
    ip -n "$ns" link set lo up
}

netns_remove() {
  local bridge=$1 ns
  shift
  for ns in "$@"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  ip link del "$bridge" 2>/dev/null
  return 0
}
