#!/usr/bin/env bash
# A real two-node Kubernetes cluster built from source, for trials and `make test-k8s`.
#
#   cluster.sh build            build etcd, the Kubernetes components, kube-router and containerd
#                               once per version (cached outside the repository)
#   cluster.sh up               build if needed, then start the cluster (idempotent); prints
#                               the kubeconfig path on its last line
#   cluster.sh down             stop it and remove every process, mount, veth, iptables chain,
#                               ipset, cgroup and state folder it made
#   cluster.sh status           what runs
#   cluster.sh load IMAGE...    copy images from the local Docker engine into the cluster
#   cluster.sh restart NAME     kill -9 one component (apiserver, etcd, kubelet, n2-kubelet,
#                               ...) and start it again (for fault tests)
#   cluster.sh stop NAME        stop one component and leave it stopped (the lost-node drill
#                               stops the kubelet); `cluster.sh start NAME` starts it again
#   cluster.sh kubeconfig       print the admin kubeconfig path
#   cluster.sh bin              print the folder of the built binaries (kubectl, ...)
#
# Node 1 is this machine: etcd, kube-apiserver (TLS, RBAC, NodeRestriction, Pod Security
# admission), kube-controller-manager, kube-scheduler, a kubelet on its own containerd (runc,
# the CNI bridge plugin), kube-proxy (iptables) and kube-router as the NetworkPolicy firewall.
# Node 2 (node2.sh; ORCHARD_CLUSTER_NODES=1 leaves it out) is its own containerd, kubelet,
# kube-proxy and kube-router in network, mount and cgroup namespaces of their own.
# Add-ons, as a distribution ships them: rancher's local-path-provisioner (the default
# StorageClass `local-path`: a folder on the node per PersistentVolumeClaim), and containerd
# set to pull the in-cluster registry's name over plain HTTP (Orchard's snapshots).
# Needs root, cgroup v1 or v2, and Debian's runc, containernetworking-plugins,
# iptables, ipset, conntrack, openssl and busybox-static (`cluster.sh up` installs what is
# missing).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

K8S_VERSION=1.34.4
KUBE_ROUTER_VERSION=2.1.0
# containerd 2.1+ mounts image volumes (`volumes[].image`), which deliver Orchard's agent to
# each pod read-only from one shared copy; Debian's 1.6 cannot, so it is built too.
CONTAINERD_VERSION=2.2.9
LOCAL_PATH_VERSION=0.0.30
CACHE="${ORCHARD_CLUSTER_CACHE:-/var/cache/orchard/cluster}"
STATE="${ORCHARD_CLUSTER_STATE:-/var/lib/orchard-cluster}"
RUN=/run/orchard-cluster
POD_CIDR=10.244.0.0/16
NODE_POD_CIDR=10.244.0.0/24
SVC_CIDR=10.96.0.0/16
API_SVC_IP=10.96.0.1
BRIDGE=orchk8s0
PAUSE_IMAGE=orchard.local/pause:1
PROVISIONER_IMAGE=orchard.local/local-path-provisioner:v$LOCAL_PATH_VERSION
HELPER_IMAGE=orchard.local/busybox:1
BASE_IMAGES=("$PAUSE_IMAGE" "$PROVISIONER_IMAGE" "$HELPER_IMAGE")  # what every node is given
# Orchard's in-cluster registry (deploy/kubernetes/base/registry.yaml): image names say
# REGISTRY_NAME, which no resolver knows; containerd maps it to the registry Service's
# ClusterIP (fixed by overlays/local, in the Service range's static band), reached from the
# node through kube-proxy, over plain HTTP.
REGISTRY_NAME=orchard-registry.orchard-system.svc:5000
REGISTRY_IP=10.96.0.50
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy kube-router)
# kube-router as the NetworkPolicy firewall only, on every node (no routing, no proxy).
KR_FLAGS=(--run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false
  --metrics-port 0 --health-port 20244 --v 1)

# shellcheck source=node2.sh
source "$HERE/node2.sh"

