#!/usr/bin/env bash
# Idempotent set-up on Debian/Ubuntu: system packages, Docker daemon, .venv.
# gcc, libc6-dev: the agent's loader for Kubernetes pods (agent/boot/boot.c), built static.
# chromium: the browser tests (inspect view, the dashboard) drive it through Playwright.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need=()
for pkg in golang-go gcc libc6-dev docker.io mmdebstrap busybox-static make iptables git ca-certificates runc crun umoci skopeo dnsmasq-base chromium fonts-dejavu-core; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi

# CRIU, for memory snapshots of local sandboxes (never fatal: they answer 501 without it).
bash scripts/criu.sh || true

if ! $SUDO docker info >/dev/null 2>&1; then
  echo "setup: starting dockerd"
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl start docker || true
  fi
  if ! $SUDO docker info >/dev/null 2>&1; then
    $SUDO bash -c 'nohup dockerd >/var/log/orchard-dockerd.log 2>&1 &'
  fi
  for _ in $(seq 1 60); do
    $SUDO docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  $SUDO docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start; see /var/log/orchard-dockerd.log"; exit 1; }
fi

# The dashboard's terminal: xterm.js from the npm registry into the package, at build time.
[ -f src/orchard/env/server/ui/static/vendor/xterm.js ] || bash scripts/vendor_xterm.sh ||
  echo "setup: could not vendor xterm.js from the npm registry; the dashboard has no terminal" >&2

# A virtualenv counts once it has its pip: one cut short (Ctrl-C during ensurepip) is made
# again, not used half-made.
if [ ! -x .venv/bin/pip ]; then
  echo "setup: creating .venv"
  python3 -m venv --clear .venv
fi
# `dev` pulls in every extra: `server` (the service: FastAPI, uvicorn, aiodocker, ...), the
# families', training, kubernetes and bench. A plain `pip install orchard` is the SDK and
# the CLI client only.
if [ ! -f .venv/.installed ] || [ pyproject.toml -nt .venv/.installed ]; then
  echo "setup: installing orchard[dev] into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev]'
  touch .venv/.installed
fi

# Harbor (the Terminal-Bench 2 runner) needs Python >= 3.12; ours is 3.11. It gets its own
# virtualenv with Orchard in it; tests/integrations/test_harbor.py runs Harbor from there.
if [ ! -x .venv-harbor/bin/pip ]; then
  py312=$(ls -d "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/3.12*/bin/python 2>/dev/null | tail -1)
  py312=${py312:-$(command -v python3.12 || true)}
  [ -n "$py312" ] || { echo "setup: Harbor needs Python 3.12 (pyenv install 3.12)"; exit 1; }
  echo "setup: creating .venv-harbor with $py312"
  "$py312" -m venv --clear .venv-harbor
fi
if [ ! -f .venv-harbor/.installed ] || [ pyproject.toml -nt .venv-harbor/.installed ]; then
  echo "setup: installing harbor and orchard into .venv-harbor"
  .venv-harbor/bin/pip install -q -e '.[server]' 'harbor>=0.26'
  touch .venv-harbor/.installed
fi

# E2B's SDK (tests/e2b/) needs connectrpc >= 0.12, which verifiers' pin (< 0.12) keeps out
# of .venv: it gets its own virtualenv, and the tests run E2B scripts from there.
if [ ! -x .venv-e2b/bin/pip ]; then
  echo "setup: creating .venv-e2b"
  python3 -m venv --clear .venv-e2b
fi
if [ ! -f .venv-e2b/.installed ] || [ pyproject.toml -nt .venv-e2b/.installed ]; then
  echo "setup: installing the e2b SDKs into .venv-e2b"
  .venv-e2b/bin/pip install -q 'e2b==2.63.0' 'e2b-code-interpreter==2.11.5'
  touch .venv-e2b/.installed
fi
