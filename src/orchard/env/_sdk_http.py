"""The sync client's lean transport: keep-alive HTTP/1.1 for buffered calls without a body stream.

httpx.Client spends ~0.5 ms of Python per request (URL models, h11 events, two send()
calls: headers, then body), which on a ~2 ms exec is a quarter of the round trip. A
call whose request is at most a JSON document and whose answer is read whole needs
little of that: one `sendall`, a buffered read of the status line, headers and a
Content-Length or chunked body. Streams and uploads stay on httpx.

Failures are raised as the httpx exceptions the SDK's retry policy already reasons
about (ConnectError: never sent; a read failure after sending: maybe acted on). A pooled
connection the server closed while idle is caught before use (readable while idle) or,
failing that, retried once here on a new connection when nothing can have been acted
on: the request was not fully sent, or the call is idempotent.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx

from orchard.env._sdk_core import Call, Target
from orchard.env.agent_http import remove_dot_segments

# Below uvicorn's keep-alive timeout (5 s), so a pooled connection is not reused just as
# the server closes it.
IDLE_EXPIRY_S = 4.0
MAX_IDLE = 32
MAX_LINE = 64 << 10
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


class Unanswered(Exception):
    def __init__(self, sent: bool, cause: Exception) -> None:
        super().__init__(repr(cause))
        self.sent = sent
        self.cause = cause


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


def lean_transport(target: Target, headers: dict[str, str]) -> LeanHTTP | None:
    """A lean transport for this target, or None where httpx must stay (https, proxies)."""
    if target.uds is not None:
        return LeanHTTP(target, headers)
    parts = urlsplit(target.base_url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    if any(os.environ.get(v) for v in _PROXY_VARS):
        return None  # httpx honours the proxy settings; this transport does not
    return LeanHTTP(target, headers)


class LeanHTTP:
    """Thread-safe pool of keep-alive connections to one service."""

    def __init__(self, target: Target, headers: dict[str, str]) -> None:
        self.uds = target.uds
        parts = urlsplit(target.base_url)
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self._fixed = fixed_headers(parts.netloc, headers)
        self._idle: list[_Conn] = []
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------ one call

    def request(self, call: Call[Any], timeout: httpx.Timeout) -> httpx.Response:
        """Send `call` (no body stream) and return its whole answer as an httpx.Response."""
        t = call.timeout(timeout)
        data = self._encode(call)
        retried = False
        while True:
            conn, reused = self._acquire(t)
            try:
                status, fields, body, keep = self._exchange(conn, call.method, data, t)
            except Unanswered as e:
                conn.close()
                if reused and not retried and (call.idempotent or not e.sent):
                    retried = True  # a stale pooled connection: once more, on a new one
                    continue
                raise as_httpx(e.cause, e.sent) from e.cause
            except httpx.TransportError:
                conn.close()
                raise
            except (OSError, ValueError) as e:
                conn.close()
                raise as_httpx(e, True) from e
            except BaseException:
                conn.close()
                raise
            self._release(conn, keep)
            return httpx.Response(status, headers=fields, content=body)

    def _encode(self, call: Call[Any]) -> bytes:
        return encode_request(self.prefix, self._fixed, call)

    def _acquire(self, t: httpx.Timeout) -> tuple[_Conn, bool]:
        now = time.monotonic()
        with self._lock:
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
        self, conn: _Conn, method: str, data: bytes, t: httpx.Timeout
    ) -> tuple[int, list[tuple[str, str]], bytes, bool]:
        sock, f = conn.sock, conn.file
        sent = False
        try:
            sock.settimeout(t.write)
            sock.sendall(data)
            sent = True
            sock.settimeout(t.read)
            line = f.readline(MAX_LINE)
        except OSError as e:
            raise Unanswered(sent, e) from e
        if not line:
            raise Unanswered(True, ConnectionResetError("server closed the connection"))
        while True:
            version, status = status_line(line)
            fields = _fields(f)
            if not 100 <= status < 200:
                break
            line = f.readline(MAX_LINE)  # 1xx: the real answer follows
        kind, length, keep = framing(method, version, status, fields)
        if kind == "none":
            body = b""
        elif kind == "chunked":
            body = _chunked(f)
        elif kind == "length":
            body = _exactly(f, length)
        else:
            body, keep = f.read(), False
        return status, fields, body, keep


# ---- HTTP/1.1 framing, shared with the async transport (_sdk_ahttp): pure functions of bytes


def fixed_headers(netloc: str, headers: dict[str, str]) -> str:
    """The header lines every request carries."""
    return f"Host: {netloc}\r\nAccept: */*\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )


def request_head(prefix: str, fixed: str, call: Call[Any]) -> str:
    """Request line and fixed headers, without the blank line (callers add body headers)."""
    # Paths arrive quoted (sandbox_path); anything still unsafe is escaped, as httpx does.
    target = remove_dot_segments(quote(prefix + call.path, safe=_PATH_SAFE))
    if call.params:
        target += "?" + str(httpx.QueryParams(call.params))
    return f"{call.method} {target} HTTP/1.1\r\n{fixed}"


def encode_request(prefix: str, fixed: str, call: Call[Any]) -> bytes:
    """A whole request without a body stream: at most a JSON document."""
    head = request_head(prefix, fixed, call)
    body = b""
    if call.json is not None:
        # As httpx encodes json=: compact, UTF-8, no NaN.
        text = json.dumps(call.json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        body = text.encode()
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    elif call.method in ("POST", "PUT", "PATCH"):
        head += "Content-Length: 0\r\n"
    return (head + "\r\n").encode("latin-1") + body


def status_line(line: bytes) -> tuple[str, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"bad status line {line[:80]!r}")
    return parts[0].decode("ascii"), int(parts[1])


def header_line(line: bytes) -> tuple[str, str] | None:
    """One header field, or None for the blank line that ends the block."""
    if not line.endswith(b"\n"):
        raise httpx.RemoteProtocolError("header block cut off or too large")
    if line in (b"\r\n", b"\n"):
        return None
    name, sep, value = line.partition(b":")
    if not sep or not name or name != name.strip():
        raise httpx.RemoteProtocolError(f"bad header line {line[:80]!r}")
    return name.decode("latin-1"), value.strip().decode("latin-1")


Framing = tuple[str, int, bool]  # kind (none, chunked, length, close), length, keep-alive


def framing(method: str, version: str, status: int, fields: list[tuple[str, str]]) -> Framing:
    """How the answer's body is delimited, and whether the connection stays open after it."""
    names = {k.lower(): v for k, v in fields}
    keep = version == "HTTP/1.1" and "close" not in names.get("connection", "").lower()
    if method == "HEAD" or status in (204, 304):
        return "none", 0, keep
    if "chunked" in names.get("transfer-encoding", "").lower():
        return "chunked", 0, keep
    if "content-length" in names:
        return "length", _length(names["content-length"]), keep
    return "close", 0, False


