"""HTTP/1.1 message framing, the one copy every lean transport uses: pure functions of bytes.

How a request head is written, how an answer's head is read, and how its body is
delimited (none, Content-Length, chunked, or until close) and whether the connection
stays usable after it. The sync pool (`sync`) and the asyncio pool (`aio`) do only the
I/O around these. Failures are raised as the httpx exceptions callers already reason
about (RemoteProtocolError for a bad answer; `as_httpx` for I/O errors), so the SDK's
retry policy and the agent client's error mapping apply unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, NamedTuple

import httpx

# Room for an answer's status line and headers.
MAX_HEAD = 64 << 10
# The read size of a body streamed to the caller (files and tars move in big pieces).
PIECE = 1 << 20
# An answer sized up to this is read whole at once, even by a caller that streams.
EAGER_MAX = 256 << 10
# Methods that may be sent again when a pooled connection turned out dead (RFC 9110 9.2.2).
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# The request extension by which a caller overrides IDEMPOTENT for one request.
IDEMPOTENT_EXTENSION = "orchard.idempotent"
_NO_BODY_STATUS = frozenset({204, 304})
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")  # never in an encoded request target
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})

Fields = list[tuple[str, str]]
# An answer's header fields as they came (httpx takes them as bytes, without re-encoding).
RawFields = list[tuple[bytes, bytes]]
Kind = Literal["none", "length", "chunked", "close"]


class Framing(NamedTuple):
    """How an answer's body is delimited, and whether the connection is reusable after it."""

    kind: Kind
    length: int
    keep_alive: bool


class Answer(NamedTuple):
    """A whole answer, as it came: status, header fields (bytes) and body."""

    status: int
    headers: RawFields
    content: bytes

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (`name` in lower case)."""
        return next((v for k, v in self.headers if k.lower() == name), None)


class Unanswered(Exception):
    """The exchange failed before any byte of an answer arrived (maybe a stale connection).

    `sent`: the whole request went out, so the server may have acted on it; `started`: a
    streamed body began to be read from its source, which cannot be read again.
    """

    def __init__(self, sent: bool, cause: BaseException, started: bool = False) -> None:
        super().__init__(repr(cause))
        self.sent = sent
        self.cause = cause
        self.started = started


def remove_dot_segments(target: str) -> str:
    """Dot segments resolved as httpx does (`/a/b/..` is `/a`), so Go never answers a redirect."""
    path, sep, query = target.partition("?")
    if "/." not in path:
        return target
    out: list[str] = []
    for seg in path.split("/")[1:]:
        if seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    return "/" + "/".join(out) + sep + query


def header_lines(headers: Iterable[tuple[str, str]]) -> str:
    """Header fields as lines of a head; a line break in a name or value is refused."""
    lines = []
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


def request_head(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    *,
    body: int | None = None,
    fixed: str = "",
) -> bytes:
    """A request's head up to its body. `target` is an encoded path (and query).

    `fixed`: header lines every request of a pool carries (`header_lines`, made once).
    `body`: the size of a body whose headers the caller did not give (Content-Length, 0 for
    a POST without one); -1 for a chunked body; None when `headers` already frame it.
    """
    if not target.startswith("/") or _UNSAFE.search(target):
        raise ValueError(f"request target must be an encoded path, got {target!r}")
    text = f"{method} {remove_dot_segments(target)} HTTP/1.1\r\n{fixed}{header_lines(headers)}"
    if body is not None and body >= 0 and (body or method in _WITH_BODY):
        text += f"Content-Length: {body}\r\n"
    elif body is not None and body < 0:
        text += "Transfer-Encoding: chunked\r\n"
    return (text + "\r\n").encode("latin-1")


def parse_head(block: bytes) -> tuple[bytes, int, RawFields]:
    """An answer's head (status line, fields, through the blank line) -> version, status, fields."""
    if len(block) > MAX_HEAD:
        raise httpx.RemoteProtocolError("answer head too large")
    status_line, _, rest = block.partition(b"\r\n")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise httpx.RemoteProtocolError(f"bad status line {status_line[:80]!r}")
    fields: RawFields = []
    for raw in rest.split(b"\r\n"):
        if not raw:
            continue
        name, sep, value = raw.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError(f"bad header line {raw[:80]!r}")
        fields.append((name, value.strip()))
    return parts[0], int(parts[1]), fields


