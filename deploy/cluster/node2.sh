# The trial cluster's second node, sourced by cluster.sh (ORCHARD_CLUSTER_NODES=2, the default).
#
# A node of its own on the same machine, as kind makes one but without a container engine:
# its containerd, kubelet, kube-proxy and kube-router run in
#   - a network namespace `orchard-n2`, joined to the host by a veth (10.250.0.1 on the host,
#     10.250.0.2 the node's InternalIP), with its own bridge and the pod CIDR the controller
#     manager gives it (routed by the host to the veth);
#   - a mount namespace where node 2's containerd root is mounted at the path node 1's has,
#     so the node helper's hostPath settings hold on both nodes as on real ones;
#   - a cgroup namespace rooted at /orchard-n2 in every hierarchy, with the cgroup file
#     systems mounted again inside it: its kubelet makes /kubepods there, as node 1's does
#     at the real root, and the helper finds a pod's cgroup at the same relative path.
# Pod traffic between the nodes keeps its source address (no masquerade for 10.244.0.0/16 to
# 10.244.0.0/16, on both sides), so NetworkPolicies see the real peer.
N2=orchard-n2
N2_VETH=orchk8s-n2
N2_HOST_IP=10.250.0.1
N2_IP=10.250.0.2
N2_POD_CIDR=10.244.1.0/24  # its Node is made with it (own_node in cluster.sh)
N2_NET=10.250.0.0/30
N2_BRIDGE=orchk8s1
N2_STATE="$STATE/n2"
N2_RUN="$RUN/n2"
N2_SOCK="$N2_RUN/containerd.sock"
N2_COMPONENTS=(n2-containerd n2-kubelet n2-kube-proxy n2-kube-router)
CLUSTER_NODES="${ORCHARD_CLUSTER_NODES:-2}"
NO_MASQ_MARK=0x4000/0x4000  # kube-proxy's "masquerade this" mark: those still are

n2_name() { echo "$(node_name)-n2"; }
n2_wanted() { [ "$CLUSTER_NODES" = 2 ]; }
n2_ns() { ip netns exec "$N2" "$@"; }  # network tools only (it remounts /sys for itself)

# The cgroup mount points of this machine (v1 hierarchies, or the v2 tree, or both).
cgroup_mounts() { awk '$9 ~ /^cgroup2?$/ {print $5}' /proc/self/mountinfo; }

n2_cgroups() {
  local m
  for m in $(cgroup_mounts); do
    mkdir -p "$m/$N2"
    if [ -f "$m/cpuset.cpus" ] && [ -f "$m/$N2/cpuset.cpus" ] && [ -z "$(cat "$m/$N2/cpuset.cpus")" ]; then
      cat "$m/cpuset.cpus" >"$m/$N2/cpuset.cpus"  # v1 cpuset: empty until given
      cat "$m/cpuset.mems" >"$m/$N2/cpuset.mems"
    fi
  done
}

# nat rule: pod to pod across the nodes keeps its source (the CNI bridge plugin masquerades
# all that leaves its node's subnet). In the host's netns and in node 2's (ARGS: a prefix).
no_masq_rule() {
  "$@" iptables -t nat -N ORCHARD-K8S-NAT 2>/dev/null || true
  "$@" iptables -t nat -C POSTROUTING -j ORCHARD-K8S-NAT 2>/dev/null ||
    "$@" iptables -t nat -I POSTROUTING 1 -j ORCHARD-K8S-NAT
  "$@" iptables -t nat -F ORCHARD-K8S-NAT
  "$@" iptables -t nat -A ORCHARD-K8S-NAT -s "$POD_CIDR" -d "$POD_CIDR" \
    -m mark ! --mark "$NO_MASQ_MARK" -j ACCEPT
}

