"""Running the service: `serve` (the `orchard serve` command) and `EmbeddedService`.

`EmbeddedService` is what `Orchard()` with no URL starts: the whole service in a thread of
the caller's process, on a private Unix socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType

import uvicorn

from orchard.env.backends import Backend
from orchard.env.config import ConfigError, ServiceConfig
from orchard.env.errors import Unavailable
from orchard.env.server.app import create_app


def unix_socket(path: str) -> socket.socket:
    """Bind a Unix socket only its owner may use (uvicorn's own would be 0666)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(2048)
    return sock


# SIGTERM to exit: creates are cancelled at once, and what they made is removed; this bounds
# the wait for the remaining requests so the process is gone within 10 s.
GRACEFUL_SHUTDOWN_S = 6


class _Server(uvicorn.Server):
    """uvicorn's server, which also tells the service to stop admitting on SIGTERM/SIGINT."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        service = getattr(getattr(self.config.app, "state", None), "service", None)
        if service is not None:
            service.begin_shutdown()
        super().handle_exit(sig, frame)


def serve(
    config: ServiceConfig,
    host: str | None = "127.0.0.1",
    port: int = 8080,
    uds: str | None = None,
    *,
    log_level: str = "info",
    tls_cert: str | None = None,
    tls_key: str | None = None,
) -> None:
    """Run the service until interrupted (`orchard serve`); refuses unsafe binds first.

    `tls_cert`/`tls_key` (PEM files, both or neither): serve HTTPS, e.g. under the wildcard
    name of E2B's host routing (docs/e2b.md), with no front proxy."""
    config.check_bind(None if uds else host, uds)
    _check_tls(tls_cert, tls_key)
    app = create_app(config)
    _tune_gc()
    server = _Server(
        uvicorn.Config(
            app,
            host=host or "127.0.0.1",
            port=port,
            log_level=log_level,
            server_header=False,
            lifespan="on",  # a failed startup must stop the server, not serve without state
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
        )
    )
    if uds:
        server.run(sockets=[unix_socket(uds)])
    else:
        server.run()


def _check_tls(cert: str | None, key: str | None) -> None:
    """A TLS pair that loads, or none: a usage error, not uvicorn's traceback at start."""
    if (cert is None) != (key is None):
        raise ConfigError("TLS needs both a certificate and its key (--tls-cert, --tls-key)")
    if cert is None or key is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"--tls-cert/--tls-key do not load: {e}") from None


def _tune_gc() -> None:
    """Keep the cyclic collector off the objects that live as long as the service.

    Everything imported and built so far (FastAPI's routes, pydantic's validators: some
    hundred thousand objects) is moved out of the collector's generations, so its full
    passes no longer walk them, and the youngest generation is collected less often: a
    burst of creates allocates in bulk, and with the default threshold (700) the collector
    ran thousands of times a second (~10% of the service's CPU under the stress test)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


class EmbeddedService:
    """The service in a background thread on a private Unix socket (the SDK's no-URL mode).

    Auth is off unless `keep_api_keys` (the socket is 0600 in a 0700 temp folder); sandboxes
    it created are deleted on close only when asked, so scripts may leave work running.
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        backend: Backend | None = None,
        delete_on_close: bool = False,
        keep_api_keys: bool = False,
        log_level: str = "warning",
    ) -> None:
        base = config or ServiceConfig.from_env()
        self.config = base if keep_api_keys else replace(base, api_keys={})
        self.delete_on_close = delete_on_close
        self._dir = Path(tempfile.mkdtemp(prefix="orchard-"))
        self.socket_path = str(self._dir / "orchard.sock")
        self.base_url = "http://orchard"
        self.app = create_app(self.config, backend)
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                log_level=log_level,
                lifespan="on",
                server_header=False,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            )
        )
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> EmbeddedService:
        """Start serving on `socket_path`; returns self."""
        sock = unix_socket(self.socket_path)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name="orchard-embedded",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                err = self.app.state.startup_error
                self.stop()
                raise Unavailable(f"embedded Orchard service did not start: {err or 'timeout'}")
            time.sleep(0.005)
        return self

    def stop(self, delete_sandboxes: bool | None = None) -> None:
        """Stop serving; delete this instance's sandboxes if asked (here or at init)."""
        delete = self.delete_on_close if delete_sandboxes is None else delete_sandboxes
        self.app.state.delete_on_close = delete
        service = getattr(self.app.state, "service", None)
        if service is not None:
            service.begin_shutdown()  # creates in flight are undone, not waited for
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        shutil.rmtree(self._dir, ignore_errors=True)

    close = stop

    def __enter__(self) -> EmbeddedService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