def framing(method: str, version: bytes, status: int, fields: RawFields) -> Framing:
    """How the answer's body is delimited, and whether the connection stays open after it."""
    names: dict[bytes, bytes] = {}
    for k, v in fields:
        key = k.lower()
        names[key] = names[key] + b", " + v if key in names else v
    keep = version == b"HTTP/1.1" and b"close" not in names.get(b"connection", b"").lower()
    if method == "HEAD" or status in _NO_BODY_STATUS:
        return Framing("none", 0, keep)
    if b"chunked" in names.get(b"transfer-encoding", b"").lower():
        return Framing("chunked", 0, keep)
    if b"content-length" in names:
        return Framing("length", content_length(names[b"content-length"]), keep)
    return Framing("close", 0, False)


def streams(frame: Framing) -> bool:
    """Whether an answer is left to the caller to read as it arrives, not read whole now."""
    return frame.kind in ("chunked", "close") or frame.length > EAGER_MAX


def content_length(value: bytes) -> int:
    """Repeated identical values arrive joined ("5, 5"); differing ones are an error."""
    values = {v.strip() for v in value.split(b",")}
    if len(values) != 1 or not (v := values.pop()).isdigit():
        raise httpx.RemoteProtocolError(f"bad Content-Length {value!r}")
    return int(v)


def chunk_size(line: bytes) -> int:
    """The size on a chunk's line (extensions ignored)."""
    if not line.endswith(b"\n"):
        raise httpx.RemoteProtocolError("answer cut off in a chunk size")
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise httpx.RemoteProtocolError(f"bad chunk size {line[:40]!r}") from None


def chunk_end(crlf: bytes) -> None:
    if crlf != b"\r\n":
        raise httpx.RemoteProtocolError("chunk not followed by CRLF")


def trailer_done(line: bytes) -> bool:
    """True at the blank line that ends a chunked body's trailer fields (which are not used)."""
    if not line:
        raise httpx.RemoteProtocolError("answer cut off in its trailer")
    return line in (b"\r\n", b"\n")


def chunk(data: bytes) -> bytes:
    """One piece of a chunked request body."""
    return b"%x\r\n%b\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def is_idempotent(method: str, override: object = None) -> bool:
    return bool(override) if isinstance(override, bool) else method in IDEMPOTENT


class Parts(NamedTuple):
    """An httpx.Request as a pool sends it."""

    method: str
    target: str
    headers: Fields
    timeout: httpx.Timeout
    idempotent: bool | None


DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def parts_of(request: httpx.Request) -> Parts:
    """Method, encoded target, headers (they frame the body), timeouts and idempotency."""
    ext = request.extensions
    return Parts(
        request.method,
        request.url.raw_path.decode("ascii"),
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
        httpx.Timeout(**ext["timeout"]) if "timeout" in ext else DEFAULT_TIMEOUT,
        ext.get(IDEMPOTENT_EXTENSION),
    )


def as_httpx(exc: BaseException, sent: bool) -> httpx.TransportError:
    """The httpx exception for an I/O failure, so the retry rules above apply unchanged."""
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


def may_retry(e: Unanswered, *, reused: bool, retried: bool, idempotent: bool) -> bool:
    """Whether a failed exchange may go once more on a new connection.

    Only a pooled connection can have been closed by the server while idle, only once,
    never after a timeout (the server is slow, not gone), and only when nothing can have
    been acted on: the request was not fully sent, or sending it twice is harmless; a
    streamed body must not have begun to be read from its source.
    """
    if not reused or retried or isinstance(e.cause, TimeoutError) or e.started:
        return False
    return idempotent or not e.sent
