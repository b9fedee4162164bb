"""A loopback TCP door to one sandbox port of a Unix-socket service, for Playwright's node driver.

The embedded service (`Orchard()` with no URL) listens on a private Unix socket with auth
off; Playwright's driver is a node process that speaks only TCP. The relay listens on
127.0.0.1 (random port) and forwards bytes to the socket, but only for requests whose path
starts with a random secret prefix, followed by exactly one sandbox port's proxy prefix:
any other local user who finds the port gets nothing from the (unauthenticated) service.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from contextlib import suppress

log = logging.getLogger("orchard.gui.relay")

_MAX_HEAD = 64 * 1024
_IO_TIMEOUT_S = 30.0


class Relay:
    """Forward `ws://127.0.0.1:<port>/relay-<secret><allowed_prefix>...` to `uds`."""

    def __init__(self, uds: str, allowed_prefix: str) -> None:
        self._uds = uds
        self._secret_prefix = "/relay-" + secrets.token_urlsafe(24)
        self._allowed = allowed_prefix
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="orchard-relay", daemon=True)
        self._thread.start()

    def url(self, path: str, scheme: str = "ws") -> str:
        """The relay URL for `path` (a path under the allowed prefix, e.g. the CDP ws path)."""
        return f"{scheme}://127.0.0.1:{self.port}{self._secret_prefix}{path}"

    def close(self) -> None:
        self._closed.set()
        with suppress(OSError):
            self._listener.close()

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk or len(buf) + len(chunk) > _MAX_HEAD:
                return None
            buf += chunk
        return buf

    def _rewrite(self, head: bytes) -> bytes | None:
        """The request with the secret prefix stripped, or None when it is not allowed."""
        line, sep, rest = head.partition(b"\r\n")
        parts = line.split(b" ")
        if len(parts) != 3:
            return None
        try:
            target = parts[1].decode("ascii")
        except UnicodeDecodeError:
            return None
        if not target.startswith(self._secret_prefix + "/"):
            return None
        path = target[len(self._secret_prefix) :]
        # No dot segments or encoded slashes: the path must stay under the allowed prefix.
        if not path.startswith(self._allowed) or ".." in path or "%2f" in path.lower():
            return None
        return b" ".join([parts[0], path.encode("ascii"), parts[2]]) + sep + rest

    def _handle(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            conn.settimeout(_IO_TIMEOUT_S)
            head = self._read_head(conn)
            request = self._rewrite(head) if head is not None else None
            if request is None:
                log.warning("relay: refused a request outside the allowed path")
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self._uds)
            upstream.sendall(request)
            conn.settimeout(None)
            # Only the one request is checked, so only an upgrade may carry on: a refused
            # upgrade's answer is relayed and then both sides are closed (no keep-alive reuse).
            status = self._relay_status(upstream, conn)
            if status != 101:
                return
            back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
            back.start()
            _pump(conn, upstream)
            back.join()
        except OSError as e:
            log.debug("relay connection ended: %s", e)
        finally:
            for s in (conn, upstream):
                if s is not None:
                    with suppress(OSError):
                        s.close()

    @staticmethod
    def _relay_status(upstream: socket.socket, conn: socket.socket) -> int:
        """Relay the answer's head (and, for a non-upgrade, what follows); return its status."""
        upstream.settimeout(_IO_TIMEOUT_S)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = upstream.recv(4096)
            if not chunk:
                conn.sendall(buf)
                return 0
            buf += chunk
        conn.sendall(buf)
        parts = buf.split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status != 101:
            # The error body follows (small JSON); relay what arrives until a short pause.
            upstream.settimeout(0.5)
            with suppress(OSError):
                while chunk := upstream.recv(65536):
                    conn.sendall(chunk)
        upstream.settimeout(None)
        return status


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes until `src` closes, then half-close `dst` so the other side sees EOF."""
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
