"""The async client's lean transport: keep-alive HTTP/1.1 over asyncio streams.

httpx.AsyncClient spends more Python per request than a ~2 ms exec can afford (URL models,
h11 events, anyio). This is the asyncio twin of `_sdk_http.LeanHTTP`, sharing its framing
functions, and it carries every call: JSON bodies, uploads (sized, or chunked from a
blocking iterator read in a worker thread) and streamed answers (exec_stream, follow,
downloads) whose connection goes back to the pool once read to the end, or is closed if
abandoned midway. A semaphore bounds the open connections; TLS for https URLs.

Failures are raised as the httpx exceptions the SDK's retry policy reasons about, and a
pooled connection the server closed while idle is retried once on a new one when nothing
can have been acted on (the request was not fully sent, or the call is idempotent).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpx

from orchard.env._sdk_core import CHUNK, Call, Target, coalesce
from orchard.env._sdk_http import (
    _PROXY_VARS,
    IDLE_EXPIRY_S,
    MAX_IDLE,
    MAX_LINE,
    Framing,
    Unanswered,
    as_httpx,
    chunk_size,
    encode_request,
    fixed_headers,
    framing,
    header_line,
    request_head,
    status_line,
)

# httpx's default connection limit, so switching transports does not change concurrency.
MAX_CONNECTIONS = 100
Body = bytes | Iterable[bytes] | None


class _Conn:
    __slots__ = ("idle_since", "loop", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.loop = asyncio.get_running_loop()

    def usable(self, now: float) -> bool:
        """Not idle too long, not closed by the server (its EOF seen), and on this loop.

        A script may drive one client from successive `asyncio.run` calls; a connection
        made on an earlier (closed) loop cannot be used on this one.
        """
        return (
            self.loop is asyncio.get_running_loop()
            and now - self.idle_since < IDLE_EXPIRY_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        if not self.loop.is_closed():
            self.writer.close()


def async_lean_transport(target: Target, headers: dict[str, str]) -> AsyncLeanHTTP | None:
    """The lean transport for this target, or None where httpx must stay (proxies)."""
    if target.uds is None and any(os.environ.get(v) for v in _PROXY_VARS):
        return None  # httpx honours the proxy settings; this transport does not
    return AsyncLeanHTTP(target, headers)


class AsyncLeanHTTP:
    """A pool of at most `max_connections` keep-alive connections to one service."""

    def __init__(
        self, target: Target, headers: dict[str, str], max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self.uds = target.uds
        parts = urlsplit(target.base_url)
        https = target.uds is None and parts.scheme == "https"
        self.tls = ssl.create_default_context() if https else None
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if https else 80)
        self.prefix = parts.path.rstrip("/")
        self._fixed = fixed_headers(parts.netloc, headers)
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False
        self.opened = 0  # connections opened so far (observable reuse)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------ one call

    async def request(
        self, call: Call[Any], timeout: httpx.Timeout, *, stream: bool = False
    ) -> httpx.Response:
        """Send `call`; the answer is read whole unless `stream` (then aclose() it)."""
        t = call.timeout(timeout)
        retried = False
        while True:
            body = call.body() if call.body else None  # once per attempt: a fresh source
            head = self._head(call, body)  # a bad argument (NaN in JSON) fails as itself, here
            conn, reused = await self._checkout(t)
            try:
                status, fields, (kind, length, keep) = await self._exchange(
                    conn, call.method, head, body, t
                )
                chunks = _body(conn.reader, kind, length, t.read)
                if stream:
                    held = _Held(self, conn, keep)
                    return httpx.Response(status, headers=fields, stream=_Stream(chunks, held))
                content = b"".join([c async for c in chunks])
            except Unanswered as e:
                self._checkin(conn, False)
                stale = reused and not retried and not isinstance(e.cause, TimeoutError)
                if stale and (call.idempotent or not e.sent):
                    retried = True  # a stale pooled connection: once more, on a new one
                    continue
                raise as_httpx(e.cause, e.sent) from e.cause
            except httpx.TransportError:
                self._checkin(conn, False)
                raise
            except (OSError, ValueError, EOFError) as e:
                self._checkin(conn, False)
                raise _protocol(e) from e
            except BaseException:  # cancelled: the answer is unread, so the connection is spent
                self._checkin(conn, False)
                raise
            self._checkin(conn, keep)
            return httpx.Response(status, headers=fields, content=content)

    async def _exchange(
        self, conn: _Conn, method: str, head: bytes, body: Body, t: httpx.Timeout
    ) -> tuple[int, list[tuple[str, str]], Framing]:
        sent = False
        try:
            async with asyncio.timeout(t.write):
                await _send(conn.writer, head, body)
            sent = True
            async with asyncio.timeout(t.read):
                line = await conn.reader.readline()
                if not line:
                    raise ConnectionResetError("server closed the connection")
                while True:
                    version, status = status_line(line)
                    fields = await _fields(conn.reader)
                    if not 100 <= status < 200:
                        break
                    line = await conn.reader.readline()  # 1xx: the real answer follows
        except (OSError, EOFError) as e:
            raise Unanswered(sent, e) from e
        return status, fields, framing(method, version, status, fields)

    def _head(self, call: Call[Any], body: Body) -> bytes:
        """The request up to its body: whole for JSON, sized for bytes, chunked for a stream."""
        if body is None:
            return encode_request(self.prefix, self._fixed, call)
        head = request_head(self.prefix, self._fixed, call)
        if isinstance(body, bytes):
            return f"{head}Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
        if call.length is not None:  # a regular file: sized, so no hop re-frames it
            return f"{head}Content-Length: {call.length}\r\n\r\n".encode("latin-1")
        return f"{head}Transfer-Encoding: chunked\r\n\r\n".encode("latin-1")

    # ------------------------------------------------------------ the pool

    async def _checkout(self, t: httpx.Timeout) -> tuple[_Conn, bool]:
        if self._closed:
            raise httpx.ConnectError("the client is closed")
        if self._slots.locked():
            try:
                async with asyncio.timeout(t.pool):
                    await self._slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection in the pool") from None
        else:
            await self._slots.acquire()  # free: returns without suspending
        try:
            now = time.monotonic()
            while self._idle:
                conn = self._idle.pop()
                if conn.usable(now):
                    return conn, True
                conn.close()
            return await self._connect(t), False
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self, t: httpx.Timeout) -> _Conn:
        try:
            async with asyncio.timeout(t.connect):
                if self.uds is not None:
                    pair = await asyncio.open_unix_connection(self.uds, limit=MAX_LINE)
                else:  # asyncio sets TCP_NODELAY on TCP sockets
                    pair = await asyncio.open_connection(
                        self.host, self.port, ssl=self.tls, limit=MAX_LINE
                    )
        except TimeoutError as e:
            raise httpx.ConnectTimeout("connect timed out") from e
        except OSError as e:
            raise httpx.ConnectError(str(e) or repr(e)) from e
        self.opened += 1
        return _Conn(*pair)

    def _checkin(self, conn: _Conn, keep: bool) -> None:
        """Give the connection's slot back; keep the connection for reuse if it is clean."""
        if keep and not self._closed and len(self._idle) < MAX_IDLE:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()