def chunk_size(line: bytes) -> int:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad chunk size {line[:40]!r}") from None


def _fields(f: IO[bytes]) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    size = 0
    while True:
        line = f.readline(MAX_LINE)
        size += len(line)
        if size > MAX_LINE:
            raise httpx.RemoteProtocolError("header block cut off or too large")
        if (field := header_line(line)) is None:
            return fields
        fields.append(field)


def _length(value: str) -> int:
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1 or not (v := values.pop()).isdigit():
        raise httpx.RemoteProtocolError(f"bad Content-Length {value!r}")
    return int(v)


def _exactly(f: IO[bytes], n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise httpx.RemoteProtocolError(f"answer cut off after {len(data)} of {n} bytes")
    return data


def _chunked(f: IO[bytes]) -> bytes:
    parts: list[bytes] = []
    while True:
        size = chunk_size(f.readline(MAX_LINE))
        if size == 0:
            break
        parts.append(_exactly(f, size))
        if f.read(2) != b"\r\n":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")
    while (line := f.readline(MAX_LINE)) not in (b"\r\n", b"\n"):
        if not line:
            raise httpx.RemoteProtocolError("answer cut off in its trailer")
    return b"".join(parts)


def as_httpx(exc: Exception, sent: bool) -> httpx.TransportError:
    """The httpx exception for a failure, so the SDK's retry policy applies unchanged."""
    if isinstance(exc, httpx.TransportError):
        return exc
    if isinstance(exc, TimeoutError):
        return (
            httpx.ReadTimeout(str(exc) or "timed out") if sent else httpx.WriteTimeout("timed out")
        )
    if not sent:
        return httpx.WriteError(repr(exc))
    if isinstance(exc, ConnectionResetError) and "closed" in str(exc):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    return httpx.ReadError(repr(exc))
