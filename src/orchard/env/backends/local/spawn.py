"""Start a short helper process (runc) from the event loop without forking the service.

`asyncio.create_subprocess_exec` under uvloop (which `orchard serve` uses) spawns through
libuv, and libuv forks: the kernel copies the service's page tables (hundreds of MiB
with a thousand sandboxes) for every runc call, and the service then takes a
copy-on-write fault on each page it writes. `subprocess.Popen` without `preexec_fn`
vforks instead (the child borrows our memory until it execs). The end of the child is
seen through a pidfd on the loop, so no thread waits for it, and its output goes to a
file (the sandbox's log) or a memfd read once it has exited, so no pipe can fill up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchard.env.backends.local.mount_ns import Prestart
from orchard.env.backends.local.spawner import Spawner, SpawnerGone
from orchard.env.errors import Unavailable

# Children that `run` is waiting for (its Popen reaps them): never a stray.
_waiting: set[int] = set()


SCAN_EVERY_S = 5.0  # the fallback's full scan of our children, at most this often
_last_scan = 0.0


def reap_strays(names: frozenset[str]) -> int:
    """Reap exited children of ours that nobody waits for; how many.

    `crun run --detach` forks an intermediate process that starts the container's init and
    exits after crun itself, so the kernel re-parents it to us (a child subreaper) and it
    stays a zombie, holding a pid and its CPU times, until reaped. Only zombies whose
    name is one of `names` (the runtime's) and that `run` is not waiting for are reaped,
    so no other waiter (Popen, the event loop's child watcher, a sandbox's pidfd) loses
    an exit status. waitid(WNOWAIT) peeks at the oldest zombie, cheaply; when that one is
    not a stray (its waiter is about to reap it, or an orphan of something else nobody
    reaps) the strays behind it are found by a scan of our children instead, at most every
    SCAN_EVERY_S, so one zombie that is never reaped cannot make them pile up."""
    reaped = 0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None:
            return reaped
        if info.si_pid in _waiting or _name(info.si_pid) not in names:
            return reaped + _scan(names)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
            reaped += 1


def _name(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def _children() -> set[int]:
    """Our children, from each thread's list (an orphan comes to whichever thread)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


def _scan(names: frozenset[str]) -> int:
    """Reap the runtime's zombies among all our children (rate-limited: see reap_strays)."""
    global _last_scan
    now = time.monotonic()
    if now - _last_scan < SCAN_EVERY_S:
        return 0
    _last_scan = now
    reaped = 0
    for pid in _children() - _waiting:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if state == "Z" and name in names:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped += 1
    return reaped


async def _exited(pidfd: int) -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def fired() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, fired)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)


async def run(
    argv: Sequence[str],
    *,
    what: str,
    timeout_s: float,
    log_path: Path | None = None,
    preexec: Callable[[], None] | None = None,
    spawner: Spawner | None = None,
) -> tuple[int, str]:
    """Run `argv` to its end: (exit status, its output, or "" when it went to `log_path`).

    `preexec` (a forked child's set-up) makes Popen fork rather than vfork: only for the
    callers that need it. A rootfs set-up (mount_ns.Prestart) goes to `spawner` instead,
    which forks its own small process for it (spawner.py)."""
    if log_path is not None:
        out_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    else:
        out_fd = os.memfd_create("runc-out", os.MFD_CLOEXEC)
    try:
        if spawner is not None and isinstance(preexec, Prestart):
            rc = await _through(spawner, argv, out_fd, preexec, what, timeout_s)
            return rc, "" if log_path is not None else _read(out_fd)
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=out_fd, preexec_fn=preexec
        )
        _waiting.add(proc.pid)
        pidfd = os.pidfd_open(proc.pid)
        try:
            try:
                try:
                    async with asyncio.timeout(timeout_s):
                        await _exited(pidfd)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    proc.wait()
                    raise Unavailable(f"{what} took over {timeout_s:.0f} s") from None
                except BaseException:  # cancelled: do not leave it running unreaped
                    with contextlib.suppress(ProcessLookupError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    proc.wait()
                    raise
            finally:
                os.close(pidfd)
            rc = proc.wait()
        finally:
            _waiting.discard(proc.pid)
        return rc, "" if log_path is not None else _read(out_fd)
    finally:
        os.close(out_fd)


def _read(memfd: int) -> str:
    os.lseek(memfd, 0, os.SEEK_SET)
    return os.read(memfd, 1 << 16).decode(errors="replace").strip()


async def _through(
    spawner: Spawner,
    argv: Sequence[str],
    out_fd: int,
    prestart: Prestart,
    what: str,
    timeout_s: float,
) -> int:
    try:
        async with asyncio.timeout(timeout_s):
            return await spawner.run(argv, out_fd, prestart)
    except TimeoutError:
        raise Unavailable(f"{what} took over {timeout_s:.0f} s") from None
    except (SpawnerGone, OSError) as exc:
        raise Unavailable(f"{what} could not be started: {exc}") from None
