"""A loopback TCP door to one port link, for clients that can only be given an http:// URL.

The in-process service (`Orchard()` with no URL) listens on a private Unix socket, which
OpenEnv's clients (`requests`, `websockets`) cannot reach. `LoopbackDoor` listens on
127.0.0.1 and relays each connection to the service's socket with the request path moved
under one port-link prefix (`/p/<token>`), so what comes in at `/ws` reaches `/ws` of the
server inside the sandbox, and nothing else of the service can be reached through it:

- one request per connection: the request is sent with `Connection: close` and only its
  own body (by `Content-Length`, or chunk by chunk) is passed on, so pipelined bytes
  after it never reach the service at all;
- a WebSocket upgrade: nothing the client sends after its request is passed on until the
  service answers `101`; from then on the bytes are WebSocket frames, not HTTP;
- absolute-form targets, `*`, and `.`/`..` segments (however spelled) are refused (400).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from urllib.parse import unquote

_HEAD_LIMIT = 64 * 1024
_HOP = {b"connection", b"keep-alive", b"proxy-connection"}
_HEAD_WAIT_S = 60.0
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class LoopbackDoor:
    """127.0.0.1:`port` relayed to the Unix socket `uds`, every path under `prefix()`.

    `prefix` is called (in a worker thread) for each connection, so it may renew what it
    returns (a port link about to expire).
    """

    def __init__(self, uds: str, prefix: Callable[[], str], port: int = 0) -> None:
        self._uds, self._prefix, self._port = uds, prefix, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackDoor:
        """Listen (in a thread of its own); returns self once bound."""
        ready = threading.Event()
        failed: list[BaseException] = []

        async def serve() -> None:
            try:
                self._server = await asyncio.start_server(
                    self._accept, "127.0.0.1", self._port, limit=_HEAD_LIMIT
                )
            except BaseException as e:
                failed.append(e)
                ready.set()
                return
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server.serve_forever()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        self._loop = asyncio.new_event_loop()
        loop = self._loop
        self._thread = threading.Thread(
            target=lambda: loop.run_until_complete(serve()), name="orchard-loopback", daemon=True
        )
        self._thread.start()
        ready.wait(10)
        if failed:
            self.stop()
            raise failed[0]
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return

        if self._server is not None:
            loop.call_soon_threadsafe(self._server.close)  # serve() then ends the relays
        thread.join(10)
        loop.close()

    # ---- one connection

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._relay(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _HEAD_WAIT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            try:
                prefix = await asyncio.to_thread(self._prefix)
            except Exception:  # the link could not be made: the sandbox is gone, say
                writer.write(_BAD_GATEWAY)
                await writer.drain()
                return
            rewritten = rewrite_head(head, prefix)
            framing = body_framing(head)
            if rewritten is None or framing is None:
                writer.write(_BAD_REQUEST)
                await writer.drain()
                return
            data, upgrade = rewritten
            up_reader, upstream = await asyncio.open_unix_connection(self._uds)
            upstream.write(data)
            await upstream.drain()
            if upgrade:
                status = await up_reader.readline()
                writer.write(status)
                if status.split(b" ", 2)[1:2] != [b"101"]:
                    await _pipe(up_reader, writer)  # the refusal, then the service closes
                    return
                await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
                return
            await asyncio.gather(_body(reader, upstream, framing), _pipe(up_reader, writer))
        # The peer went away, or sent a chunk line too long (LimitOverrun) or not hex.
        except (OSError, asyncio.CancelledError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ValueError):  # fmt: skip
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()


def body_framing(head: bytes) -> int | None:
    """How the body of the request `head` is framed: its length, or -1 for chunked; None
    for framing that is ambiguous (both, or differing lengths) and so must be refused."""
    fields = [line.partition(b":") for line in head[:-4].split(b"\r\n")[1:]]
    coding = [v.strip().lower() for n, _, v in fields if n.strip().lower() == b"transfer-encoding"]
    lengths = {v.strip() for n, _, v in fields if n.strip().lower() == b"content-length"}
    if coding:
        return -1 if coding == [b"chunked"] and not lengths else None
    if len(lengths) > 1:
        return None
    length = lengths.pop() if lengths else b"0"
    return int(length) if length.isdigit() else None


async def _body(src: asyncio.StreamReader, dst: asyncio.StreamWriter, framing: int) -> None:
    """Pass on one request body framed as `framing` says, and nothing after it."""
    if framing < 0:
        while True:
            line = await src.readuntil(b"\r\n")
            size = int(line.partition(b";")[0].strip(), 16)
            dst.write(line)
            if size == 0:
                while (trailer := await src.readuntil(b"\r\n")) != b"\r\n":
                    dst.write(trailer)
                dst.write(trailer)
                break
            dst.write(await src.readexactly(size + 2))
            await dst.drain()
    while framing > 0:
        chunk = await src.read(min(framing, 65536))
        if not chunk:
            break
        dst.write(chunk)
        framing -= len(chunk)
        await dst.drain()
    await dst.drain()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    finally:
        with contextlib.suppress(Exception):
            if dst.can_write_eof():
                dst.write_eof()


def rewrite_head(head: bytes, prefix: str) -> tuple[bytes, bool] | None:
    """The request head with its target under `prefix` and its hop-by-hop headers replaced;
    whether it asks for an upgrade. None for a request that must not be passed on."""
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    method, target, version = parts
    if not target.startswith(b"/") or target.startswith(b"//"):
        return None
    path = unquote(target.partition(b"?")[0].decode("latin-1"))
    if any(seg in (".", "..") for seg in path.replace("\\", "/").split("/")):
        return None
    headers: list[bytes] = []
    tokens: set[bytes] = set()
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            return None
        low = name.lower()
        if low in _HOP:
            if low == b"connection":
                tokens |= {t.strip().lower() for t in value.split(b",")}
            continue
        headers.append(line)
    asked = [h.partition(b":")[2].strip().lower() for h in headers if _named(h, b"upgrade")]
    upgrade = b"upgrade" in tokens and asked == [b"websocket"]
    if not upgrade:  # only WebSocket upgrades; any other is dropped, not half passed on
        headers = [h for h in headers if not _named(h, b"upgrade")]
    headers.append(b"Connection: Upgrade" if upgrade else b"Connection: close")
    start = b" ".join([method, prefix.rstrip("/").encode() + target, version])
    return b"\r\n".join([start, *headers]) + b"\r\n\r\n", upgrade


def _named(line: bytes, name: bytes) -> bool:
    return line.partition(b":")[0].lower() == name
