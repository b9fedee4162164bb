"""Relaying a per-sandbox request to the sandbox's agent without re-shaping it.

JSON answers pass through as bytes, NDJSON streams and downloads stream through, and
uploads stream to the agent with the size limit enforced on the way. An agent error
becomes the service's typed error; an unreachable agent is explained by the service
(the sandbox exited: 410, or is unreachable: 503).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import anyio
import httpx
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from orchard.env.errors import AgentUnavailable, NotFound, OrchardError, TooLarge
from orchard.env.server.agent_client import agent_error
from orchard.env.server.service import SandboxService
from orchard.env.wire import NOT_FORWARDED

# Quick agent routes get a bounded wait; exec/wait/streams/uploads bound themselves.
QUICK = httpx.Timeout(60.0, connect=10.0)
UNBOUNDED = httpx.Timeout(None, connect=10.0)


def json_body(model: Any) -> bytes:
    data: bytes = model.model_dump_json(exclude_none=True).encode()
    return data


def _agent_error(status: int, raw: bytes) -> OrchardError:
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = {"error": {"code": None, "message": raw.decode(errors="replace")[:500]}}
    return agent_error(status, body)


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
    agent = await svc.agent(owner, sid)
    try:
        if content is None or isinstance(content, bytes):
            # Buffered: the lean keep-alive client (the exec hot path).
            reply = await agent.call(
                method,
                path,
                params=params,
                body=content,
                content_type=content_type,
                timeout=timeout,
            )
            status, data, ctype = reply.status, reply.body, reply.content_type
        else:
            headers = {"Content-Type": content_type} if content_type else None
            resp = await agent.forward(
                method,
                path,
                params=params,
                headers=headers,
                content=content,
                timeout=timeout,
                length=length,
            )
            status, data, ctype = resp.status_code, resp.content, resp.headers.get("content-type")
    except AgentUnavailable as e:
        raise await svc.agent_failed(owner, sid, e) from e
    finally:
        svc.touch(sid)
    if status >= 400:
        raise _agent_error(status, data)
    if status == 204:
        return Response(status_code=204)
    return Response(data, status_code=status, media_type=ctype or "application/json")


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
    download: bool = False,
) -> StreamingResponse:
    """Open an agent stream and relay it; the upstream closes when the client goes away.

    `download` (a GET of a file or tar) takes the agent client's lean download path."""
    agent = await svc.agent(owner, sid)
    stack = AsyncExitStack()
    try:
        if download:
            dl = await stack.enter_async_context(agent.download(path, params=params))
            status, chunks, read = dl.status, dl.body, dl.read
            raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in dl.headers.items()]
        else:
            resp = await stack.enter_async_context(
                agent.stream(method, path, params=params, headers=headers, content=content)
            )
            status, chunks, read, raw = (
                resp.status_code,
                resp.aiter_raw(),
                resp.aread,
                resp.headers.raw,
            )
    except AgentUnavailable as e:
        await stack.aclose()
        raise await svc.agent_failed(owner, sid, e) from e
    except BaseException:
        await stack.aclose()
        raise
    if status >= 400 and not passthrough_errors:
        try:
            raise _agent_error(status, await read())
        finally:
            await stack.aclose()

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            # Shielded: on client disconnect this scope is cancelled, yet upstream must close.
            with anyio.CancelScope(shield=True):
                await stack.aclose()
            svc.touch(sid)

    out = StreamingResponse(relay(), status_code=status)
    out.raw_headers = filtered(raw)
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
