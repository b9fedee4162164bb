#!/usr/bin/env bash
# `make test-k8s`: the live suite on a real two-node cluster built from source.
# 1. start the cluster (deploy/cluster/cluster.sh up: builds once, cached by version)
# 2. build the service and injector images offline and load them on the node
# 3. run tests/live (Orchard deployed in-cluster, used from outside) with the cluster's
#    kubeconfig; the fixtures delete everything they made
# 4. stop the cluster again if this script started it (ORCHARD_KEEP_CLUSTER=1 keeps it)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cluster-session.sh
cluster_session test-k8s
t0=$(date +%s)
kubeconfig="$($CLUSTER up 9>&- | tail -1)"  # its daemons must not hold the lock
t1=$(date +%s)
mapfile -t images < <(bash deploy/kubernetes/images/build.sh local)
$CLUSTER load "${images[@]}" 9>&-
t2=$(date +%s)
echo "test-k8s: cluster up in $((t1 - t0)) s, images built and loaded in $((t2 - t1)) s"
export ORCHARD_TEST_KUBECONFIG="$kubeconfig" ORCHARD_TEST_KUBECTL="$($CLUSTER bin)/kubectl"
export HF_HUB_OFFLINE=1
# Named test files or node ids run alone; other arguments (-k, -x, ...) go with tests/live.
targets=(tests/live)
for arg in "$@"; do [ -e "${arg%%::*}" ] && targets=(); done
# (9>&-: what the tests start, e.g. a restarted API server, must not hold the lock either)
.venv/bin/pytest -q -p no:cacheprovider -o addopts="-ra" "${targets[@]}" "$@" 9>&-
