"""A small keep-alive HTTP/1.1 client for the service's buffered calls to one agent.

httpx costs ~0.8 ms per request on the service -> agent hop, more than the agent's own
work for a trivial exec. The hot calls (exec and every other JSON call) send a small
body with Content-Length and read a whole answer, which needs only a little HTTP/1.1:
this client speaks that on asyncio streams over the agent's Unix socket (or plain TCP),
with a pool of idle connections. Streams, uploads and the port proxy stay on httpx,
except downloads (`stream`): files and tars are relayed in pieces of up to 1 MiB, where
httpx reads 64 KiB at a time at a cost of ~50 us of Python each.

Answers may be Content-Length, chunked (Go's net/http chunks larger bodies) or
close-delimited. A pooled connection the agent closed meanwhile (restart, its 30 s
header timeout) is retried once on a new connection, but only when the request cannot
have been acted on: it was not fully sent, or it is idempotent. A POST that was sent
and got no answer is never sent again (an exec must not run twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchard.env.errors import AgentUnavailable

# The agent closes a connection whose next request does not arrive within 30 s (its
# ReadHeaderTimeout), so an idle connection is dropped well before that.
IDLE_EXPIRY_S = 15.0
# Room for the status line and headers of one answer (the agent sends a few hundred bytes).
HEAD_LIMIT = 64 << 10
# A streamed answer's read size, and its connection's buffer (asyncio pauses reading at 2x).
STREAM_PIECE = 1 << 20
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
_NO_BODY = frozenset({204, 304})


class ProtocolError(Exception):
    """The agent's answer is not HTTP/1.x as this client reads it."""


class _Unanswered(Exception):
    """The connection failed before any byte of an answer arrived (maybe a stale one)."""

    def __init__(self, sent: bool, cause: BaseException) -> None:
        super().__init__(repr(cause))
        self.sent = sent
        self.cause = cause


