#!/usr/bin/env bash
# kwok (sigs.k8s.io/kwok) against the trial cluster: fake Nodes whose pods "run" without a
# kubelet, for control-plane scale (bench/k8s_kwok.py). Nothing runs in them: only the API
# server, etcd, the scheduler, the controllers and watchers see them.
#
#   kwok.sh build               build the kwok binary once per version (cached outside the
#                               repository) and its stage config; prints the binary's path
#   kwok.sh start [KUBECONFIG]  build if needed, then run kwok in the background (idempotent);
#                               it manages only Nodes annotated kwok.x-k8s.io/node=fake
#   kwok.sh stop [KUBECONFIG]   delete those Nodes (their pods go with them), stop kwok
#   kwok.sh status              whether it runs, and how many fake Nodes there are
#   kwok.sh bin                 print the binary's path
#
# KUBECONFIG defaults to the trial cluster's admin kubeconfig (cluster.sh kubeconfig). The
# stages (what kwok does to Nodes and Pods) are the module's own "fast" set, read from its
# source: a Node turns Ready at once and keeps a Lease; a Pod bound to it turns Running with
# an IP from the Node's podCIDR at once, and a deleted one is removed at once.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

KWOK_VERSION=0.8.0
CACHE="${ORCHARD_KWOK_CACHE:-/var/cache/orchard/kwok-v$KWOK_VERSION}"
STATE="${ORCHARD_CLUSTER_STATE:-/var/lib/orchard-cluster}/kwok"
SELECTOR=kwok.x-k8s.io/node=fake
SERVER=127.0.0.1:10247  # kwok's own /healthz (loopback only)
BIN="$CACHE/kwok"
STAGES="$CACHE/stages.yaml"
PID="$STATE/kwok.pid"

log() { echo "kwok: $*" >&2; }
die() { log "error: $*"; exit 1; }

kubeconfig() { echo "${1:-$(bash "$HERE/cluster.sh" kubeconfig)}"; }
kctl() {  # kctl KUBECONFIG ARGS...: the kubectl cluster.sh built
  local cfg="$1"; shift
  "$(bash "$HERE/cluster.sh" bin)/kubectl" --kubeconfig "$cfg" "$@"
}

# The default stages kwokctl installs (kustomize/stage/fast, with the Lease heartbeat), taken
# from the module's source so they match the binary; one multi-document file for --config.
write_stages() {
  local dir f
  dir="$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" |
    sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [ -d "$dir/kustomize/stage" ] || die "no stage folder in the module source ($dir)"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$dir/kustomize/stage/$f"
  done >"$STAGES.tmp"
  mv "$STAGES.tmp" "$STAGES"
}

cmd_build() {
  if [ ! -x "$BIN" ]; then
    command -v go >/dev/null || die "go is not installed"
    log "building kwok v$KWOK_VERSION into $CACHE (once; a few minutes on 2 cores)"
    rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp"
    (cd /tmp && GOBIN="$CACHE.tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install -trimpath \
      -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION")
    mkdir -p "$CACHE"
    mv "$CACHE.tmp/kwok" "$BIN" && rm -rf "$CACHE.tmp"
  fi
  [ -s "$STAGES" ] || write_stages
  echo "$BIN"
}

pid_of() { [ -f "$PID" ] && kill -0 "$(cat "$PID")" 2>/dev/null && cat "$PID"; }

healthy() { curl -fsS "http://$SERVER/healthz" >/dev/null 2>&1; }

cmd_start() {
  local cfg i
  cfg="$(kubeconfig "${1:-}")"
  [ -f "$cfg" ] || die "no kubeconfig at $cfg (is the cluster up?)"
  cmd_build >/dev/null
  mkdir -p "$STATE"
  if pid_of >/dev/null; then log "already running (pid $(cat "$PID"))"; return 0; fi
  # Leases every 10 s (a quarter of 40 s) instead of a status update per Node every 20 s.
  setsid "$BIN" --kubeconfig "$cfg" --config "$STAGES" --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector "$SELECTOR" --node-lease-duration-seconds 40 \
    --server-address "$SERVER" >>"$STATE/kwok.log" 2>&1 </dev/null &
  echo $! >"$PID"
  for ((i = 0; i < 120; i++)); do
    healthy && { log "running (pid $(cat "$PID")), managing Nodes annotated $SELECTOR; log $STATE/kwok.log"; return 0; }
    pid_of >/dev/null || die "kwok exited (log: $STATE/kwok.log): $(tail -3 "$STATE/kwok.log")"
    sleep 0.25
  done
  die "kwok not healthy after 30 s (log: $STATE/kwok.log)"
}

fake_nodes() {  # the Nodes kwok manages, by annotation (not every user labels them)
  kctl "$1" get nodes -o jsonpath='{range .items[?(@.metadata.annotations.kwok\.x-k8s\.io/node=="fake")]}{.metadata.name}{"\n"}{end}'
}

cmd_stop() {
  local cfg nodes p i
  cfg="$(kubeconfig "${1:-}")"
  if [ -f "$cfg" ] && nodes="$(fake_nodes "$cfg" 2>/dev/null)" && [ -n "$nodes" ]; then
    # While kwok still runs, so that pods deleted meanwhile are finished off at once (the
    # pod garbage collector removes the rest: pods bound to a Node that is gone).
    log "deleting $(wc -l <<<"$nodes") fake Nodes"
    xargs -r -n 200 "$(bash "$HERE/cluster.sh" bin)/kubectl" --kubeconfig "$cfg" delete node \
      --ignore-not-found --wait=false <<<"$nodes" >/dev/null
  fi
  if p="$(pid_of)"; then
    kill "$p" 2>/dev/null || true
    for ((i = 0; i < 40; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$p" 2>/dev/null || true
    log "stopped (pid $p)"
  fi
  rm -f "$PID"
}

cmd_status() {
  local p cfg
  if p="$(pid_of)"; then echo "kwok running (pid $p)"; else echo "kwok stopped"; fi
  cfg="$(kubeconfig "")"
  [ -f "$cfg" ] && echo "fake nodes: $(fake_nodes "$cfg" 2>/dev/null | grep -c . || true)"
  return 0
}

case "${1:-}" in
build) cmd_build ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
status) cmd_status ;;
bin) echo "$BIN" ;;
*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
