"""Which backend `auto` means on this host: docker when an engine answers, else local (runc).

The local backend needs root (mounts, cgroups, namespaces) and runc on PATH; Docker needs
nothing but an engine. An explicit choice (`--backend`, ORCHARD_BACKEND) always wins.
"""

from __future__ import annotations

import os
import shutil
import socket
from urllib.parse import urlparse

from orchard.env.backends.runtimes import RUNTIMES

DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"


def docker_answers(timeout_s: float = 2.0) -> bool:
    """True if a Docker engine (DOCKER_HOST, else the default socket) answers /_ping."""
    host = os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_DOCKER_SOCKET}"
    url = urlparse(host)
    try:
        if url.scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout_s)
            sock.connect(url.path)
        elif url.scheme in ("tcp", "http", "https"):
            # A TLS engine cannot be pinged in plain HTTP: an open port is the best cheap sign.
            sock = socket.create_connection((url.hostname or "", url.port or 2375), timeout_s)
            if url.scheme == "https" or os.environ.get("DOCKER_TLS_VERIFY"):
                sock.close()
                return True
        else:
            return False
    except OSError:
        return False
    with sock:
        try:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = sock.recv(64)
        except OSError:
            return False
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply


def local_possible() -> bool:
    """The local backend can run here: root, and an OCI runtime (crun or runc) on PATH."""
    return os.geteuid() == 0 and any(shutil.which(rt) for rt in RUNTIMES)


def auto_backend() -> str:
    """`docker` when an engine answers, else `local` when possible, else `docker` (whose
    start-up error then says that no engine answers)."""
    if docker_answers():
        return "docker"
    if local_possible():
        return "local"
    return "docker"