build_key() { cat "$HERE/build/go.mod" "$HERE/build/go.sum" "$HERE/build/pause/main.go" | sha256sum | cut -c1-12; }
BIN="$CACHE/k8s-v$K8S_VERSION-$(build_key)"
KR_BIN="$CACHE/kube-router-v$KUBE_ROUTER_VERSION"
LP_BIN="$CACHE/local-path-provisioner-v$LOCAL_PATH_VERSION"
CTRD_BIN="$CACHE/containerd-v$CONTAINERD_VERSION"
# Every containerd, shim and ctr this script starts is the built one (the shim is found on
# PATH); runc is Debian's.
export PATH="$CTRD_BIN:$PATH"
PKI="$STATE/pki"
KCFG="$STATE/kubeconfig"
LOGS="$STATE/logs"
CTR_SOCK="$RUN/containerd.sock"

log() { echo "cluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

node_name() { hostname | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9.\n-' '-'; }
node_ip() {
  local dev
  dev="$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") print $(i + 1); exit}')"
  [ -n "$dev" ] || die "no default route: cannot choose the node address"
  ip -4 -o addr show dev "$dev" | awk '{split($4, a, "/"); print a[1]; exit}'
}

# --- build ---------------------------------------------------------------------------------
build_kubernetes() {
  log "building Kubernetes v$K8S_VERSION and etcd from the Go module proxy into $BIN (once; ~7-10 min on 2 cores)"
  local tmp="$BIN.tmp" ld v="k8s.io/component-base/version"
  rm -rf "$tmp" && mkdir -p "$tmp"
  ld="-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
  ld+=" -X $v.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=v$K8S_VERSION"
  (
    cd "$HERE/build"
    export CGO_ENABLED=0 GOFLAGS=-trimpath
    go build -ldflags "$ld" -o "$tmp/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl
    go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
    go build -ldflags "-s -w" -o "$tmp/pause" ./pause
  )
  rm -rf "$BIN" && mv "$tmp" "$BIN"
}

build_kube_router() {
  log "building kube-router v$KUBE_ROUTER_VERSION into $KR_BIN (once)"
  rm -rf "$KR_BIN.tmp" && mkdir -p "$KR_BIN.tmp"
  (cd /tmp && GOBIN="$KR_BIN.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v$KUBE_ROUTER_VERSION")
  rm -rf "$KR_BIN" && mv "$KR_BIN.tmp" "$KR_BIN"
}

build_local_path() {
  log "building local-path-provisioner v$LOCAL_PATH_VERSION into $LP_BIN (once)"
  rm -rf "$LP_BIN.tmp" && mkdir -p "$LP_BIN.tmp"
  (cd /tmp && GOBIN="$LP_BIN.tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/rancher/local-path-provisioner@v$LOCAL_PATH_VERSION")
  rm -rf "$LP_BIN" && mv "$LP_BIN.tmp" "$LP_BIN"
}

