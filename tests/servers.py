"""Starting the real servers tests talk to: uvicorn in a thread, or a process on a socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


# What a registry answers for an image it does not have (the v2 API's error body).
MANIFEST_UNKNOWN = json.dumps(
    {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown", "detail": {}}]}
).encode()


@contextlib.contextmanager
def fake_registry(answer: bytes = MANIFEST_UNKNOWN) -> Iterator[str]:
    """A stand-in registry on 127.0.0.1 (none can be reached here): `/v2/` answers as the
    v2 API does, every other path 404 with `answer`. Yields its `host:port`."""

    class Registry(BaseHTTPRequestHandler):
        def _send(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v2":
                self._send(200, b"{}")
            else:
                self._send(404, answer)

        do_HEAD = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
