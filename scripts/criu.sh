#!/usr/bin/env bash
# CRIU for memory snapshots of local sandboxes (docs/state.md), idempotent.
#
# Debian's own CRIU comes first. Debian 12's 3.17 cannot run on kernels >= 6.13
# ("vdso: Unexpected rt vDSO area bounds": [vvar_vclock]) and 4.1 cannot dump TCP sockets
# on kernels >= 6.16 ("Can't get 1:16 opt": SO_PASSCRED), so when `criu check` fails this
# builds CRIU $CRIU_VERSION from Debian's own source package (fetched with apt from the
# archive this host's apt already uses, hash-checked against its signed index) into
# $CRIU_PREFIX/sbin/criu (/usr/local/sbin/criu).
# Never fatal: without a working CRIU, memory snapshots answer 501 memory_not_supported.
# tests/test_criu_setup.py runs this script against fake apt-get/make on a temp PATH.
set -uo pipefail

CRIU_VERSION=${CRIU_VERSION:-4.2.1-1}
CRIU_PREFIX=${CRIU_PREFIX:-/usr/local}
APT_ETC=${APT_ETC:-/etc/apt}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# major*100+minor of "Version: 4.2.1" / "6.18.44-..."
num() { sed -n 's/^\([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | { read -r a b; echo $((a * 100 + b)); }; }
# Whether criu ($1, else the one PATH finds now) works here. `hash -r` first: bash
# remembers where it last ran criu (Debian's, in /usr/sbin), so without it the check after
# the build ran that old binary again and reported the freshly installed one as broken.
works() {
  hash -r
  local bin=${1:-}
  [ -n "$bin" ] || bin=$(command -v criu) || return 1
  "$bin" check >/dev/null 2>&1 || return 1
  local have; have=$("$bin" --version | sed -n 's/^Version: //p' | num)
  # Kernels >= 6.16 refuse SO_PASSCRED on TCP sockets: CRIU < 4.2 cannot dump those.
  [ "$(uname -r | num)" -lt 616 ] || [ "$have" -ge 402 ]
}

if works; then exit 0; fi
export DEBIAN_FRONTEND=noninteractive
dpkg -s criu >/dev/null 2>&1 || $SUDO apt-get install -y -q --no-install-recommends criu >/dev/null 2>&1
if works; then exit 0; fi

echo "criu.sh: Debian's CRIU does not work on this kernel; building CRIU ${CRIU_VERSION%-*}"
deps=(build-essential pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev
  libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev
  python3-protobuf iproute2 util-linux)
$SUDO apt-get install -y -q --no-install-recommends "${deps[@]}" >/dev/null || {
  echo "criu.sh: cannot install CRIU's build dependencies"; exit 0; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial"
# The first Debian archive URI this host's apt is configured with (deb822 or one-line form).
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)[[:space:]]*$/\1/p' \
  "$APT_ETC"/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\)[[:space:]].*/\2/p' \
  "$APT_ETC"/sources.list 2>/dev/null | head -1)
[ -n "$mirror" ] || { echo "criu.sh: no Debian archive in apt's sources"; exit 0; }
echo "deb-src $mirror sid main" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$work/lists")
( cd "$work" && apt-get "${apt_opts[@]}" update -q >/dev/null \
  && apt-get "${apt_opts[@]}" source --download-only "criu=$CRIU_VERSION" >/dev/null 2>&1 )
orig=$(ls "$work"/criu_*.orig.tar.* 2>/dev/null | head -1)
[ -n "$orig" ] || { echo "criu.sh: could not fetch criu $CRIU_VERSION's source"; exit 0; }
tar -xf "$orig" -C "$work"
src=$(ls -d "$work"/criu-*/ | head -1)
if make -C "$src" -j"$(nproc)" criu >"$work/build.log" 2>&1; then
  $SUDO install -D -m 0755 "$src/criu/criu" "$CRIU_PREFIX/sbin/criu"
else
  tail -20 "$work/build.log"; echo "criu.sh: build failed"; exit 0
fi
built="$CRIU_PREFIX/sbin/criu"
if works; then
  echo "criu.sh: $("$built" --version | head -1) installed in $CRIU_PREFIX/sbin"
elif works "$built"; then
  echo "criu.sh: $built works, but PATH finds $(command -v criu) first: put $CRIU_PREFIX/sbin earlier on PATH"
else
  echo "criu.sh: $(command -v criu || echo criu) still fails \`criu check\` here; memory snapshots stay off"
fi
exit 0