class _Held:
    """A streamed answer's claim on its connection, given back exactly once."""

    def __init__(self, pool: AsyncLeanHTTP, conn: _Conn, keep: bool) -> None:
        self.pool: AsyncLeanHTTP | None = pool
        self.conn = conn
        self.keep = keep

    def release(self, complete: bool) -> None:
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool._checkin(self.conn, complete and self.keep)


class _Stream(httpx.AsyncByteStream):
    """A streamed answer's body; the connection is reusable only if it was read to the end."""

    def __init__(self, chunks: AsyncGenerator[bytes, None], held: _Held) -> None:
        self._chunks = chunks
        self._held = held

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                yield chunk
        except (OSError, ValueError, EOFError) as e:
            self._held.release(False)
            raise _protocol(e) from e
        except BaseException:
            self._held.release(False)
            raise
        self._held.release(True)

    async def aclose(self) -> None:
        self._held.release(False)  # a no-op once read to the end
        with contextlib.suppress(RuntimeError):
            await self._chunks.aclose()


async def _send(writer: asyncio.StreamWriter, head: bytes, body: Body) -> None:
    if body is None or isinstance(body, bytes):
        writer.write(head + body if body else head)
    else:
        writer.write(head)
        chunked = head.endswith(b"Transfer-Encoding: chunked\r\n\r\n")
        # A blocking, disk-backed source: each read in a worker thread, coalesced.
        it = coalesce(body)
        while (chunk := await asyncio.to_thread(next, it, None)) is not None:
            writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _fields(reader: asyncio.StreamReader) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    size = 0
    while True:
        line = await reader.readline()
        size += len(line)
        if size > MAX_LINE:
            raise httpx.RemoteProtocolError("header block too large")
        if (field := header_line(line)) is None:
            return fields
        fields.append(field)


async def _body(
    reader: asyncio.StreamReader, kind: str, length: int, read_s: float | None
) -> AsyncGenerator[bytes, None]:
    """The answer's body as it arrives; each read may take up to `read_s` (as httpx's read)."""
    if kind == "length":
        left = length
        while left:
            async with asyncio.timeout(read_s):
                chunk = await reader.read(min(left, CHUNK))
            if not chunk:
                raise httpx.RemoteProtocolError(f"answer cut off {left} bytes short")
            left -= len(chunk)
            yield chunk
    elif kind == "chunked":
        while True:
            async with asyncio.timeout(read_s):  # never across a yield: it would hit the caller
                if not (size := chunk_size(await reader.readline())):
                    while (line := await reader.readline()) not in (b"\r\n", b"\n"):
                        if not line:
                            raise httpx.RemoteProtocolError("answer cut off in its trailer")
                    return
                chunk = await reader.readexactly(size)
                if await reader.readexactly(2) != b"\r\n":
                    raise httpx.RemoteProtocolError("chunk not followed by CRLF")
            yield chunk
    elif kind == "close":
        while True:
            async with asyncio.timeout(read_s):
                chunk = await reader.read(CHUNK)
            if not chunk:
                break
            yield chunk


def _protocol(exc: Exception) -> httpx.TransportError:
    """A failure while reading an answer that has begun, as httpx names it."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return httpx.RemoteProtocolError(f"answer cut off: {exc!r}")
    if isinstance(exc, ValueError):  # a line over the reader's limit
        return httpx.RemoteProtocolError(f"line too long: {exc}")
    return as_httpx(exc, True)
