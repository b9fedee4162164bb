#!/usr/bin/env bash
# Build the in-cluster registry image offline, into the local Docker engine, and print its tag:
#   orchard/registry:TAG  FROM scratch: the upstream registry (distribution v3, built from the
#                         Go module proxy, static) + orchard-registry (gate/, the entrypoint
#                         that makes garbage collection safe while it serves)
# Usage: deploy/kubernetes/images/registry/build.sh [TAG]   (default TAG: local)
# The registry binary is built once per version and cached outside the repository
# (ORCHARD_REGISTRY_CACHE, default /var/cache/orchard/registry-v<version>); the image carries
# a label with the hash of what went into it and is rebuilt only when that changes.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TAG="${1:-local}"
VERSION=3.1.2
MODULE=github.com/distribution/distribution/v3
CACHE="${ORCHARD_REGISTRY_CACHE:-/var/cache/orchard/registry-v$VERSION}"
image="orchard/registry:$TAG"

log() { echo "registry: $*" >&2; }

if [ ! -x "$CACHE/registry" ]; then
  command -v go >/dev/null || { log "error: go is not installed"; exit 1; }
  log "building $MODULE v$VERSION from the Go module proxy into $CACHE (once; ~5 min on 2 cores)"
  rm -rf "$CACHE.tmp" && mkdir -p "$CACHE.tmp"
  (cd /tmp && GOBIN="$CACHE.tmp" CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" go install \
    -ldflags "-s -w -X $MODULE/version.version=v$VERSION" "$MODULE/cmd/registry@v$VERSION")
  rm -rf "$CACHE" && mv "$CACHE.tmp" "$CACHE"
fi

key="$( (sha256sum "$CACHE/registry" && cd "$HERE/gate" && sha256sum go.mod ./*.go) | sha256sum | cut -c1-16)"
if [ "$(docker image inspect --format '{{index .Config.Labels "orchard.build"}}' "$image" 2>/dev/null || true)" != "$key" ]; then
  log "building $image"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$HERE/gate" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$tmp/orchard-registry" .)
  cp "$CACHE/registry" "$tmp/registry"
  # Non-root, matching the Deployment's securityContext (Pod Security "restricted").
  tar -C "$tmp" --owner=0 --group=0 -c registry orchard-registry |
    docker import -c 'USER 10002:10002' -c 'EXPOSE 5000' -c 'ENV OTEL_TRACES_EXPORTER=none' \
      -c 'ENTRYPOINT ["/orchard-registry"]' -c "LABEL orchard.build=$key" - "$image" >/dev/null
fi
echo "$image"