@dataclass(frozen=True, slots=True)
class StreamReply:
    """An answer whose body is read as it arrives: iterate `body` (once)."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.body])


@dataclass(frozen=True, slots=True)
class Reply:
    """One whole answer: status, headers (lower-case names) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        """Still open, nothing unread, and not idle long enough to race the agent's close."""
        return (
            now - self.idle_since < IDLE_EXPIRY_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


class AgentHTTP:
    """Pooled HTTP/1.1 connections to one agent, for requests with buffered bodies.

    `request` returns any answer as a `Reply` (error statuses included); only a failure
    to reach the agent or to read its answer raises, as `AgentUnavailable`.
    """

    def __init__(
        self,
        *,
        socket_path: str | None = None,
        base_url: str | None = None,
        token: str | None = None,
        max_connections: int = 64,
    ) -> None:
        if (socket_path is None) == (base_url is None):
            raise ValueError("give exactly one of socket_path or base_url")
        self.socket_path = socket_path
        self._host: str | None = None
        self._port = 0
        host_header = "agent"
        if base_url is not None:
            parts = urlsplit(base_url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"AgentHTTP speaks plain http:// only, not {base_url!r}")
            self._host, self._port = parts.hostname, parts.port or 80
            host_header = parts.netloc
        self.where = socket_path or str(base_url)
        fixed = f"Host: {host_header}\r\n"
        if token:
            fixed += f"Authorization: Bearer {token}\r\n"
        self._fixed = fixed
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    # ------------------------------------------------------------ public

    async def request(
        self,
        method: str,
        target: str,
        *,
        body: bytes | None = None,
        headers: Sequence[tuple[str, str]] = (),
        read_timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
        idempotent: bool | None = None,
    ) -> Reply:
        """Send one request (`target` = path plus query, already encoded) and read the answer.

        `read_timeout` bounds each wait for the agent (writing the request, then every read
        of the answer), like httpx's read timeout; None waits as long as it takes.
        """
        if self._closed:
            raise AgentUnavailable(f"agent at {self.where}: client closed")
        if idempotent is None:
            idempotent = method in _IDEMPOTENT
        head = self._head(method, target, body, headers)
        async with self._slots:
            retried = False
            while True:
                conn, reused = await self._acquire(connect_timeout)
                try:
                    reply, keep = await self._exchange(conn, method, head, body, read_timeout)
                except _Unanswered as e:
                    conn.close()
                    if reused and not retried and (idempotent or not e.sent):
                        retried = True  # a stale pooled connection: once more, on a new one
                        continue
                    raise self._unavailable(e.cause) from e.cause
                except (
                    TimeoutError,
                    OSError,
                    EOFError,
                    ProtocolError,
                    asyncio.LimitOverrunError,
                ) as e:
                    conn.close()
                    raise self._unavailable(e) from e
                except BaseException:
                    conn.close()  # cancelled mid-exchange: the connection's state is unknown
                    raise
                if keep and not self._closed:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:
                    conn.close()
                return reply

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        connect_timeout: float = 10.0,
    ) -> AsyncIterator[StreamReply]:
        """Send a request without a body; the answer's body is read as the caller iterates.

        No read timeout (downloads take as long as they take). The connection is a new one,
        closed when the block ends: nothing is left unread in a pool. A failure before the
        answer's head raises AgentUnavailable; one in the body raises from the iteration.
        """
        if self._closed:
            raise AgentUnavailable(f"agent at {self.where}: client closed")
        head = self._head(method, target, None, headers)
        async with self._slots:
            conn = await self._connect(connect_timeout, STREAM_PIECE)
            try:
                try:
                    conn.writer.write(head)
                    await conn.writer.drain()
                    block = await conn.reader.readuntil(b"\r\n\r\n")
                    while True:
                        status_line, _, rest = block.partition(b"\r\n")
                        _, status = _status(status_line)
                        fields = _fields(rest)
                        if not 100 <= status < 200:
                            break
                        block = await conn.reader.readuntil(b"\r\n\r\n")
                except (
                    OSError,
                    EOFError,
                    ProtocolError,
                    asyncio.LimitOverrunError,
                ) as e:
                    raise self._unavailable(e) from e
                yield StreamReply(status, fields, _pieces(conn.reader, method, status, fields))
            finally:
                conn.close()

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.writer.wait_closed()

    # ------------------------------------------------------------ internals

    def _unavailable(self, exc: BaseException) -> AgentUnavailable:
        if isinstance(exc, TimeoutError):
            return AgentUnavailable(f"agent at {self.where} did not answer in time (ReadTimeout)")
        return AgentUnavailable(f"agent at {self.where} is not reachable: {exc!r}")

    def _head(
        self, method: str, target: str, body: bytes | None, headers: Sequence[tuple[str, str]]
    ) -> bytes:
        if not target.startswith("/") or any(c <= " " or c == "\x7f" for c in target):
            raise ValueError(f"request target must be an encoded path, got {target!r}")
        lines = [f"{method} {remove_dot_segments(target)} HTTP/1.1\r\n", self._fixed]
        for name, value in headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    async def _acquire(self, connect_timeout: float) -> tuple[_Conn, bool]:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recent: least likely to have been closed
            if conn.usable(now):
                return conn, True
            conn.close()
        return await self._connect(connect_timeout, HEAD_LIMIT), False

    async def _connect(self, connect_timeout: float, limit: int) -> _Conn:
        try:
            async with asyncio.timeout(connect_timeout):
                if self.socket_path is not None:
                    r, w = await asyncio.open_unix_connection(self.socket_path, limit=limit)
                else:
                    r, w = await asyncio.open_connection(self._host, self._port, limit=limit)
        except TimeoutError as e:
            raise AgentUnavailable(
                f"agent at {self.where} did not answer in time (ConnectTimeout)"
            ) from e
        except OSError as e:
            raise AgentUnavailable(f"agent at {self.where} is not reachable: {e!r}") from e
        return _Conn(r, w)

    async def _exchange(
        self,
        conn: _Conn,
        method: str,
        head: bytes,
        body: bytes | None,
        read_timeout: float | None,
    ) -> tuple[Reply, bool]:
        loop = asyncio.get_running_loop()
        reader, writer = conn.reader, conn.writer
        async with asyncio.timeout(read_timeout) as t:

            def progress() -> None:
                if read_timeout is not None:
                    t.reschedule(loop.time() + read_timeout)

            sent = False
            try:
                writer.write(head + body if body else head)
                await writer.drain()
                sent = True
                block = await reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError) as e:
                if isinstance(e, asyncio.IncompleteReadError) and e.partial:
                    raise ProtocolError(f"answer cut off: {e.partial[:80]!r}") from e
                raise _Unanswered(sent, e) from e
            while True:
                progress()
                status_line, _, rest = block.partition(b"\r\n")
                version, status = _status(status_line)
                fields = _fields(rest)
                if not 100 <= status < 200:
                    break
                block = await reader.readuntil(b"\r\n\r\n")  # 1xx: the real answer follows
            keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
            if method == "HEAD" or status in _NO_BODY:
                data = b""
            elif "chunked" in fields.get("transfer-encoding", "").lower():
                data = await _chunked(reader, progress)
            elif "content-length" in fields:
                data = await reader.readexactly(_length(fields["content-length"]))
            else:
                data, keep = await _until_eof(reader, progress), False
        return Reply(status, fields, data), keep


