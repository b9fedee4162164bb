# Sourced by scripts/test-k8s.sh and scripts/bench-k8s.sh: one run at a time on this
# machine's cluster (a second run's deployment would re-apply and restart Orchard under
# the first, and build the same images), the cluster stopped at the end only if this run
# started it (ORCHARD_KEEP_CLUSTER=1 keeps it). `cluster_session NAME`; then $CLUSTER.
# Whatever the run starts must close fd 9 (`9>&-`), or its daemons hold the lock for ever.
CLUSTER="bash deploy/cluster/cluster.sh"
cluster_session() {
  exec 9>/run/lock/orchard-test-k8s.lock
  flock -n 9 || { echo "$1: waiting for another cluster run to finish" >&2; flock 9; }
  started=0
  # (not `status | grep -q`: grep exits at the match, status gets SIGPIPE, and with pipefail
  # the pipeline fails, so a running cluster would read as stopped and be stopped at the end)
  grep -q "kube-apiserver running" <<<"$($CLUSTER status)" || started=1
  trap cluster_session_end EXIT
}
cluster_session_end() {
  if [ "$started" = 1 ] && [ -z "${ORCHARD_KEEP_CLUSTER:-}" ]; then $CLUSTER down; fi
}