build_containerd() {
  log "building containerd v$CONTAINERD_VERSION into $CTRD_BIN (once)"
  rm -rf "$CTRD_BIN.tmp" && mkdir -p "$CTRD_BIN.tmp"
  local m=github.com/containerd/containerd/v2
  (cd /tmp && GOBIN="$CTRD_BIN.tmp" CGO_ENABLED=0 go install -trimpath \
    -tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w -X $m/version.Version=v$CONTAINERD_VERSION" \
    "$m/cmd/containerd@v$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@v$CONTAINERD_VERSION" \
    "$m/cmd/ctr@v$CONTAINERD_VERSION")
  rm -rf "$CTRD_BIN" && mv "$CTRD_BIN.tmp" "$CTRD_BIN"
}

cmd_build() {
  command -v go >/dev/null || die "go is not installed"
  local jobs=() j failed=0
  # All at once: the module graphs share little, and the machine's memory allows it.
  [ -x "$BIN/kubelet" ] || { build_kubernetes & jobs+=($!); }
  [ -x "$KR_BIN/kube-router" ] || { build_kube_router & jobs+=($!); }
  [ -x "$LP_BIN/local-path-provisioner" ] || { build_local_path & jobs+=($!); }
  [ -x "$CTRD_BIN/containerd" ] || { build_containerd & jobs+=($!); }
  for j in "${jobs[@]}"; do wait "$j" || failed=1; done
  [ "$failed" = 0 ] || die "the build failed (see above)"
  log "binaries: $BIN ($("$BIN/kubectl" version --client 2>/dev/null | head -1))"
}

# --- packages ------------------------------------------------------------------------------
ensure_packages() {
  local need=() p
  for p in runc containernetworking-plugins iptables ipset conntrack openssl iproute2 curl busybox-static; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# --- PKI -----------------------------------------------------------------------------------
# cert NAME CN [O] [SANS]: an ECDSA key and a certificate signed by the cluster CA.
cert() {
  local name="$1" cn="$2" org="${3:-}" sans="${4:-}" subj="/CN=$2"
  [ -f "$PKI/$name.crt" ] && return 0
  [ -n "$org" ] && subj="/O=$org/CN=$cn"
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 365 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

kubeconfig() {  # kubeconfig NAME CERT [SERVER]: a kubeconfig for one client certificate
  local out="$KCFG/$1.kubeconfig" server="${3:-https://127.0.0.1:6443}"
  [ -f "$out" ] && return 0
  cat >"$out" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: orchard
  cluster:
    certificate-authority: $PKI/ca.crt
    server: $server
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: orchard
  context: {cluster: orchard, user: $1}
current-context: orchard
EOF
  chmod 600 "$out"
}

make_pki() {
  local node="$1" ip="$2"
  mkdir -p "$PKI" "$KCFG" && chmod 700 "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=orchard-cluster-ca" -days 3650 \
      -sha256 -out "$PKI/ca.crt" 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
    openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  cert apiserver kube-apiserver "" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$API_SVC_IP,IP:$ip"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert admin orchard-admin system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kube-proxy system:kube-proxy
  cert kube-router orchard:kube-router
  cert kubelet "system:node:$node" system:nodes "DNS:$node,IP:$ip,IP:127.0.0.1"
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kube-router kube-router
  kubeconfig kubelet kubelet
}

# --- processes -----------------------------------------------------------------------------
pid_of() { local f="$RUN/$1.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"; }

start() {  # start NAME CMD...: run CMD in its own session, logging to $LOGS/NAME.log
  local name="$1"; shift
  pid_of "$name" >/dev/null && return 0
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

wait_for() {  # wait_for WHAT SECONDS CMD...
  local what="$1" secs="$2" i; shift 2
  for ((i = 0; i < secs * 4; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  die "$what not ready after ${secs}s (logs: $LOGS)"
}

put() {  # put FILE: stdin into FILE, only when it differs (components watch their files)
  local tmp="$1.new"
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

kctl() { "$BIN/kubectl" --kubeconfig "$KCFG/admin.kubeconfig" "$@"; }

# containerd_config SOCKET STATE_DIR CNI_DIR: one node's containerd. The root folder is the
# same path on every node (node 2 has its own mounted there: node2.sh), as on real nodes,
# so that the node helper's settings hold on each.
containerd_config() {
  cat <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$2"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$1"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_unprivileged_ports = false
  # Root may lack CAP_SYS_RESOURCE (as in some VMs): never ask for an oom_score_adj below
  # containerd's own, which the kernel would refuse (the pause container wants -998).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$3"
  # One folder per registry name, each with a hosts.toml (read on every pull).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$STATE/containerd/certs.d"
EOF
}

cni_config() {  # cni_config BRIDGE SUBNET IPAM_DIR: one node's pod network
  cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "orchard-k8s",
  "plugins": [
    {"type": "bridge", "bridge": "$1", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$2"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$3"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

kubelet_config() {  # kubelet_config IP CERT SOCKET POD_LOGS_DIR
  cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$3
tlsCertFile: $PKI/$2.crt
tlsPrivateKeyFile: $PKI/$2.key
address: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
failSwapOn: false
maxPods: 250
serializeImagePulls: false
# A trial node on a shared disk: evict only when it is really full.
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
resolvConf: /etc/resolv.conf
podLogsDir: $4
featureGates: {ImageVolume: true}
EOF
}

kube_proxy_config() {  # kube_proxy_config NODE IP KUBECONFIG
  cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $3}
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $1
bindAddress: $2
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
EOF
}

write_configs() {
  local node="$1" ip="$2"
  mkdir -p "$STATE/containerd/certs.d/$REGISTRY_NAME" "$STATE/cni/net.d" "$STATE/cni/ipam" "$STATE/kubelet" "$RUN"
  containerd_config "$CTR_SOCK" "$RUN/containerd" "$STATE/cni/net.d" | put "$STATE/containerd/config.toml"
  put "$STATE/containerd/certs.d/$REGISTRY_NAME/hosts.toml" <<EOF
# Orchard's in-cluster registry: its Service's ClusterIP, plain HTTP (cluster-internal).
server = "http://$REGISTRY_IP:5000"
[host."http://$REGISTRY_IP:5000"]
  capabilities = ["pull", "resolve"]
EOF
  cni_config "$BRIDGE" "$NODE_POD_CIDR" "$STATE/cni/ipam" | put "$STATE/cni/net.d/10-orchard.conflist"
  kubelet_config "$ip" kubelet "$CTR_SOCK" "$STATE/pod-logs" | put "$STATE/kubelet/config.yaml"
  kube_proxy_config "$node" "$ip" "$KCFG/kube-proxy.kubeconfig" | put "$STATE/kube-proxy.yaml"
}

# The host's FORWARD policy may be DROP (Docker sets it): let pod traffic through it. The
# NetworkPolicy firewall's chains run before these rules and drop what policies forbid.
forward_rules() {
  iptables -N ORCHARD-K8S-FWD 2>/dev/null || true
  iptables -C FORWARD -j ORCHARD-K8S-FWD 2>/dev/null || iptables -A FORWARD -j ORCHARD-K8S-FWD
  iptables -F ORCHARD-K8S-FWD
  iptables -A ORCHARD-K8S-FWD -i "$BRIDGE" -j ACCEPT
  iptables -A ORCHARD-K8S-FWD -o "$BRIDGE" -j ACCEPT
}

# Pods' network namespaces are bind mounts in /run/netns. Make that folder a shared mount
# point now, as `ip netns add` would later: if it did so while pods run, its new mount would
# hide theirs and containerd could no longer remove them (pods stuck Terminating).
shared_netns_dir() {
  mkdir -p /run/netns
  mount --make-shared /run/netns 2>/dev/null || {
    mount --bind /run/netns /run/netns && mount --make-shared /run/netns
  }
}

start_component() {
  local node="$1" ip="$2" name="$3"
  case "$name" in
  etcd)
    start etcd "$BIN/etcd" --name default --data-dir "$STATE/etcd" \
      --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
      --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
      --initial-cluster default=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
      --unsafe-no-fsync --log-level warn
    wait_for etcd 30 curl -fsS http://127.0.0.1:2379/health ;;
  kube-apiserver)
    start kube-apiserver "$BIN/kube-apiserver" \
      --etcd-servers http://127.0.0.1:2379 --bind-address 0.0.0.0 --secure-port 6443 \
      --advertise-address "$ip" --service-cluster-ip-range "$SVC_CIDR" \
      --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
      --client-ca-file "$PKI/ca.crt" --kubelet-certificate-authority "$PKI/ca.crt" \
      --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
      --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
      --service-account-issuer https://kubernetes.default.svc.cluster.local \
      --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
      --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
      --anonymous-auth=false --allow-privileged=false --profiling=false \
      --kubelet-preferred-address-types InternalIP --event-ttl 30m --v 1 \
      --feature-gates ImageVolume=true
    wait_for kube-apiserver 90 curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" \
      --key "$PKI/admin.key" https://127.0.0.1:6443/readyz ;;
  kube-controller-manager)
    start kube-controller-manager "$BIN/kube-controller-manager" \
      --kubeconfig "$KCFG/controller-manager.kubeconfig" \
      --authentication-kubeconfig "$KCFG/controller-manager.kubeconfig" \
      --authorization-kubeconfig "$KCFG/controller-manager.kubeconfig" \
      --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
      --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
      --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
      --allocate-node-cidrs --cluster-cidr "$POD_CIDR" --node-cidr-mask-size 24 \
      --service-cluster-ip-range "$SVC_CIDR" --v 1 ;;
  kube-scheduler)
    start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KCFG/scheduler.kubeconfig" \
      --authentication-kubeconfig "$KCFG/scheduler.kubeconfig" \
      --authorization-kubeconfig "$KCFG/scheduler.kubeconfig" \
      --bind-address 127.0.0.1 --leader-elect=false --v 1 ;;
  containerd)
    start containerd "$CTRD_BIN/containerd" --config "$STATE/containerd/config.toml"
    wait_for containerd 30 ctr -a "$CTR_SOCK" version ;;
  kubelet)
    own_node "$node" "$NODE_POD_CIDR"
    start kubelet "$BIN/kubelet" --config "$STATE/kubelet/config.yaml" \
      --kubeconfig "$KCFG/kubelet.kubeconfig" --root-dir "$STATE/kubelet/root" \
      --hostname-override "$node" --node-ip "$ip" --v 1
    node_addressed "$node" ;;
  kube-proxy)
    start kube-proxy "$BIN/kube-proxy" --config "$STATE/kube-proxy.yaml" ;;
  kube-router)
    start kube-router "$KR_BIN/kube-router" --kubeconfig "$KCFG/kube-router.kubeconfig" \
      --hostname-override "$node" "${KR_FLAGS[@]}" ;;
  *) n2_start_component "$name" ;;
  esac
}

