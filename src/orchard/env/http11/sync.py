"""Keep-alive HTTP/1.1 on blocking sockets: the sync SDK's transport.

httpx.Client spends a quarter of a short exec's round trip in Python (URL models, h11
events, two send() calls: headers, then body; figures in docs/benchmarks.md). This
pool needs one `sendall` for a small request and a buffered read of the answer's head
and body; uploads (sized or chunked) and streamed answers go through it too. A pooled
connection the server closed while idle is caught before use (readable while idle) or,
failing that, sent again once on a new connection when nothing can have been acted on
(`framing.may_retry`). `LeanTransport` puts it behind httpx's transport seam, so
`Orchard(transport=...)` and tests can swap it. Thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any
from urllib.parse import urlsplit

import httpx

import orchard.env.http11.framing as f
from orchard.env.http11.framing import Framing, Unanswered

log = logging.getLogger("orchard.http11")
# Below uvicorn's keep-alive timeout (5 s), so a pooled connection is not reused just as
# the server closes it.
IDLE_EXPIRY_S = 4.0
MAX_IDLE = 32
Body = bytes | Iterable[bytes] | None


class _Conn:
    __slots__ = ("file", "idle_since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.file: IO[bytes] = sock.makefile("rb")
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        """Not idle too long, and nothing to read: a readable idle socket means EOF (or junk)."""
        if now - self.idle_since >= IDLE_EXPIRY_S:
            return False
        poller = select.poll()  # not select(): no limit on the descriptor's number
        poller.register(self.sock, select.POLLIN)
        try:
            return not poller.poll(0)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(OSError):
            self.sock.close()


class Pool:
    """Keep-alive connections to one server over a Unix socket or plain TCP."""

    def __init__(self, *, uds: str | None = None, host: str = "localhost", port: int = 80) -> None:
        self.uds = uds
        self.host, self.port = host, port
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def send(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[str, str]],
        body: Body,
        timeout: httpx.Timeout,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        """Send one request whose `headers` frame its body; any answer comes back.

        A small sized answer is read whole; a larger one, or a chunked or close-delimited
        one, streams: its connection comes back to the pool once it was read to the end.
        """
        chunked = any(k.lower() == "transfer-encoding" for k, _ in headers)
        head = f.request_head(method, target, headers)
        idem = f.is_idempotent(method, idempotent)
        retried = False
        while True:
            conn, reused = self._acquire(timeout)
            try:
                status, fields, frame = self._exchange(conn, method, head, body, chunked, timeout)
                if f.streams(frame):
                    stream = _Stream(self, conn, frame)
                    return httpx.Response(status, headers=fields, stream=stream)
                content = _exactly(conn.file, frame.length) if frame.kind == "length" else b""
            except Unanswered as e:
                conn.close()
                if f.may_retry(e, reused=reused, retried=retried, idempotent=idem):
                    retried = True  # a stale pooled connection: once more, on a new one
                    continue
                raise f.as_httpx(e.cause, e.sent) from e.cause
            except httpx.TransportError:
                conn.close()
                raise
            except (OSError, ValueError) as e:
                conn.close()
                raise f.as_httpx(e, True) from e
            except BaseException:
                conn.close()
                raise
            self._release(conn, frame.keep_alive)
            return httpx.Response(status, headers=fields, content=content)

    def _acquire(self, t: httpx.Timeout) -> tuple[_Conn, bool]:
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise httpx.ConnectError("the client is closed")
            while self._idle:
                conn = self._idle.pop()
                if conn.usable(now):
                    return conn, True
                conn.close()
        sock = (
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if self.uds is not None
            else socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        )
        try:
            sock.settimeout(t.connect)
            if self.uds is not None:
                sock.connect(self.uds)
            else:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.connect((self.host, self.port))
        except TimeoutError as e:
            sock.close()
            raise httpx.ConnectTimeout(str(e) or "connect timed out") from e
        except OSError as e:
            sock.close()
            if self.uds is None and isinstance(e, socket.gaierror):
                raise httpx.ConnectError(f"cannot resolve {self.host}: {e}") from e
            raise httpx.ConnectError(str(e)) from e
        self.opened += 1
        log.debug("connection %d to %s opened", self.opened, self.uds or f"{self.host}:{self.port}")
        return _Conn(sock), False

    def _release(self, conn: _Conn, keep: bool) -> None:
        if keep:
            conn.idle_since = time.monotonic()
            with self._lock:
                if not self._closed and len(self._idle) < MAX_IDLE:
                    self._idle.append(conn)
                    return
        conn.close()

    def _exchange(
        self, conn: _Conn, method: str, head: bytes, body: Body, chunked: bool, t: httpx.Timeout
    ) -> tuple[int, f.RawFields, Framing]:
        sock, rfile = conn.sock, conn.file
        sent = started = False
        broken: OSError | None = None
        try:
            sock.settimeout(t.write)
            if body is None or isinstance(body, bytes):
                sock.sendall(head + body if body else head)
            else:
                sock.sendall(head)
                started = True
                for piece in body:
                    if piece:
                        sock.sendall(f.chunk(piece) if chunked else piece)
                if chunked:
                    sock.sendall(f.LAST_CHUNK)
            sent = True
        except TimeoutError as e:
            raise Unanswered(False, e, started) from e
        except OSError as e:
            broken = e  # the server may have answered early (a 413) and stopped reading
        try:
            sock.settimeout(t.read)
            block = _head(rfile)
            if not block:
                raise broken or ConnectionResetError("server closed the connection")
        except OSError as e:
            raise Unanswered(sent, broken or e, started) from e
        while True:
            version, status, fields = f.parse_head(block)
            if not 100 <= status < 200:
                break
            block = _head(rfile)  # 1xx: the real answer follows
        frame = f.framing(method, version, status, fields)
        if broken is not None:  # answered before the request was all sent: spent
            frame = frame._replace(keep_alive=False)
        return status, fields, frame


class _Stream(httpx.SyncByteStream):
    """A streamed answer's body; the connection goes back to the pool once read to the end."""

    def __init__(self, pool: Pool, conn: _Conn, frame: Framing) -> None:
        self._pool: Pool | None = pool
        self._conn = conn
        self._frame = frame

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from _pieces(self._conn.file, self._frame)
        except (OSError, ValueError) as e:
            self._give_back(False)
            raise f.as_httpx(e, True) from e
        except BaseException:
            self._give_back(False)
            raise
        self._give_back(True)

    def close(self) -> None:
        self._give_back(False)  # a no-op once read to the end

    def _give_back(self, complete: bool) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            if complete:
                pool._release(self._conn, self._frame.keep_alive)
            else:
                self._conn.close()


