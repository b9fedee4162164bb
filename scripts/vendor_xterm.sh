#!/usr/bin/env bash
# The dashboard's terminal: xterm.js from the npm registry, copied into the package so the
# service fetches nothing at run time. `make setup` runs this at build time when the files
# are missing (they are git-ignored); a version bump is: edit VERSION and SHA256, rerun it.
set -euo pipefail
VERSION=6.0.0
SHA256=908e66e04af6c8dc6b00dd3b54de088e2e81e5ed866284fd6c2fb3c2d1c7a3f6
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/src/orchard/env/server/ui/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "@xterm/xterm@$VERSION" >/dev/null)
TGZ="$WORK/xterm-xterm-$VERSION.tgz"
echo "$SHA256  $TGZ" | sha256sum -c --quiet -
tar -xzf "$TGZ" -C "$WORK"
mkdir -p "$DEST"
cp "$WORK/package/lib/xterm.js" "$DEST/xterm.js"
cp "$WORK/package/css/xterm.css" "$DEST/xterm.css"
cp "$WORK/package/LICENSE" "$DEST/xterm.LICENSE"
echo "vendored @xterm/xterm $VERSION into $DEST"