# own_node NAME CIDR: the Node object, with its pod CIDR, made before its kubelet registers
# (which then takes it over). The controller manager's allocator gives CIDRs in an order of
# its own: twice in a row it gave node 1's fixed range to node 2. One it finds set, it keeps.
own_node() {
  local have
  have="$(kctl get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)"
  if [ -z "$have" ]; then
    printf '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "%s"}, "spec": {"podCIDR": "%s", "podCIDRs": ["%s"]}}' \
      "$1" "$2" "$2" | kctl create -f - >/dev/null 2>&1 ||
      have="$(kctl get node "$1" -o jsonpath='{.spec.podCIDR}')"  # made meanwhile
  fi
  [ -z "$have" ] || [ "$have" = "$2" ] || die "node $1 has pod CIDR $have, not $2: cluster.sh down, then up"
}

# node_addressed NAME: wait until the kubelet has written its Node's InternalIP. A kubelet
# that finds its Node made (own_node) writes the status only at its next update, and
# kube-router, started next, reads its node once as it starts: started before the
# address was there, it enforced no NetworkPolicy (the live suite's egress tests failed).
node_addressed() { wait_for "node $1's address" 60 has_internal_ip "$1"; }
has_internal_ip() {
  [ -n "$(kctl get node "$1" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')" ]
}

