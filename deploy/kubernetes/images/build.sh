#!/usr/bin/env bash
# Build Orchard's cluster images offline, into the local Docker engine, and print their
# tags (one a line). No registry and no base image pull:
#   orchard/agent-injector:TAG  FROM scratch: the static agent + the tiny copier, docker import
#   orchard/node:TAG            FROM scratch: the node helper (the DaemonSet), docker import
#   orchard/registry:TAG        FROM scratch: the in-cluster registry (distribution v3, built
#                               from the Go module proxy once per version) + its gate
#                               (registry/build.sh)
#   orchard/service:TAG         a Debian minbase rootfs made by mmdebstrap (from the host's own
#                               apt sources) + a virtualenv installed from a wheelhouse built
#                               on this host
# Usage: deploy/kubernetes/images/build.sh [TAG]   (default TAG: local)
# Each image carries a label with the hash of what went into it and is rebuilt only when that
# changes. Push them to your registry (docker tag + push) or load them into a cluster
# (`deploy/cluster/cluster.sh load`, `kind load docker-image`, `k3s ctr images import`).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
TAG="${1:-local}"
PY="${PY:-$ROOT/.venv/bin/python}"
cd "$ROOT"

log() { echo "images: $*" >&2; }
hash_of() { (cd "$ROOT" && find "$@" -type f -not -path '*/__pycache__/*' -print0 | sort -z |
  xargs -0 sha256sum | sha256sum | cut -c1-16); }
current() { docker image inspect --format '{{index .Config.Labels "orchard.build"}}' "$1" 2>/dev/null || true; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- the injector ---------------------------------------------------------------------------
make --no-print-directory -s agent >&2
injector="orchard/agent-injector:$TAG"
key="$(hash_of build/orchard-agent deploy/kubernetes/images/injector)"
if [ "$(current "$injector")" != "$key" ]; then
  log "building $injector"
  (cd deploy/kubernetes/images/injector && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/inj/orchard-inject" .)
  cp build/orchard-agent "$tmp/inj/"
  tar -C "$tmp/inj" --owner=0 --group=0 -c orchard-agent orchard-inject |
    docker import -c 'USER 0:0' -c 'ENTRYPOINT ["/orchard-inject"]' \
      -c "LABEL orchard.build=$key" - "$injector" >/dev/null
fi
echo "$injector"

# --- the node helper ------------------------------------------------------------------------
# FROM scratch too: one static binary (node/, standard library only), run by the DaemonSet.
node="orchard/node:$TAG"
key="$(hash_of node)"
if [ "$(current "$node")" != "$key" ]; then
  log "building $node"
  mkdir -p "$tmp/node"
  (cd node && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/node/orchard-node" .)
  tar -C "$tmp/node" --owner=0 --group=0 -c orchard-node |
    docker import -c 'USER 0:0' -c 'ENTRYPOINT ["/orchard-node"]' \
      -c "LABEL orchard.build=$key" - "$node" >/dev/null
fi
echo "$node"

# --- the service ----------------------------------------------------------------------------
service="orchard/service:$TAG"
extras=kubernetes
grep -qE '^server = \[' pyproject.toml && extras="server,kubernetes"
base="$("$PY" -m orchard.env.images debian-python -p python3-venv -p ca-certificates)"
key="$(hash_of src pyproject.toml README.md LICENSE)-$base-$extras"
if [ "$(current "$service")" != "$key" ]; then
  log "building $service (wheelhouse from this tree, then a venv in $base)"
  # From a clean copy: setuptools' build/lib in the tree keeps files since moved or deleted
  # (a stale module would shadow its new package), and two builds at once would share it.
  mkdir -p "$tmp/tree"
  cp -r src pyproject.toml README.md LICENSE "$tmp/tree/"
  find "$tmp/tree" -name __pycache__ -prune -exec rm -rf {} +
  "$PY" -m pip wheel -q --wheel-dir "$tmp/ctx/wheels" "$tmp/tree[$extras]" >"$tmp/wheel.log" 2>&1 || {
    cat "$tmp/wheel.log" >&2; exit 1; }
  cat >"$tmp/ctx/Dockerfile" <<EOF
FROM $base
COPY wheels /wheels
RUN python3 -m venv /opt/orchard \
 && /opt/orchard/bin/pip install -q --no-index --no-cache-dir --find-links /wheels 'orchard[$extras]' \
 && rm -rf /wheels
ENV PATH=/opt/orchard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
# Non-root, matching the Deployment's securityContext.
USER 10001:10001
EXPOSE 8080
LABEL orchard.build="$key"
ENTRYPOINT ["orchard"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--backend", "kubernetes"]
EOF
  DOCKER_BUILDKIT=0 docker build -q -t "$service" "$tmp/ctx" >/dev/null 2>"$tmp/build.log" || {
    cat "$tmp/build.log" >&2; exit 1; }
fi
echo "$service"

# --- the in-cluster registry ----------------------------------------------------------------
bash "$ROOT/deploy/kubernetes/images/registry/build.sh" "$TAG"
