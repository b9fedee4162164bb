"""Keep-alive HTTP/1.1 on asyncio streams: the async SDK's transport and the service -> agent hop.

httpx.AsyncClient spends more Python per request than a short exec can afford (URL models,
h11 events, anyio); this pool speaks just enough HTTP/1.1 over a Unix socket or TCP (TLS
for https). `AsyncPool.send` carries any request (a buffered body, or an async stream,
sized or chunked) and returns an `httpx.Response`, read whole or streamed; a streamed
answer's connection goes back to the pool once read to the end, or is closed if
abandoned midway. A semaphore bounds the open connections. `AsyncLeanTransport` puts it
behind httpx's transport seam, so `AsyncOrchard(transport=...)` and tests can swap it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Sequence
from typing import Any, Required, TypedDict, Unpack
from urllib.parse import urlsplit

import httpx

import orchard.env.http11.framing as f
from orchard.env.http11.framing import Framing, Unanswered

log = logging.getLogger("orchard.http11")
# httpx's default connection limit, so switching transports does not change concurrency.
MAX_CONNECTIONS = 100
MAX_IDLE = 32
Body = bytes | AsyncIterable[bytes] | None
Timeouts = httpx.Timeout


class Request(TypedDict, total=False):
    """What a request carries besides its method and target (see `AsyncPool.send`)."""

    headers: Sequence[tuple[str, str]]
    body: Body
    length: int | None
    framed: bool
    timeout: Required[Timeouts]
    idempotent: bool | None


class _Conn:
    __slots__ = ("idle_since", "loop", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.loop = asyncio.get_running_loop()

    def usable(self, now: float, expiry_s: float) -> bool:
        """Not idle too long, not closed by the server (its EOF seen), and on this loop.

        A script may drive one client from successive `asyncio.run` calls; a connection
        made on an earlier (closed) loop cannot be used on this one.
        """
        return (
            self.loop is asyncio.get_running_loop()
            and now - self.idle_since < expiry_s
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        if not self.loop.is_closed():
            self.writer.close()


class AsyncPool:
    """At most `max_connections` keep-alive connections to one server.

    `headers` go on every request (e.g. Host and a token). `idle_expiry_s` keeps a pooled
    connection from being reused just as the server closes it for idling.
    """

    def __init__(
        self,
        *,
        uds: str | None = None,
        host: str = "localhost",
        port: int = 80,
        tls: ssl.SSLContext | None = None,
        headers: Sequence[tuple[str, str]] = (),
        max_connections: int = MAX_CONNECTIONS,
        idle_expiry_s: float = 4.0,
    ) -> None:
        self.uds = uds
        self.host, self.port, self.tls = host, port, tls
        self.where = uds or f"{host}:{port}"
        self.fixed = f.header_lines(headers)  # checked once, sent with every request
        self.idle_expiry_s = idle_expiry_s
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False
        self.opened = 0  # connections opened so far (observable reuse)

    @classmethod
    def for_url(cls, url: str, **kw: Any) -> AsyncPool:
        """A pool for an http(s):// base URL; https gets the default trust store."""
        parts = urlsplit(url)
        https = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = ssl.create_default_context() if https else None
        return cls(host=parts.hostname, port=parts.port or (443 if https else 80), tls=tls, **kw)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()

    # ------------------------------------------------------------ one request

    async def send(
        self, method: str, target: str, *, stream: bool | None = False, **kw: Unpack[Request]
    ) -> httpx.Response:
        """Send one request; any answer comes back (error statuses included).

        `target` is the encoded path and query. A streamed `body` goes with `length` as
        Content-Length, else chunked; `framed`: `headers` already say which. The answer is
        read whole unless `stream` (then `aclose()` it); None: whole if small and sized.
        """
        status, fields, content = await self._roundtrip(method, target, stream, **kw)
        if isinstance(content, bytes):
            return httpx.Response(status, headers=fields, content=content)
        return httpx.Response(status, headers=fields, stream=content)

    async def answer(self, method: str, target: str, **kw: Unpack[Request]) -> f.Answer:
        """As `send`, read whole into a plain `Answer`: the service's relay hot path, which
        passes bytes on and needs none of what an httpx.Response costs (~10 us)."""
        status, fields, content = await self._roundtrip(method, target, False, **kw)
        assert isinstance(content, bytes)
        return f.Answer(status, fields, content)

    async def _roundtrip(
        self,
        method: str,
        target: str,
        stream: bool | None,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: Body = None,
        length: int | None = None,
        framed: bool = False,
        timeout: Timeouts,
        idempotent: bool | None = None,
    ) -> tuple[int, f.RawFields, bytes | _Stream]:
        size = len(body) if isinstance(body, bytes) else 0 if body is None else length or -1
        if framed:
            chunked = any(k.lower() == "transfer-encoding" for k, _ in headers)
            head = f.request_head(method, target, headers, fixed=self.fixed)
        else:
            chunked = size < 0
            head = f.request_head(method, target, headers, body=size, fixed=self.fixed)
        idem = f.is_idempotent(method, idempotent)
        retried = False
        while True:
            conn, reused = await self._checkout(timeout)
            try:
                status, fields, frame, content = await self._exchange(
                    conn, method, head, body, chunked, timeout, stream
                )
                if content is None:
                    chunks = _body(conn.reader, frame, timeout.read)
                    if stream or (stream is None and f.streams(frame)):
                        return status, fields, _Stream(chunks, _Held(self, conn, frame.keep_alive))
                    content = b"".join([c async for c in chunks])
            except Unanswered as e:
                self._checkin(conn, False)
                if f.may_retry(e, reused=reused, retried=retried, idempotent=idem):
                    retried = True  # a stale pooled connection: once more, on a new one
                    continue
                raise f.as_httpx(e.cause, e.sent) from e.cause
            except httpx.TransportError:
                self._checkin(conn, False)
                raise
            except (OSError, ValueError, EOFError) as e:
                self._checkin(conn, False)
                raise _protocol(e) from e
            except BaseException:  # cancelled: the answer is unread, so the connection is spent
                self._checkin(conn, False)
                raise
            self._checkin(conn, frame.keep_alive)
            return status, fields, content

    async def _exchange(
        self,
        conn: _Conn,
        method: str,
        head: bytes,
        body: Body,
        chunked: bool,
        t: Timeouts,
        stream: bool | None,
    ) -> tuple[int, f.RawFields, Framing, bytes | None]:
        """Write the request, read the answer's head, and a sized body too unless it streams.

        One timer bounds each phase in turn (writing, then each wait for the answer), as
        httpx's write and read timeouts do; the body is None when it is left to `_body`.
        """
        sent = False
        started = [False]
        broken: OSError | None = None
        content: bytes | None = None
        loop = asyncio.get_running_loop()
        reader = conn.reader
        try:
            async with asyncio.timeout(_at(loop, t.write)) as timer:
                try:
                    await _write(conn.writer, head, body, chunked, started)
                    sent = True
                except OSError as e:
                    broken = e  # the server may have answered early (a 413) and stopped reading
                timer.reschedule(_at(loop, t.read))
                block = await reader.readuntil(b"\r\n\r\n")
                while True:
                    version, status, fields = f.parse_head(block)
                    if not 100 <= status < 200:
                        break
                    timer.reschedule(_at(loop, t.read))
                    block = await reader.readuntil(b"\r\n\r\n")  # 1xx: the real one follows
                frame = f.framing(method, version, status, fields)
                if frame.kind == "none":
                    content = b""
                elif (
                    frame.kind == "length"
                    and not stream
                    and not (stream is None and f.streams(frame))
                ):
                    timer.reschedule(_at(loop, t.read))
                    try:
                        content = await reader.readexactly(frame.length)
                    except asyncio.IncompleteReadError as e:
                        raise httpx.RemoteProtocolError(
                            f"answer cut off after {len(e.partial)} of {frame.length} bytes"
                        ) from e
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise httpx.RemoteProtocolError(f"answer cut off: {e.partial[:80]!r}") from e
            closed = broken or ConnectionResetError("server closed the connection")
            raise Unanswered(sent, closed, started[0]) from e
        except asyncio.LimitOverrunError as e:
            raise httpx.RemoteProtocolError("answer head too large") from e
        except (OSError, EOFError) as e:  # TimeoutError too: in any phase, at the timer's exit
            raise Unanswered(sent, broken or e, started[0]) from e
        if broken is not None:  # answered before the request was all sent: spent
            frame = frame._replace(keep_alive=False)
        return status, fields, frame, content

    # ------------------------------------------------------------ the pool

    async def _checkout(self, t: Timeouts) -> tuple[_Conn, bool]:
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
                conn = self._idle.pop()  # the most recent: least likely to have been closed
                if conn.usable(now, self.idle_expiry_s):
                    return conn, True
                conn.close()
            return await self._connect(t), False
        except BaseException:
            self._slots.release()
            raise

    async def _connect(self, t: Timeouts) -> _Conn:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=f.PIECE, loop=loop)
        protocol = _Protocol(reader, loop=loop)
        try:
            async with asyncio.timeout(t.connect):
                if self.uds is not None:
                    transport, _ = await loop.create_unix_connection(lambda: protocol, self.uds)
                else:  # asyncio sets TCP_NODELAY on TCP sockets
                    transport, _ = await loop.create_connection(
                        lambda: protocol, self.host, self.port, ssl=self.tls
                    )
        except TimeoutError as e:
            raise httpx.ConnectTimeout("connect timed out") from e
        except OSError as e:
            raise httpx.ConnectError(str(e) or repr(e)) from e
        self.opened += 1
        log.debug("connection %d to %s opened", self.opened, self.where)
        return _Conn(reader, asyncio.StreamWriter(transport, protocol, reader, loop))

    def _checkin(self, conn: _Conn, keep: bool) -> None:
        """Give the connection's slot back; keep the connection for reuse if it is clean."""
        if keep and not self._closed and len(self._idle) < MAX_IDLE:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()