# import_images SOCKET DB IMAGE...: docker save | ctr import into one node's containerd,
# skipping what it already has (DB: the image ids that node was given)
import_images() {
  local sock="$1" db="$2" img have; shift 2
  have="$(ctr -a "$sock" -n k8s.io images ls -q 2>/dev/null || true)"
  for img in "$@"; do
    local full="$img"
    case "$img" in */*/*|*.*/*) ;; */*) full="docker.io/$img" ;; *) full="docker.io/library/$img" ;; esac
    case "$full" in *:*) ;; *) full="$full:latest" ;; esac
    local id
    id="$(docker image inspect --format '{{.Id}}' "$img" 2>/dev/null)" || die "image $img is not in the local Docker engine"
    if grep -qxF "$full" <<<"$have" && [ "$(cat "$db/$(echo "$full" | tr '/:' '__')" 2>/dev/null)" = "$id" ]; then
      continue
    fi
    log "loading $img into the cluster"
    # (containerd 2.2's ctr warns on each import that cgroup v1 is deprecated: not news here)
    docker save "$img" | ctr -a "$sock" -n k8s.io images import --no-unpack=false - 2>&1 >/dev/null |
      { grep -v 'DEPRECATION: The support for cgroup v1' >&2 || true; }
    mkdir -p "$db" && echo "$id" >"$db/$(echo "$full" | tr '/:' '__')"
  done
}

pause_image() {
  docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 && return 0
  local tmp; tmp="$(mktemp -d)"
  cp "$BIN/pause" "$tmp/pause"
  tar -C "$tmp" -c pause | docker import -c 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
  rm -rf "$tmp"
}

# The provisioner (FROM scratch + its static binary) and its helper pods' image (the host's
# static busybox and its applets: the helpers run `sh`, `mkdir` and `rm`).
storage_images() {
  local tmp a
  if ! docker image inspect "$PROVISIONER_IMAGE" >/dev/null 2>&1; then
    tmp="$(mktemp -d)"
    cp "$LP_BIN/local-path-provisioner" "$tmp/"
    tar -C "$tmp" --owner=0 --group=0 -c local-path-provisioner |
      docker import -c 'ENTRYPOINT ["/local-path-provisioner"]' - "$PROVISIONER_IMAGE" >/dev/null
    rm -rf "$tmp"
  fi
  if ! docker image inspect "$HELPER_IMAGE" >/dev/null 2>&1; then
    tmp="$(mktemp -d)"
    mkdir -p "$tmp/bin"
    cp /bin/busybox "$tmp/bin/busybox"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$tmp/bin/$a"; done
    tar -C "$tmp" --owner=0 --group=0 -c bin |
      docker import -c 'ENV PATH=/bin' -c 'ENTRYPOINT ["/bin/sh"]' - "$HELPER_IMAGE" >/dev/null
    rm -rf "$tmp"
  fi
}

deploy_local_path() {
  mkdir -p "$STATE/local-path"
  sed -e "s|@STATE@|$STATE|g" -e "s|@PROVISIONER_IMAGE@|$PROVISIONER_IMAGE|g" \
    -e "s|@HELPER_IMAGE@|$HELPER_IMAGE|g" "$HERE/local-path.yaml" |
    kctl apply --server-side --force-conflicts -f - >/dev/null
}

cmd_up() {
  [ "$(id -u)" = 0 ] || die "run as root (the kubelet manages cgroups, mounts and the network)"
  ensure_packages
  cmd_build
  local node ip
  node="$(node_name)"; ip="$(node_ip)"
  mkdir -p "$STATE" "$RUN" "$LOGS"
  make_pki "$node" "$ip"
  write_configs "$node" "$ip"
  forward_rules
  shared_netns_dir
  local c
  for c in "${COMPONENTS[@]}"; do start_component "$node" "$ip" "$c"; done
  pause_image
  storage_images
  import_images "$CTR_SOCK" "$STATE/images" "${BASE_IMAGES[@]}"
  kctl apply --server-side --force-conflicts -f "$HERE/rbac.yaml" >/dev/null
  deploy_local_path
  wait_for "node $node" 120 kctl wait --for=condition=Ready "node/$node" --timeout=2s
  if n2_wanted; then n2_up "$ip"; fi
  wait_for "the default service account" 60 kctl -n default get serviceaccount default
  log "up: node $node ($ip)$(n2_wanted && echo " and node $(n2_name) ($N2_IP)"), Kubernetes v$K8S_VERSION; logs in $LOGS"
  echo "$KCFG/admin.kubeconfig"
}

cmd_status() {
  local c p
  for c in "${COMPONENTS[@]}" "${N2_COMPONENTS[@]}"; do
    if p="$(pid_of "$c")"; then echo "$c running (pid $p)"; else echo "$c stopped"; fi
  done
  [ -f "$KCFG/admin.kubeconfig" ] && echo "kubeconfig: $KCFG/admin.kubeconfig"
  return 0
}

cmd_restart() {
  local name="${1:-}" p
  [ -n "$name" ] || die "usage: cluster.sh restart COMPONENT"
  p="$(pid_of "$name")" && kill -9 "$p" && while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  rm -f "$RUN/$name.pid"
  start_component "$(node_name)" "$(node_ip)" "$name"
  log "restarted $name"
}

cmd_stop() {
  [ -n "${1:-}" ] || die "usage: cluster.sh stop COMPONENT"
  stop_pid "$1"
  log "stopped $1"
}

cmd_start() {
  [ -n "${1:-}" ] || die "usage: cluster.sh start COMPONENT"
  start_component "$(node_name)" "$(node_ip)" "$1"
  log "started $1"
}

stop_pid() {
  local name="$1" p i
  p="$(pid_of "$name")" || { rm -f "$RUN/$name.pid"; return 0; }
  kill "$p" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$RUN/$name.pid"
}

kill_tasks() {  # kill_tasks SOCKET: every pod's containers and sandboxes, then the shims
  local ids c
  ids="$(ctr -a "$1" -n k8s.io tasks ls -q 2>/dev/null || true)"
  for c in $ids; do ctr -a "$1" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
  for c in $ids; do ctr -a "$1" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true; done
  ids="$(ctr -a "$1" -n k8s.io containers ls -q 2>/dev/null || true)"
  for c in $ids; do ctr -a "$1" -n k8s.io containers delete "$c" >/dev/null 2>&1 || true; done
}

cmd_load() {  # the images on every node
  import_images "$CTR_SOCK" "$STATE/images" "$@"
  if pid_of n2-containerd >/dev/null; then import_images "$N2_SOCK" "$N2_STATE/images" "$@"; fi
}

cmd_down() {
  [ "$(id -u)" = 0 ] || die "run as root"
  local c
  n2_down
  stop_pid kubelet
  if pid_of containerd >/dev/null; then kill_tasks "$CTR_SOCK"; fi
  for c in kube-router kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
    stop_pid "$c"
  done
  # Shims left by a containerd that died first.
  pkill -9 -f "containerd-shim-runc-v2 -namespace k8s.io -address $CTR_SOCK" 2>/dev/null || true
  # Mounts under our folders (deepest first), and the pods' network namespaces.
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($STATE|$RUN)(/|$)" | sort -r || true); do
    umount -l "$m" 2>/dev/null || true
  done
  local i
  for ((i = 0; i < 5; i++)); do  # a later bind mount of /run/netns may hide them: peel it
    grep -q ' /run/netns/cni-' /proc/self/mountinfo || break
    for m in $(awk '$5 ~ "^/run/netns/cni-" {print $5}' /proc/self/mountinfo); do umount -l "$m" 2>/dev/null || true; done
    grep -q ' /run/netns/cni-' /proc/self/mountinfo && umount -l /run/netns 2>/dev/null
  done
  rm -f /run/netns/cni-*
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  # iptables: kube-proxy's, kube-router's, the CNI plugins' and ours, in every table.
  local t chain
  for t in filter nat mangle raw; do
    { iptables -t "$t" -S 2>/dev/null | grep -E '^-A .* -j (KUBE-|CNI-|ORCHARD-K8S-)' | sed 's/^-A/-D/' |
      while read -r rule; do eval "iptables -t $t $rule" 2>/dev/null || true; done; } || true
    for chain in $(iptables -t "$t" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-|ORCHARD-K8S-)/ {print $2}'); do
      iptables -t "$t" -F "$chain" 2>/dev/null || true
    done
    for chain in $(iptables -t "$t" -S 2>/dev/null | awk '/^-N (KUBE-|CNI-|ORCHARD-K8S-)/ {print $2}'); do
      iptables -t "$t" -X "$chain" 2>/dev/null || true
    done
  done
  local s
  for s in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true); do ipset destroy "$s" 2>/dev/null || true; done
  # The kubelet's cgroups (kubepods under each v1 controller, or one v2 tree).
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods.slice; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  rm -rf "$STATE" "$RUN"
  log "down: nothing of the cluster is left"
}

case "${1:-}" in
build) cmd_build ;;
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
load) shift; cmd_load "$@" ;;
restart) shift; cmd_restart "$@" ;;
stop) shift; cmd_stop "$@" ;;
start) shift; cmd_start "$@" ;;
kubeconfig) echo "$KCFG/admin.kubeconfig" ;;
bin) echo "$BIN" ;;
n2-join-init) n2_join_init ;;  # internal: node 2's namespaces (node2.sh)
n2-init-inside) n2_init_inside ;;
n2-join) shift; n2_join "$@" ;;
*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
