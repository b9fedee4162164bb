"""Relaying a per-sandbox request to the sandbox's agent without re-shaping it.

JSON answers pass through as bytes, NDJSON streams and downloads stream through, and
uploads stream to the agent with the size limit enforced on the way. An agent error
becomes the service's typed error; an unreachable agent is explained by the service
(the sandbox exited: 410, or is unreachable: 503), and one that answers nothing at all,
not even its health check (`AgentClient.alive`), is `503 sandbox_unresponsive`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from orchard.env.errors import (
    AgentUnavailable,
    NotFound,
    OrchardError,
    SandboxUnresponsive,
    TooLarge,
)
from orchard.env.server.agent_client import STREAMING, AgentClient, Options, error_of
from orchard.env.server.service import SandboxService
from orchard.env.server.state import paused_error
from orchard.env.wire import NOT_FORWARDED

T = TypeVar("T")
# Quick agent routes get a bounded wait; exec/wait/streams/uploads bound themselves.
QUICK = httpx.Timeout(60.0, connect=10.0)
UNBOUNDED = httpx.Timeout(None, connect=10.0)


def json_body(model: Any) -> bytes:
    data: bytes = model.model_dump_json(exclude_none=True).encode()
    return data


async def _on_agent(
    svc: SandboxService, owner: str, sid: str, call: Callable[[AgentClient], Awaitable[T]]
) -> T:
    """`call` on the sandbox's agent; an unreachable agent is explained by the service
    (the sandbox exited: 410, or is unreachable: 503)."""
    agent = await svc.agent(owner, sid)
    try:
        return await call(agent)
    except AgentUnavailable as e:
        raise await _explain(svc, owner, sid, e) from e


async def _explain(svc: SandboxService, owner: str, sid: str, exc: Exception) -> OrchardError:
    """Why the agent failed a call: the sandbox is gone (404), exited (410), paused (409), or
    runs with its agent stopped (503 sandbox_unresponsive), or is unreachable (503).

    An unresponsive agent takes one fresh look at the sandbox, not agent_failed's several
    (its connections are not the trouble, and every call waiting on it fails at once)."""
    if not isinstance(exc, SandboxUnresponsive):
        return await svc.agent_failed(owner, sid, exc)
    try:
        rec = await svc.live_or_paused(owner, sid)
    except OrchardError as e:
        return e
    if rec.state == "paused":
        return paused_error(sid)
    return SandboxUnresponsive(
        f"sandbox {sid} is unresponsive: its agent answers nothing, not even its health "
        "check (is something in the sandbox stopping PID 1, e.g. a debugger?)"
    )


async def forward(
    svc: SandboxService,
    owner: str,
    sid: str,
    method: str,
    path: str,
    *,
    params: Any = None,
    content: bytes | AsyncIterator[bytes] | None = None,
    content_type: str | None = "application/json",
    timeout: httpx.Timeout = QUICK,
    length: int | None = None,
) -> Response:
    """One agent call whose JSON answer is passed through as is (agent errors become ours).

    `length` is a streamed body's exact size, passed on as Content-Length (not chunked)."""
    headers = [("Content-Type", content_type)] if content_type and content is not None else None
    opts: Options = {
        "params": params,
        "headers": headers,
        "content": content,
        "timeout": timeout,
        "length": length,
    }
    try:
        answer = await _on_agent(svc, owner, sid, lambda a: a.call(method, path, **opts))
    finally:
        svc.touch(sid)
    if answer.status >= 400:
        raise error_of(answer.status, answer.content)
    if answer.status == 204:
        return Response(status_code=204)
    ctype = answer.header(b"content-type")
    media = ctype.decode("latin-1") if ctype else "application/json"
    return Response(answer.content, status_code=answer.status, media_type=media)


def filtered(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.decode("latin-1").lower() not in NOT_FORWARDED]


async def stream(
    svc: SandboxService,
    owner: str,
    sid: str,
    method: str,
    path: str,
    *,
    params: Any = None,
    headers: list[tuple[str, str]] | None = None,
    content: bytes | AsyncIterator[bytes] | None = None,
    passthrough_errors: bool = False,
) -> StreamingResponse:
    """Open an agent stream and relay it; the upstream closes when the client goes away."""
    opts: Options = {"params": params, "headers": headers, "content": content, "timeout": STREAMING}
    resp = await _on_agent(svc, owner, sid, lambda a: a.send(method, path, stream=True, **opts))
    if resp.status_code >= 400 and not passthrough_errors:
        try:
            raw = await resp.aread()
        except httpx.TransportError as e:
            raise await _explain(svc, owner, sid, e) from e
        finally:
            await resp.aclose()
        raise error_of(resp.status_code, raw)

    async def relay() -> AsyncIterator[bytes]:
        try:
            if resp.is_stream_consumed:  # a bodiless answer (204, 304, HEAD) is read already
                if resp.content:
                    yield resp.content
                return
            async for chunk in resp.aiter_raw():
                yield chunk
        finally:
            # Shielded: on client disconnect this scope is cancelled, yet upstream must close.
            with anyio.CancelScope(shield=True):
                await resp.aclose()
            svc.touch(sid)

    out = StreamingResponse(relay(), status_code=resp.status_code)
    out.raw_headers = filtered(resp.headers.raw)
    return out


def check_length(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")


async def limited(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The request body, streamed; raises TooLarge once more than `limit` bytes arrived."""
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes")
        if chunk:
            yield chunk


def has_body(request: Request) -> bool:
    cl = request.headers.get("content-length")
    return bool(cl and cl != "0") or "transfer-encoding" in request.headers


async def upload(
    request: Request, svc: SandboxService, owner: str, sid: str, path: str, ctype: str
) -> Response:
    limit = svc.config.max_upload_bytes
    check_length(request, limit)
    # A body with a Content-Length (uvicorn holds the client to it) keeps it on the way to
    # the agent: the bytes pass straight through, with no chunk framing on either hop.
    declared = request.headers.get("content-length", "")
    chunked = "transfer-encoding" in request.headers
    length = int(declared) if declared.isdigit() and not chunked else None
    return await forward(
        svc,
        owner,
        sid,
        "PUT",
        path,
        params=request.query_params,
        content=limited(request, limit),
        content_type=request.headers.get("content-type", ctype),
        timeout=UNBOUNDED,
        length=length,
    )


def pid_path(pid: str) -> str:
    if pid in (".", ".."):  # quote() keeps dots; the agent's mux would answer a 301 to "/"
        raise NotFound(f"no process {pid!r}")
    return quote(pid, safe="")


def read_timeout(timeout_s: float | None) -> httpx.Timeout:
    return UNBOUNDED if not timeout_s else httpx.Timeout(timeout_s + 30.0, connect=10.0)