n2_network() {
  [ -e "/run/netns/$N2" ] || ip netns add "$N2"
  if ! ip link show "$N2_VETH" >/dev/null 2>&1; then
    ip link add "$N2_VETH" type veth peer name "${N2_VETH}p"
    ip link set "${N2_VETH}p" netns "$N2"
    n2_ns ip link set "${N2_VETH}p" name eth0
  fi
  ip addr replace "$N2_HOST_IP/30" dev "$N2_VETH"
  ip link set "$N2_VETH" up
  n2_ns ip link set lo up
  n2_ns ip addr replace "$N2_IP/30" dev eth0
  n2_ns ip link set eth0 up
  n2_ns ip route replace default via "$N2_HOST_IP"
  n2_ns sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  no_masq_rule
  no_masq_rule n2_ns
  # The node's own traffic to the world (its pods' is masqueraded to N2_IP first).
  iptables -t nat -A ORCHARD-K8S-NAT -s "$N2_NET" ! -o "$N2_VETH" -j MASQUERADE
  iptables -A ORCHARD-K8S-FWD -i "$N2_VETH" -j ACCEPT
  iptables -A ORCHARD-K8S-FWD -o "$N2_VETH" -j ACCEPT
}

# The mount and cgroup namespaces, held by one process (n2-init) that every node-2
# component joins. Run inside them by `cluster.sh n2-init`.
n2_init_inside() {
  local line point opts
  while read -r line; do  # the cgroup file systems again, rooted at this namespace
    point="$(awk '{print $5}' <<<"$line")"
    umount -l "$point"  # (the kernel refuses a file system over itself)
    case "$(awk '{print $9}' <<<"$line")" in
    cgroup2) mount -t cgroup2 none "$point" ;;
    cgroup)
      opts="$(awk '{print $NF}' <<<"$line" | tr , '\n' | grep -vx 'rw\|ro' | paste -sd, -)"
      case "$opts" in name=*) opts="none,$opts" ;; esac
      mount -t cgroup -o "$opts" cgroup "$point" ;;
    esac
  done < <(awk '$9 ~ /^cgroup2?$/' /proc/self/mountinfo)
  mkdir -p "$N2_STATE/containerd-root" "$STATE/containerd/root"
  mount --bind "$N2_STATE/containerd-root" "$STATE/containerd/root"
  exec sleep infinity
}

n2_enter_cgroup() {  # this shell into node 2's cgroup, in every hierarchy (the host's view)
  local m
  for m in $(cgroup_mounts); do echo $$ >"$m/$N2/cgroup.procs"; done
}

n2_join_init() {  # `cluster.sh n2-join-init`: become n2-init (the cgroup namespace starts here)
  n2_enter_cgroup
  exec nsenter --net="/run/netns/$N2" -- unshare --mount --cgroup --propagation slave -- \
    bash "$HERE/cluster.sh" n2-init-inside
}

n2_join() {  # `cluster.sh n2-join PID CMD...`: CMD in node 2's cgroup and namespaces
  local init="$1"; shift
  n2_enter_cgroup
  exec nsenter -t "$init" --mount --cgroup --net -- "$@"
}

n2_start() {  # n2_start NAME CMD...: start a node-2 component (pid file, log) like `start`
  local name="$1" init; shift
  pid_of "$name" >/dev/null && return 0
  init="$(pid_of n2-init)" || die "node 2's namespaces are not up (cluster.sh up)"
  start "$name" bash "$HERE/cluster.sh" n2-join "$init" "$@"
}

n2_pki() {
  local ip="$1" node; node="$(n2_name)"
  cert kubelet-n2 "system:node:$node" system:nodes "DNS:$node,IP:$N2_IP"
  kubeconfig n2-kubelet kubelet-n2 "https://$ip:6443"
  kubeconfig n2-kube-proxy kube-proxy "https://$ip:6443"
  kubeconfig n2-kube-router kube-router "https://$ip:6443"
}

n2_configs() {
  mkdir -p "$N2_STATE/cni/net.d" "$N2_STATE/cni/ipam" "$N2_STATE/kubelet" "$N2_RUN"
  containerd_config "$N2_SOCK" "$N2_RUN/containerd" "$N2_STATE/cni/net.d" | put "$N2_STATE/containerd.toml"
  kubelet_config "$N2_IP" kubelet-n2 "$N2_SOCK" "$N2_STATE/pod-logs" | put "$N2_STATE/kubelet/config.yaml"
  kube_proxy_config "$(n2_name)" "$N2_IP" "$KCFG/n2-kube-proxy.kubeconfig" | put "$N2_STATE/kube-proxy.yaml"
}