class _Protocol(asyncio.StreamReaderProtocol):
    """asyncio's stream protocol, but a broken connection ends the reader's stream instead of
    failing it: what the server sent before it (an early answer, e.g. a 413 to a body it
    stopped reading) stays readable. Writing still fails (`drain` raises)."""

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(None)


class _Held:
    """A streamed answer's claim on its connection, given back exactly once."""

    def __init__(self, pool: AsyncPool, conn: _Conn, keep: bool) -> None:
        self.pool: AsyncPool | None = pool
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
            async for piece in self._chunks:
                yield piece
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


async def _write(
    writer: asyncio.StreamWriter, head: bytes, body: Body, chunked: bool, started: list[bool]
) -> None:
    if body is None or isinstance(body, bytes):
        _put(writer, head + body if body else head)
    else:
        _put(writer, head)
        started[0] = True
        async for piece in body:
            if piece:
                _put(writer, f.chunk(piece) if chunked else piece)
                await writer.drain()
        if chunked:
            _put(writer, f.LAST_CHUNK)
    await writer.drain()


def _put(writer: asyncio.StreamWriter, data: bytes) -> None:
    # A transport the server closed (it answered early) refuses writes under uvloop.
    if writer.is_closing():
        raise ConnectionResetError("the server closed the connection")
    writer.write(data)


