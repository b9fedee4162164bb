"""What a caller is told when the engine, runc, skopeo or a registry fails.

Their raw text carries the host's internals (runc's cgroup paths, state folders, the
addresses a registry pull dialled, whatever a port answered), so it goes to the service
log only; the caller gets the stable code of the failure and a generic message. Engine
answers to a bad request (4xx: "Minimum memory limit allowed is 6MB") are passed on
unless they mention any of those internals.
"""

from __future__ import annotations

import logging

from orchard.env.errors import OrchardError

# Lower-case markers of text that describes the host rather than the request.
_INTERNAL = (
    "oci runtime",
    "runc",
    "crun",
    "runtime create failed",
    "container_linux.go",
    "process_linux.go",
    "cgroup",
    "/sys/",
    "/proc/",
    "/var/lib/",
    "/run/",
    "/tmp/",
    "dial tcp",
    "dial unix",
    "connection refused",
    "lookup ",
    "http://",
    "https://",
)
SEE_LOG = "details are in the service log"


def public_text(raw: str) -> str | None:
    """`raw` if it says nothing about the host, else None."""
    low = raw.lower()
    return None if any(m in low for m in _INTERNAL) else raw


def hidden(cls: type[OrchardError], message: str, raw: str, log: logging.Logger) -> OrchardError:
    """`cls(message)` for the caller; `raw` is logged (at warning) beside the same message."""
    log.warning("%s: %s", message, raw.strip()[:4000])
    return cls(f"{message} ({SEE_LOG})")
