"""Starting the real servers tests talk to: uvicorn in a thread, or a process on a socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn


@contextlib.contextmanager
def serve_uvicorn(
    app: Any, sockets: list[socket.socket] | None = None, **config: Any
) -> Iterator[uvicorn.Server]:
    """`app` under uvicorn in a daemon thread (on `sockets`, or as `config` says) until exit."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **config))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=sockets)), daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def wait_listening(
    proc: subprocess.Popen[bytes], sock: Path, what: str, timeout_s: float, poll_s: float = 0.01
) -> subprocess.Popen[bytes]:
    """`proc` once something accepts on the Unix socket `sock`; killed and failed otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not listen on {sock} (exit {proc.poll()})")
        time.sleep(poll_s)