async def _body(
    reader: asyncio.StreamReader, frame: Framing, read_s: float | None
) -> AsyncGenerator[bytes, None]:
    """The answer's body as it arrives; each read may take up to `read_s` (as httpx's read)."""
    if frame.kind == "length":
        left = frame.length
        while left:
            async with asyncio.timeout(read_s):
                piece = await reader.read(min(left, f.PIECE))
            if not piece:
                raise httpx.RemoteProtocolError(f"answer cut off with {left} bytes to come")
            left -= len(piece)
            yield piece
    elif frame.kind == "chunked":
        while True:
            async with asyncio.timeout(read_s):  # never across a yield: it would hit the caller
                size = f.chunk_size(await reader.readline())
                if not size:
                    while not f.trailer_done(await reader.readline()):
                        pass
                    return
                piece = await reader.readexactly(size)
                f.chunk_end(await reader.readexactly(2))
            yield piece
    elif frame.kind == "close":
        while True:
            async with asyncio.timeout(read_s):
                piece = await reader.read(f.PIECE)
            if not piece:
                break
            yield piece


def _at(loop: asyncio.AbstractEventLoop, seconds: float | None) -> float | None:
    return None if seconds is None else loop.time() + seconds


def _protocol(exc: BaseException) -> httpx.TransportError:
    """A failure while reading an answer that has begun, as httpx names it."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return httpx.RemoteProtocolError(f"answer cut off: {exc!r}")
    if isinstance(exc, ValueError):  # a line over the reader's limit
        return httpx.RemoteProtocolError(f"line too long: {exc}")
    return f.as_httpx(exc, True)


class AsyncLeanTransport(httpx.AsyncBaseTransport):
    """httpx's async transport seam over an `AsyncPool` (what `AsyncOrchard` sends through).

    Honours the request's `timeout` extension and `orchard.idempotent` (whether a request
    sent on a connection that died may be sent again; default: by method).
    """

    def __init__(self, pool: AsyncPool) -> None:
        self.pool = pool

    @classmethod
    def to(cls, base_url: str, uds: str | None = None, **kw: Any) -> AsyncLeanTransport:
        """For a service at `base_url`, or on the Unix socket `uds`."""
        return cls(AsyncPool(uds=uds, **kw) if uds else AsyncPool.for_url(base_url, **kw))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            body: Body = request.content
        except httpx.RequestNotRead:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            body = request.stream
        p = f.parts_of(request)
        response = await self.pool.send(
            p.method,
            p.target,
            headers=p.headers,
            body=body,
            framed=True,
            timeout=p.timeout,
            idempotent=p.idempotent,
            stream=None,
        )
        response.request = request
        return response

    async def aclose(self) -> None:
        await self.pool.aclose()
