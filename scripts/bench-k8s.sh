#!/usr/bin/env bash
# `make bench-k8s`: the Kubernetes benchmarks (bench/k8s_bench.py) on the real node.
# 1. hold the live suite's lock (scripts/test-k8s.sh): the bench deploys Orchard in the
#    cluster as the suite does, and two of them at once would measure each other
# 2. start the cluster if it is not running (deploy/cluster/cluster.sh up), build the
#    service and injector images offline and load them, with the busybox sandbox image
# 3. run the bench: it deploys the `local` overlay, measures, and deletes what it applied
# 4. stop the cluster again only if this script started it (ORCHARD_KEEP_CLUSTER=1 keeps it)
# Arguments go to bench/k8s_bench.py (e.g. --only create --create-n 50); BENCH=k8s_kwok_service
# runs that one instead (`make bench-kwok-service`: the deployed service on kwok's Nodes).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cluster-session.sh
cluster_session bench-k8s
kubeconfig="$($CLUSTER up 9>&- | tail -1)"  # its daemons must not hold the lock
mapfile -t images < <(bash deploy/kubernetes/images/build.sh local)
busybox="$(.venv/bin/python -c 'from orchard.env import images; print(images.busybox_image())')"
$CLUSTER load "${images[@]}" "$busybox" 9>&-
export HF_HUB_OFFLINE=1
if [ "${BENCH:-k8s_bench}" = k8s_bench ]; then set -- --image "$busybox" "$@"; fi
.venv/bin/python "bench/${BENCH:-k8s_bench}.py" --kubeconfig "$kubeconfig" "$@" 9>&-
