"""runc run from a sealed in-memory copy of itself, so no create pays for re-cloning runc.

Every `runc init` makes sure the binary it runs from cannot be overwritten from inside the
container (CVE-2019-5736): Debian's runc 1.1 bind-mounts /proc/self/exe read-only over a
temporary file in the host's mount namespace and re-executes itself from it (two mounts,
an unmount and a second exec with its dynamic loading, on every create), or copies itself
into a memfd. It skips all of that when /proc/self/exe already is a memfd sealed against
writes (runc's `is_self_cloned()`; "an admin could bind-mount a sealed memfd to
/usr/bin/runc to allow re-use"). So the backend copies runc once into such a memfd and
executes it through `/proc/<our pid>/fd/<n>`: the protection is the same (nothing can
write to a sealed memfd), the per-create work is gone. Where sealing is not available the
plain path is used and runc protects itself as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

log = logging.getLogger("orchard.local")

# runc's RUNC_MEMFD_SEALS: every seal but F_SEAL_FUTURE_WRITE.
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_copies: dict[str, int] = {}


def _sealed_fd(path: str) -> int:
    fd = os.memfd_create("runc", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        with open(path, "rb") as src:
            while chunk := src.read(1 << 20):
                os.write(fd, chunk)
        os.fchmod(fd, 0o500)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def sealed_runc(path: str) -> str:
    """An executable path to a sealed copy of the binary at `path`, or `path` itself.

    The copy is made once per process and binary; the path names our own descriptor, so
    it is valid in any child we start (whatever descriptors the child closes)."""
    fd = _copies.get(path)
    if fd is None:
        try:
            fd = _sealed_fd(path)
        except (OSError, AttributeError) as exc:  # no memfd/sealing here: runc clones itself
            log.info("runc runs from %s (no sealed copy: %s)", path, exc)
            return path
        _copies[path] = fd
    return f"/proc/{os.getpid()}/fd/{fd}"


def forget() -> None:
    """Close the copies (tests; a process that no longer starts runc)."""
    for fd in _copies.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _copies.clear()
