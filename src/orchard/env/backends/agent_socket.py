"""Pin the agent's Unix socket where the sandbox cannot swap it.

The agent creates its socket in a host folder that is bind-mounted, writable,
into the sandbox. Root inside the sandbox could replace that socket with a
symlink to any socket on the host (say, the Docker API), and the service would
then connect there. So, once the agent's socket appears, the backend hard-links
it into the sandbox's private host folder (never mounted into the sandbox) and
checks that the link is a socket; the service only ever connects to that link.
A hard link made and checked in a folder the sandbox cannot reach cannot be
changed afterwards, so the check has no race.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from pathlib import Path


def pin(shared: Path, pinned: Path) -> bool:
    """Link `shared` to `pinned` if it is a real socket; True once `pinned` is one."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(pinned).st_mode):
            return True
        os.unlink(pinned)  # a leftover that is not a socket
    try:
        if not stat.S_ISSOCK(os.lstat(shared).st_mode):
            return False  # not there yet, or a symlink/file planted by the sandbox
        os.link(shared, pinned, follow_symlinks=False)
    except (FileNotFoundError, FileExistsError):
        return False
    if stat.S_ISSOCK(os.lstat(pinned).st_mode):
        return True
    os.unlink(pinned)  # swapped between the check and the link: refuse it
    return False


def repin(box: Path) -> None:
    """Pin a running sandbox's socket if its create was cut short before pinning (adoption)."""
    with contextlib.suppress(OSError):
        pin(box / "run" / "agent.sock", box / "agent.sock")


async def wait_and_pin(shared: Path, pinned: Path, timeout_s: float = 10.0) -> bool:
    """Poll (fast at first) until the agent's socket can be pinned, or give up."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while not pin(shared, pinned):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
