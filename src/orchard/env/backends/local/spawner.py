"""A small helper process that forks the runtime's children that need a set-up first.

A create whose rootfs must be mounted before the runtime starts (crun, or a disk limit:
mount_ns.Prestart) needs a forked child that unshares a mount namespace and mounts there
before it execs. Forking the service for it (Popen's `preexec_fn`) copies the page
tables of a process that holds a thousand sandboxes' state (~100 MiB) and leaves it a
copy-on-write fault per page it writes afterwards, and Popen blocks the event loop until
the child has exec'd (figures: docs/benchmarks.md). So the backend
keeps one spawner: this file run as a script (`python -I -S spawner.py FD`: isolated, so
neither this folder nor the environment can shadow a module; stdlib and mount_ns only,
~10 MiB), which forks itself per request instead.

Requests and answers are JSON datagrams on a SOCK_SEQPACKET socketpair that only the
service holds; each request carries the child's stdout/stderr as a passed descriptor
(SCM_RIGHTS), so nothing is opened by name on its behalf:

- `{"id": n, "argv": [...], "prestart": {...}}` + fd: fork, set up, exec; later
  `{"id": n, "rc": status}` (a signal `s` is 128 + s) once the child has ended, or
  `{"id": n, "error": "..."}` when the fork failed.
- `{"kill": n}`: SIGKILL that child (the caller's timeout or cancellation).

The runtime's detached container init is re-parented past the spawner to the service
(a child subreaper), exactly as when the service starts the runtime itself. The spawner
exits once the service closes its end (or dies) and its last child has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard.env.backends.local.mount_ns import Prestart

MAX_MESSAGE = 1 << 16


class SpawnerGone(RuntimeError):
    """The spawner process ended (or could not start) with requests in flight."""


class Spawner:
    """The service's end: started on first use, one per backend, closed with it."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._next = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        if self._sock is not None and self._loop is loop:
            return self._sock
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            argv = [sys.executable, "-I", "-S", __file__, str(theirs.fileno())]
            self._proc = subprocess.Popen(
                argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, close_fds=True
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), self._on_answer)
        self._sock, self._loop = ours, loop
        return ours

    def _on_answer(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the spawner ended: whatever was in flight failed with it
                self._fail_all("the spawner process ended")
                self.close()
                return
            msg = json.loads(data)
            fut = self._waiting.pop(int(msg["id"]), None)
            if fut is None or fut.done():
                continue
            if "error" in msg:
                fut.set_exception(OSError(msg["error"]))
            else:
                fut.set_result(int(msg["rc"]))

    def _fail_all(self, why: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(SpawnerGone(why))

    def _send(self, msg: dict[str, Any], fds: Sequence[int] = ()) -> None:
        sock = self._start()
        data = json.dumps(msg).encode()
        if len(data) > MAX_MESSAGE:
            raise ValueError(f"spawner request of {len(data)} bytes")
        # Datagrams of ~1 KiB with at most a few dozen in flight: the socket's buffer
        # (~200 KiB) does not fill, so a non-blocking send does not refuse one.
        socket.send_fds(sock, [data], list(fds))

    async def run(self, argv: Sequence[str], out_fd: int, prestart: Prestart) -> int:
        """Fork, set up and exec `argv` with stdout and stderr on `out_fd`; its exit status.

        Cancelled (the caller's timeout), the child is killed before this returns."""
        self._start()  # first: a (re)start fails whatever is waiting, so not this request
        self._next += 1
        rid = self._next
        fut = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            self._send({"id": rid, "argv": list(argv), "prestart": prestart.to_wire()}, [out_fd])
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError, SpawnerGone, TimeoutError):
                self._send({"kill": rid})
                async with asyncio.timeout(5):
                    await fut
            raise
        finally:
            self._waiting.pop(rid, None)

    def close(self) -> None:
        """Close our end and wait for the spawner to exit (once its last child ended)."""
        self.detach()
        self.reap()

    def detach(self) -> None:
        """Close our end (in the loop's thread); in-flight requests fail."""
        if self._sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        self._fail_all("the spawner was closed")

    def reap(self) -> None:
        """Wait for the detached spawner to exit (blocking: from a thread in a loop)."""
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


# ------------------------------------------------------------ the spawner process


def _child(argv: list[str], out_fd: int, prestart: Prestart) -> None:
    """In the forked child: stdio, the set-up, exec. Never returns."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.closerange(3, 1 << 20)  # close_range(2): the socket and others' descriptors
        # What Popen's restore_signals does: Python ignores SIGPIPE and SIGXFSZ, and an
        # ignored signal stays ignored across exec (into crun and the sandbox's init).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        prestart()  # writes its failure to fd 2 and exits MOUNT_FAILED itself
        os.execv(argv[0], argv)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            os.write(2, f"orchard: spawn {argv[:1]}: {exc}\n".encode())
    os._exit(127)


def serve(sock: socket.socket, prestart_type: Any) -> None:
    """Answer requests until the service closes its end and every child has ended."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    children: dict[int, tuple[int, int]] = {}  # request id -> (pid, pidfd)
    open_ = True
    while open_ or children:
        for key, _ in sel.select():
            if key.fileobj is not sock:
                rid = key.data
                pid, pidfd = children.pop(rid)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                rc = os.waitstatus_to_exitcode(status)
                with contextlib.suppress(OSError):
                    sock.send(json.dumps({"id": rid, "rc": rc if rc >= 0 else 128 - rc}).encode())
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except OSError:
                data, fds = b"", []
            if not data:
                open_ = False
                sel.unregister(sock)
                for fd in fds:
                    os.close(fd)
                continue
            msg = json.loads(data)
            if "kill" in msg:
                if (child := children.get(int(msg["kill"]))) is not None:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(child[1], signal.SIGKILL)
                for fd in fds:
                    os.close(fd)
                continue
            rid = int(msg["id"])
            try:
                pid = os.fork()
                if pid == 0:
                    _child(msg["argv"], fds[0], prestart_type.from_wire(msg["prestart"]))
                pidfd = os.pidfd_open(pid)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    sock.send(json.dumps({"id": rid, "error": str(exc)}).encode())
                continue
            finally:
                for fd in fds:
                    os.close(fd)
            children[rid] = (pid, pidfd)
            sel.register(pidfd, selectors.EVENT_READ, rid)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[1]))
    os.set_inheritable(sock.fileno(), False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service's Ctrl-C is the service's
    # mount_ns by its path, stdlib only: the package (pydantic, httpx, ~35 MiB) is not
    # imported in here.
    spec = importlib.util.spec_from_file_location(
        "mount_ns", Path(__file__).with_name("mount_ns.py")
    )
    assert spec is not None and spec.loader is not None
    mount_ns = importlib.util.module_from_spec(spec)
    sys.modules["mount_ns"] = mount_ns  # its dataclasses look their module up
    spec.loader.exec_module(mount_ns)
    serve(sock, mount_ns.Prestart)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
