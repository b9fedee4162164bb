"""Pin the agent's Unix socket where the sandbox cannot swap it.

The agent creates its socket in a host folder that is bind-mounted, writable,
into the sandbox. Root inside the sandbox could replace that socket with a
symlink to any socket on the host (say, the Docker API), and the service would
then connect there. So, once the agent's socket appears, the backend hard-links
it into the sandbox's private host folder (never mounted into the sandbox) and
checks that the link is a socket; the service only ever connects to that link.
A hard link made and checked in a folder the sandbox cannot reach cannot be
changed afterwards, so the check has no race.

The folders the sandboxes write in are on one small tmpfs per state dir (`<state>/
sockets`, TMPFS_BYTES, mounted on first use, unmounted by `release_tmpfs` once empty),
never on the state dir's disk: a socket needs no data block, so a sandbox can put no more
than that there, however it writes, and the pinned link sits beside its folder on the
same tmpfs (a hard link cannot cross filesystems). A filled tmpfs stops no agent (its
socket takes an inode, no page); inodes are unlimited and each is charged to the memory
of the sandbox that made it. One mount, not one per sandbox: the local backend's runtime
copies the host's mount table into every sandbox it makes (mount_ns.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from orchard.env.backends.failures import hidden
from orchard.env.backends.local.mount_ns import mount
from orchard.env.errors import Unavailable

log = logging.getLogger("orchard.agent_socket")

SOCKETS_DIR = "sockets"  # in the state dir: the tmpfs of the sandboxes' socket folders
TMPFS_BYTES = 256 << 10
_TMPFS_MAGIC = 0x01021994
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _fs_type(path: Path) -> int | None:
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type (a long) comes first
    if _libc.statfs(str(path).encode(), buf):
        return None
    return int.from_bytes(buf.raw[: ctypes.sizeof(ctypes.c_long)], sys.byteorder, signed=True)


def tmpfs_device(root: Path) -> int | None:
    """The device number of the tmpfs mounted at `root`, or None when there is none."""
    try:
        st, up = os.stat(root), os.stat(root.parent)
    except OSError:
        return None
    if st.st_dev == up.st_dev or _fs_type(root) != _TMPFS_MAGIC:
        return None
    return st.st_dev


@contextlib.contextmanager
def locked(root: Path) -> Iterator[None]:
    """Held to mount the tmpfs, to add a folder to it and to unmount it: services over
    one state dir never mount it twice, nor unmount it under another's new folder."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.with_name(root.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def mount_tmpfs(root: Path) -> int | None:
    """The device of the sockets tmpfs at `root`, mounted first if there is none (call it
    `locked`). None when this process may not mount (not root: rootless Docker): the
    folders are then on the state dir's disk, unbounded, as the caller warns, unless the
    operator mounts one there."""
    root.mkdir(mode=0o700, exist_ok=True)
    dev = tmpfs_device(root)
    if dev is None:
        options = f"size={TMPFS_BYTES},nr_inodes=0,mode=0700"
        try:
            mount("tmpfs", root, "tmpfs", options, _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except PermissionError:
            return None
        except OSError as exc:
            raise hidden(
                Unavailable, "cannot make the agents' socket folder", str(exc), log
            ) from exc
        dev = tmpfs_device(root)
        if dev is None:
            raise hidden(Unavailable, "cannot make the agents' socket folder", str(root), log)
    return dev


def release_tmpfs(root: Path) -> None:
    """Unmount the sockets tmpfs once no sandbox has a folder on it (a backend's close)."""
    with contextlib.suppress(OSError), locked(root):
        if tmpfs_device(root) is None or any(root.iterdir()):
            return
        # Detached: a sandbox's namespace that is still going away may hold it a moment.
        if _libc.umount2(str(root).encode(), _MNT_DETACH) == 0:
            root.rmdir()


def pin(shared: Path, pinned: Path, dev: int | None = None) -> bool:
    """Link `shared` to `pinned` if it is a real socket (on device `dev`, if given);
    True once `pinned` is one."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(pinned)
        if stat.S_ISSOCK(st.st_mode) and dev in (None, st.st_dev):
            return True
        os.unlink(pinned)  # a leftover that is not a socket
    try:
        st = os.lstat(shared)
        if not stat.S_ISSOCK(st.st_mode) or dev not in (None, st.st_dev):
            return False  # not there yet, a symlink/file planted by the sandbox, or the
            # tmpfs is gone (unmounted under the folder the runtime then made on disk)
        os.link(shared, pinned, follow_symlinks=False)
    except (FileNotFoundError, FileExistsError):
        return False
    if stat.S_ISSOCK(os.lstat(pinned).st_mode):
        return True
    os.unlink(pinned)  # swapped between the check and the link: refuse it
    return False


def repin(shared: Path, pinned: Path, dev: int | None = None) -> None:
    """Pin a running sandbox's socket if its create was cut short before pinning (adoption)."""
    with contextlib.suppress(OSError):
        pin(shared, pinned, dev)


async def wait_and_pin(
    shared: Path, pinned: Path, dev: int | None = None, timeout_s: float = 10.0
) -> bool:
    """Poll (fast at first) until the agent's socket can be pinned, or give up."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while not pin(shared, pinned, dev):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return True
