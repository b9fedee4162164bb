"""Connect RPC framing, JSON codec only: what envd's clients speak over HTTP/1.1.

A unary call is a POST of `application/json`; its answer is the JSON message (200) or a
Connect error (`{"code": "not_found", "message": ...}` with the code's HTTP status). A
stream (`application/connect+json`) carries enveloped messages both ways: one flag byte
(0 a message, 2 the end of the stream), a 4-byte big-endian length, the JSON. A server
stream always answers 200 and reports its error, if any, in the end-of-stream frame.
Protocol: connectrpc.com/docs/protocol (no compression: the E2B SDK turns it off).
"""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from orchard.env.errors import (
    Conflict,
    ImageNotFound,
    InvalidRequest,
    NotFound,
    OrchardError,
    SandboxExited,
    SandboxPaused,
    TooLarge,
)

STREAM_TYPE = "application/connect+json"
UNARY_TYPE = "application/json"
END_STREAM = 0x02
COMPRESSED = 0x01
# An enveloped request message larger than this is refused (envd's own inputs are tiny).
MAX_MESSAGE = 16 << 20

# The Connect codes and the HTTP status of a unary error answer carrying each.
CODE_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class RpcError(Exception):
    """A Connect error: a code from CODE_STATUS and a message for a human."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        assert code in CODE_STATUS, code
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def gone(sandbox_id: str) -> RpcError:
    """What E2B's proxy says for a sandbox that is not running: the SDK's words
    ("was not found") turn it into SandboxNotRunningException."""
    return RpcError("unavailable", f"The sandbox {sandbox_id} was not found")


# Orchard's error codes (errors.py) -> Connect codes, most specific class first.
_ORCHARD_CODES: list[tuple[type[OrchardError], str]] = [
    (SandboxPaused, "unavailable"),
    (Conflict, "already_exists"),
    (ImageNotFound, "not_found"),
    (NotFound, "not_found"),
    (TooLarge, "resource_exhausted"),
    (InvalidRequest, "invalid_argument"),
]
_BY_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "already_exists",
    413: "resource_exhausted",
    422: "invalid_argument",
    429: "resource_exhausted",
    501: "unimplemented",
    503: "unavailable",
}


def from_orchard(err: OrchardError, sandbox_id: str) -> RpcError:
    """The Connect error for one of Orchard's typed errors (no engine text: errors.py)."""
    if isinstance(err, SandboxExited):
        return gone(sandbox_id)
    for cls, code in _ORCHARD_CODES:
        if isinstance(err, cls):
            return RpcError(code, err.message)
    return RpcError(_BY_STATUS.get(err.status, "internal"), err.message)


# ---------------------------------------------------------------- messages in


def envelope(message: dict[str, Any], *, end: bool = False) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", END_STREAM if end else 0, len(data)) + data


def end_of_stream(error: RpcError | None = None) -> bytes:
    """The last frame of a server stream: `{}`, or `{"error": ...}`."""
    return envelope({"error": error.to_json()} if error else {}, end=True)


def _decode(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except ValueError:
        raise RpcError("invalid_argument", "the message is not valid JSON") from None
    if not isinstance(message, dict):
        raise RpcError("invalid_argument", "the message is not a JSON object")
    return message


def _check_type(request: Request, expected: str) -> None:
    ctype = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if ctype != expected:
        raise RpcError(
            "invalid_argument" if ctype.endswith("json") else "unimplemented",
            f"content type {ctype!r} is not served here: only the JSON codec ({expected})",
        )


async def unary_request(request: Request) -> dict[str, Any]:
    """The request message of a unary call (at most MAX_MESSAGE bytes: the service's
    bound on buffered bodies does not apply to E2B's routes, which bound their own)."""
    _check_type(request, UNARY_TYPE)
    if request.headers.get("content-encoding", "identity") != "identity":
        raise RpcError("unimplemented", "compressed requests are not served")
    return _decode(await bounded_body(request))


async def bounded_body(request: Request, limit: int = MAX_MESSAGE) -> bytes:
    """A body read whole, refused (resource_exhausted) past `limit` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RpcError("resource_exhausted", f"a body over {limit} bytes")
    return bytes(body)


async def stream_messages(request: Request) -> AsyncIterator[dict[str, Any]]:
    """The enveloped messages of a streaming request, as they arrive."""
    _check_type(request, STREAM_TYPE)
    buf = bytearray()
    chunks = request.stream()
    done = False
    while True:
        while len(buf) < 5 and not done:
            try:
                buf += await anext(chunks)
            except StopAsyncIteration:
                done = True
        if len(buf) < 5:
            if buf:
                raise RpcError("invalid_argument", "the stream ended inside a message")
            return
        flags, size = struct.unpack(">BI", buf[:5])
        if flags & COMPRESSED:
            raise RpcError("unimplemented", "compressed messages are not served")
        if size > MAX_MESSAGE:
            raise RpcError("resource_exhausted", f"a message over {MAX_MESSAGE} bytes")
        while len(buf) < 5 + size and not done:
            try:
                buf += await anext(chunks)
            except StopAsyncIteration:
                done = True
        if len(buf) < 5 + size:
            raise RpcError("invalid_argument", "the stream ended inside a message")
        data, buf = bytes(buf[5 : 5 + size]), buf[5 + size :]
        if flags & END_STREAM:
            return
        yield _decode(data)


async def first_message(request: Request) -> dict[str, Any]:
    """The one request message of a server-streaming call."""
    async for message in stream_messages(request):
        return message
    raise RpcError("invalid_argument", "the request carried no message")


# ---------------------------------------------------------------- answers out


def unary_answer(message: dict[str, Any]) -> Response:
    return Response(json.dumps(message, separators=(",", ":")), media_type=UNARY_TYPE)


def unary_error(err: RpcError) -> Response:
    return JSONResponse(err.to_json(), status_code=CODE_STATUS[err.code])


def stream_error(err: RpcError) -> Response:
    """A server stream that failed before its first message: 200 and the end frame."""
    return Response(end_of_stream(err), media_type=STREAM_TYPE)


def timeout_s(request: Request) -> float | None:
    """The call's deadline from `Connect-Timeout-Ms` (at most 10 digits), in seconds."""
    raw = request.headers.get("connect-timeout-ms", "")
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 10:
        raise RpcError("invalid_argument", "Connect-Timeout-Ms must be 1 to 10 digits")
    return int(raw) / 1000