def _head(rfile: IO[bytes]) -> bytes:
    """An answer's head through its blank line (b"" if the server closed before it)."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = rfile.readline(f.MAX_HEAD + 1)
        size += len(line)
        if size > f.MAX_HEAD:
            raise httpx.RemoteProtocolError("answer head too large")
        if not line:
            if lines:
                raise httpx.RemoteProtocolError("answer cut off in its head")
            return b""
        lines.append(line)
        if line in (b"\r\n", b"\n") and len(lines) > 1:
            return b"".join(lines).replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")


def _exactly(rfile: IO[bytes], n: int) -> bytes:
    data = rfile.read(n)
    if len(data) != n:
        raise httpx.RemoteProtocolError(f"answer cut off after {len(data)} of {n} bytes")
    return data


def _pieces(rfile: Any, frame: Framing) -> Iterator[bytes]:
    """A streamed body as it arrives, in pieces of at most PIECE bytes."""
    if frame.kind == "length":
        left = frame.length
        while left:
            piece = rfile.read1(min(left, f.PIECE))
            if not piece:
                raise httpx.RemoteProtocolError(f"answer cut off with {left} bytes to come")
            left -= len(piece)
            yield piece
    elif frame.kind == "chunked":
        while size := f.chunk_size(rfile.readline(f.MAX_HEAD)):
            yield _exactly(rfile, size)
            f.chunk_end(rfile.read(2))
        while not f.trailer_done(rfile.readline(f.MAX_HEAD)):
            pass
    elif frame.kind == "close":
        while piece := rfile.read1(f.PIECE):
            yield piece


class LeanTransport(httpx.BaseTransport):
    """httpx's transport seam over a `Pool` (what `Orchard` sends through).

    Honours the request's `timeout` extension and `orchard.idempotent` (whether a request
    sent on a connection that died may be sent again; default: by method).
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    @classmethod
    def to(cls, base_url: str, uds: str | None = None) -> LeanTransport:
        """For a service at a plain http:// `base_url`, or on the Unix socket `uds`."""
        if uds is not None:
            return cls(Pool(uds=uds))
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"LeanTransport speaks plain http:// only, not {base_url!r}")
        return cls(Pool(host=parts.hostname, port=parts.port or 80))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body: Body = request.content
        except httpx.RequestNotRead:
            assert isinstance(request.stream, httpx.SyncByteStream)
            body = request.stream
        p = f.parts_of(request)
        response = self.pool.send(
            p.method,
            p.target,
            headers=p.headers,
            body=body,
            timeout=p.timeout,
            idempotent=p.idempotent,
        )
        response.request = request
        return response

    def close(self) -> None:
        self.pool.close()