n2_start_component() {
  local node; node="$(n2_name)"
  case "$1" in
  n2-containerd)
    n2_start n2-containerd "$CTRD_BIN/containerd" --config "$N2_STATE/containerd.toml"
    wait_for "node 2's containerd" 30 ctr -a "$N2_SOCK" version ;;
  n2-kubelet)
    own_node "$node" "$N2_POD_CIDR"
    n2_start n2-kubelet "$BIN/kubelet" --config "$N2_STATE/kubelet/config.yaml" \
      --kubeconfig "$KCFG/n2-kubelet.kubeconfig" --root-dir "$N2_STATE/kubelet/root" \
      --hostname-override "$node" --node-ip "$N2_IP" --v 1
    node_addressed "$node" ;;
  n2-kube-proxy)
    n2_start n2-kube-proxy "$BIN/kube-proxy" --config "$N2_STATE/kube-proxy.yaml" ;;
  n2-kube-router)
    # NODE_NAME: kube-router takes the machine's hostname (node 1's) before its override.
    n2_start n2-kube-router env NODE_NAME="$node" "$KR_BIN/kube-router" \
      --kubeconfig "$KCFG/n2-kube-router.kubeconfig" --hostname-override "$node" "${KR_FLAGS[@]}" ;;
  *) die "unknown component $1 (one of: ${COMPONENTS[*]} ${N2_COMPONENTS[*]})" ;;
  esac
}

# Its pod network once the controller manager has given the Node a pod CIDR.
n2_pod_network() {
  local node cidr i
  node="$(n2_name)"
  for ((i = 0; i < 240; i++)); do
    cidr="$(kctl get node "$node" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)"
    [ -n "$cidr" ] && break
    sleep 0.25
  done
  [ -n "$cidr" ] || die "node $node got no pod CIDR in 60 s (logs: $LOGS)"
  [ "$cidr" != "$NODE_POD_CIDR" ] || die "node $node was given node 1's pod CIDR $cidr"
  cni_config "$N2_BRIDGE" "$cidr" "$N2_STATE/cni/ipam" | put "$N2_STATE/cni/net.d/10-orchard.conflist"
  ip route replace "$cidr" via "$N2_IP" dev "$N2_VETH"
}

n2_up() {
  local ip="$1" node c
  node="$(n2_name)"
  n2_network
  n2_cgroups
  n2_pki "$ip"
  n2_configs
  if ! pid_of n2-init >/dev/null; then
    start n2-init bash "$HERE/cluster.sh" n2-join-init
    wait_for "node 2's namespaces" 30 grep -q " $STATE/containerd/root " "/proc/$(cat "$RUN/n2-init.pid")/mountinfo"
  fi
  for c in "${N2_COMPONENTS[@]}"; do
    n2_start_component "$c"
    if [ "$c" = n2-containerd ]; then import_images "$N2_SOCK" "$N2_STATE/images" "${BASE_IMAGES[@]}"; fi
    if [ "$c" = n2-kubelet ]; then n2_pod_network; fi
  done
  wait_for "node $node" 120 kctl wait --for=condition=Ready "node/$node" --timeout=2s
  log "up: node $node ($N2_IP)"
}

# Every process of node 2 (its components, shims and containers): those in its mount
# namespace.
n2_pids() {
  local init ns p
  init="$(cat "$RUN/n2-init.pid" 2>/dev/null)" || return 0
  ns="$(readlink "/proc/$init/ns/mnt" 2>/dev/null)" || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
  done
  return 0
}

n2_down() {
  local p m
  stop_pid n2-kubelet
  if pid_of n2-containerd >/dev/null; then kill_tasks "$N2_SOCK"; fi
  for p in n2-kube-router n2-kube-proxy n2-containerd; do stop_pid "$p"; done
  for p in $(n2_pids); do kill -9 "$p" 2>/dev/null || true; done
  stop_pid n2-init
  [ -e "/run/netns/$N2" ] && ip netns delete "$N2"
  for m in $(cgroup_mounts); do
    [ -d "$m/$N2" ] && find "$m/$N2" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  return 0
}