def remove_dot_segments(target: str) -> str:
    """Dot segments resolved as httpx does (`/a/b/..` is `/a`), so Go never answers a redirect."""
    path, sep, query = target.partition("?")
    if "/." not in path:
        return target
    segments = path.split("/")[1:]
    out: list[str] = []
    for seg in segments:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    return "/" + "/".join(out) + sep + query


def _status(line: bytes) -> tuple[str, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"bad status line {line[:80]!r}")
    return parts[0].decode("ascii"), int(parts[1])


def _fields(block: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for raw in block.split(b"\r\n"):
        if not raw:
            continue
        name, sep, value = raw.partition(b":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"bad header line {raw[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return fields


def _length(value: str) -> int:
    # Repeated identical values arrive joined ("5, 5"); differing ones are an error.
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1 or not (v := values.pop()).isdigit():
        raise ProtocolError(f"bad Content-Length {value!r}")
    return int(v)


async def _chunked(reader: asyncio.StreamReader, progress: Callable[[], None]) -> bytes:
    parts: list[bytes] = []
    while True:
        size = _chunk_size(await reader.readuntil(b"\r\n"))
        if size == 0:
            break
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")
        progress()
    while await reader.readuntil(b"\r\n") != b"\r\n":
        pass  # trailer fields: not used
    return b"".join(parts)


async def _pieces(
    reader: asyncio.StreamReader, method: str, status: int, fields: dict[str, str]
) -> AsyncIterator[bytes]:
    """A streamed answer's body, in pieces of what has arrived (at most STREAM_PIECE)."""
    if method == "HEAD" or status in _NO_BODY:
        return
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while size := _chunk_size(await reader.readuntil(b"\r\n")):
            async for piece in _exactly(reader, size):
                yield piece
            if await reader.readexactly(2) != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
        while await reader.readuntil(b"\r\n") != b"\r\n":
            pass  # trailer fields: not used
    elif "content-length" in fields:
        async for piece in _exactly(reader, _length(fields["content-length"])):
            yield piece
    else:
        while piece := await reader.read(STREAM_PIECE):
            yield piece


async def _exactly(reader: asyncio.StreamReader, n: int) -> AsyncIterator[bytes]:
    while n > 0:
        piece = await reader.read(min(n, STREAM_PIECE))
        if not piece:
            raise ProtocolError(f"answer cut off with {n} bytes to come")
        n -= len(piece)
        yield piece


def _chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise ProtocolError(f"bad chunk size {line[:40]!r}") from None


async def _until_eof(reader: asyncio.StreamReader, progress: Callable[[], None]) -> bytes:
    parts: list[bytes] = []
    while chunk := await reader.read(1 << 16):
        parts.append(chunk)
        progress()
    return b"".join(parts)
