#!/usr/bin/env bash
# `make test-k8s`: the live suite on a real single-node cluster built from source.
# 1. start the cluster (deploy/cluster/cluster.sh up: builds once, cached by version)
# 2. build the service and injector images offline and load them on the node
# 3. run tests/live (Orchard deployed in-cluster, used from outside) with the cluster's
#    kubeconfig; the fixtures delete everything they made
# 4. stop the cluster again if this script started it (ORCHARD_KEEP_CLUSTER=1 keeps it)
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER="bash deploy/cluster/cluster.sh"
started=0
$CLUSTER status | grep -q "kube-apiserver running" || started=1
down() {
  if [ "$started" = 1 ] && [ -z "${ORCHARD_KEEP_CLUSTER:-}" ]; then $CLUSTER down; fi
}
trap down EXIT
t0=$(date +%s)
kubeconfig="$($CLUSTER up | tail -1)"
t1=$(date +%s)
mapfile -t images < <(bash deploy/kubernetes/images/build.sh local)
$CLUSTER load "${images[@]}"
t2=$(date +%s)
echo "test-k8s: cluster up in $((t1 - t0)) s, images built and loaded in $((t2 - t1)) s"
export ORCHARD_TEST_KUBECONFIG="$kubeconfig" ORCHARD_TEST_KUBECTL="$($CLUSTER bin)/kubectl"
export HF_HUB_OFFLINE=1
.venv/bin/pytest -q -p no:cacheprovider -o addopts="-ra" tests/live "$@"
