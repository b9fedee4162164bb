"""The REST API (docs/rest-api.md): FastAPI routes over `SandboxService`, plus `serve`.

Per-sandbox routes forward to the sandbox's agent without re-shaping: JSON answers
are passed through as bytes, NDJSON streams and downloads stream through, uploads
stream to the agent with the size limit enforced on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import anyio
import httpx
import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response, WebSocket
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import HTTPConnection
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from orchard import __version__
from orchard.env.agent_client import AgentClient, agent_error
from orchard.env.backends.base import Backend
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    AgentUnavailable,
    BadRequest,
    InvalidRequest,
    NotFound,
    OrchardError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from orchard.env.metrics import Metrics
from orchard.env.models import (
    BatchCreateResult,
    ErrorResponse,
    ExecRequest,
    ExecResult,
    FileList,
    FileStat,
    Health,
    MkdirRequest,
    MoveRequest,
    NetworkPolicy,
    ProcessInfo,
    ProcessList,
    ProcessOutput,
    ProcessStart,
    RemoveRequest,
    ResizeRequest,
    Sandbox,
    SandboxCreate,
    SandboxList,
    SignalRequest,
    StdinWrite,
    TarResult,
    TimeoutUpdate,
)
from orchard.env.service import SandboxService
from orchard.env.wire import NOT_FORWARDED

log = logging.getLogger("orchard.api")

KEY_QUERY = "orchard_key"
# Quick agent routes get a bounded wait; exec/wait/streams/uploads bound themselves.
_QUICK = httpx.Timeout(60.0, connect=10.0)
_UNBOUNDED = httpx.Timeout(None, connect=10.0)
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (400, 401, 404, 409, 410, 413, 422, 503)
}


# ---------------------------------------------------------------- auth & dependencies


def _api_key(conn: HTTPConnection, *, allow_query: bool) -> str | None:
    auth = conn.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    if conn.headers.get("x-api-key"):
        return conn.headers["x-api-key"].strip()
    if allow_query:
        return conn.query_params.get(KEY_QUERY)
    return None


def _owner(conn: HTTPConnection, *, allow_query: bool) -> str:
    config: ServiceConfig = conn.app.state.config
    owner = config.owner_for(_api_key(conn, allow_query=allow_query))
    if owner is None:
        raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
    return owner


# Declared so /openapi.json documents both ways to pass the key; checked in _owner.
_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token")
_header_key = APIKeyHeader(name="X-API-Key", auto_error=False)


async def require_owner(
    request: Request,
    _b: Annotated[Any, Depends(_bearer)] = None,
    _h: Annotated[Any, Depends(_header_key)] = None,
) -> str:
    return _owner(request, allow_query=False)


async def require_port_owner(
    request: Request,
    _b: Annotated[Any, Depends(_bearer)] = None,
    _h: Annotated[Any, Depends(_header_key)] = None,
) -> str:
    return _owner(request, allow_query=True)


async def get_service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.service
    return service


Owner = Annotated[str, Depends(require_owner)]
Svc = Annotated[SandboxService, Depends(get_service)]


# ---------------------------------------------------------------- forwarding helpers


def _json_body(model: Any) -> bytes:
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
    timeout: httpx.Timeout = _QUICK,
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


def _filtered(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
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
    out.raw_headers = _filtered(raw)
    return out


def _check_length(request: Request, limit: int) -> None:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes")


async def _limited(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The request body, streamed; raises TooLarge once more than `limit` bytes arrived."""
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            raise TooLarge(f"body exceeds the limit of {limit} bytes")
        if chunk:
            yield chunk


def _has_body(request: Request) -> bool:
    cl = request.headers.get("content-length")
    return bool(cl and cl != "0") or "transfer-encoding" in request.headers


async def upload(
    request: Request, svc: SandboxService, owner: str, sid: str, path: str, ctype: str
) -> Response:
    limit = svc.config.max_upload_bytes
    _check_length(request, limit)
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
        content=_limited(request, limit),
        content_type=request.headers.get("content-type", ctype),
        timeout=_UNBOUNDED,
        length=length,
    )


def _pid(pid: str) -> str:
    if pid in (".", ".."):  # quote() keeps dots; the agent's mux would answer a 301 to "/"
        raise NotFound(f"no process {pid!r}")
    return quote(pid, safe="")


def _read_timeout(timeout_s: float | None) -> httpx.Timeout:
    return _UNBOUNDED if not timeout_s else httpx.Timeout(timeout_s + 30.0, connect=10.0)


# ---------------------------------------------------------------- routes: sandboxes

router = APIRouter(responses=_ERRORS)
SB = "/v1/sandboxes/{sandbox_id}"


@router.post("/v1/sandboxes", status_code=201, response_model=Sandbox, tags=["sandboxes"])
async def create_sandbox(body: SandboxCreate, owner: Owner, svc: Svc) -> Sandbox:
    if body.count != 1:
        raise InvalidRequest("count must be 1 here; use POST /v1/sandboxes/batch")
    return await svc.create(owner, body)


@router.post(
    "/v1/sandboxes/batch", status_code=201, response_model=BatchCreateResult, tags=["sandboxes"]
)
async def create_batch(body: SandboxCreate, owner: Owner, svc: Svc) -> BatchCreateResult:
    return await svc.create_batch(owner, body)


@router.get("/v1/sandboxes", response_model=SandboxList, tags=["sandboxes"])
async def list_sandboxes(
    owner: Owner, svc: Svc, label: Annotated[list[str] | None, Query()] = None
) -> SandboxList:
    wanted: dict[str, str] = {}
    for item in label or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidRequest(f"label filter must be key=value, got {item!r}")
        wanted[k] = v
    return SandboxList(sandboxes=await svc.list_sandboxes(owner, wanted))


@router.get(SB, response_model=Sandbox, tags=["sandboxes"])
async def get_sandbox(sandbox_id: str, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.get(owner, sandbox_id)


@router.delete(SB, status_code=204, tags=["sandboxes"])
async def delete_sandbox(sandbox_id: str, owner: Owner, svc: Svc) -> Response:
    await svc.delete(owner, sandbox_id)
    return Response(status_code=204)


@router.post(SB + "/timeout", response_model=Sandbox, tags=["sandboxes"])
async def set_timeout(sandbox_id: str, body: TimeoutUpdate, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.set_timeout(owner, sandbox_id, body.timeout_s)


@router.put(SB + "/network", response_model=Sandbox, tags=["sandboxes"])
async def set_network(sandbox_id: str, body: NetworkPolicy, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.set_network(owner, sandbox_id, body)


# ---------------------------------------------------------------- routes: exec & processes


@router.post(SB + "/exec", response_model=ExecResult, tags=["exec"])
async def exec_command(sandbox_id: str, body: ExecRequest, owner: Owner, svc: Svc) -> Response:
    t0 = time.perf_counter()
    try:
        return await forward(
            svc,
            owner,
            sandbox_id,
            "POST",
            "/exec",
            content=_json_body(body),
            timeout=_read_timeout(body.timeout_s),
        )
    finally:
        svc.metrics.exec_latency.observe(time.perf_counter() - t0)


_NDJSON: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/x-ndjson": {}}, "description": "StreamEvent lines"}
}
_BYTES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "raw bytes"}
}
_TAR: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/x-tar": {}, "application/gzip": {}},
        "description": "a tar stream of the folder's contents (gzip with gzip=true)",
    }
}


@router.post(SB + "/exec/stream", responses=_NDJSON, tags=["exec"])
async def exec_stream(
    sandbox_id: str, body: ExecRequest, owner: Owner, svc: Svc
) -> StreamingResponse:
    return await stream(
        svc,
        owner,
        sandbox_id,
        "POST",
        "/exec/stream",
        headers=[("Content-Type", "application/json")],
        content=_json_body(body),
    )


@router.post(SB + "/processes", status_code=201, response_model=ProcessInfo, tags=["processes"])
async def start_process(sandbox_id: str, body: ProcessStart, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/processes", content=_json_body(body))


@router.get(SB + "/processes", response_model=ProcessList, tags=["processes"])
async def list_processes(sandbox_id: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/processes")


@router.get(SB + "/processes/{pid}", response_model=ProcessInfo, tags=["processes"])
async def get_process(sandbox_id: str, pid: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", f"/processes/{_pid(pid)}")


@router.delete(SB + "/processes/{pid}", status_code=204, tags=["processes"])
async def delete_process(sandbox_id: str, pid: str, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "DELETE", f"/processes/{_pid(pid)}")


@router.get(SB + "/processes/{pid}/output", response_model=ProcessOutput, tags=["processes"])
async def process_output(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int | None, Query(ge=1)] = None,
    encoding: Annotated[str, Query(pattern="^(text|base64)$")] = "text",
) -> Response:
    path = f"/processes/{_pid(pid)}/output"
    return await forward(svc, owner, sandbox_id, "GET", path, params=request.query_params)


@router.get(SB + "/processes/{pid}/follow", responses=_NDJSON, tags=["processes"])
async def follow_process(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    stdout_offset: Annotated[int, Query(ge=0)] = 0,
    stderr_offset: Annotated[int, Query(ge=0)] = 0,
    encoding: Annotated[str, Query(pattern="^(text|base64)$")] = "text",
) -> StreamingResponse:
    path = f"/processes/{_pid(pid)}/follow"
    return await stream(svc, owner, sandbox_id, "GET", path, params=request.query_params)


@router.post(SB + "/processes/{pid}/stdin", status_code=204, tags=["processes"])
async def process_stdin(
    sandbox_id: str, pid: str, body: StdinWrite, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{_pid(pid)}/stdin"
    return await forward(svc, owner, sandbox_id, "POST", path, content=_json_body(body))


@router.post(SB + "/processes/{pid}/signal", status_code=204, tags=["processes"])
async def process_signal(
    sandbox_id: str, pid: str, body: SignalRequest, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{_pid(pid)}/signal"
    return await forward(svc, owner, sandbox_id, "POST", path, content=_json_body(body))


@router.post(SB + "/processes/{pid}/resize", status_code=204, tags=["processes"])
async def process_resize(
    sandbox_id: str, pid: str, body: ResizeRequest, owner: Owner, svc: Svc
) -> Response:
    path = f"/processes/{_pid(pid)}/resize"
    return await forward(svc, owner, sandbox_id, "POST", path, content=_json_body(body))


@router.get(SB + "/processes/{pid}/wait", response_model=ProcessInfo, tags=["processes"])
async def process_wait(
    request: Request,
    sandbox_id: str,
    pid: str,
    owner: Owner,
    svc: Svc,
    timeout_s: Annotated[float | None, Query(ge=0)] = None,
) -> Response:
    path = f"/processes/{_pid(pid)}/wait"
    return await forward(
        svc,
        owner,
        sandbox_id,
        "GET",
        path,
        params=request.query_params,
        timeout=_read_timeout(timeout_s),
    )


# ---------------------------------------------------------------- routes: files


@router.get(SB + "/files", responses=_BYTES, tags=["files"])
async def read_file(
    request: Request,
    sandbox_id: str,
    path: str,
    owner: Owner,
    svc: Svc,
    offset: Annotated[int | None, Query(ge=0)] = None,
    length: Annotated[int | None, Query(ge=0)] = None,
) -> StreamingResponse:
    return await stream(
        svc, owner, sandbox_id, "GET", "/files", params=request.query_params, download=True
    )


@router.put(SB + "/files", status_code=201, response_model=FileStat, tags=["files"])
async def write_file(
    request: Request,
    sandbox_id: str,
    path: str,
    owner: Owner,
    svc: Svc,
    mode: str | None = None,
    overwrite: bool | None = None,
) -> Response:
    return await upload(request, svc, owner, sandbox_id, "/files", "application/octet-stream")


@router.get(SB + "/files/stat", response_model=FileStat, tags=["files"])
async def stat_file(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/files/stat", params=request.query_params)


@router.get(SB + "/files/list", response_model=FileList, tags=["files"])
async def list_files(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await forward(svc, owner, sandbox_id, "GET", "/files/list", params=request.query_params)


@router.post(SB + "/files/mkdir", response_model=FileStat, tags=["files"])
async def mkdir(sandbox_id: str, body: MkdirRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/mkdir", content=_json_body(body))


@router.post(SB + "/files/remove", status_code=204, tags=["files"])
async def remove(sandbox_id: str, body: RemoveRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/remove", content=_json_body(body))


@router.post(SB + "/files/move", response_model=FileStat, tags=["files"])
async def move(sandbox_id: str, body: MoveRequest, owner: Owner, svc: Svc) -> Response:
    return await forward(svc, owner, sandbox_id, "POST", "/files/move", content=_json_body(body))


@router.put(SB + "/files/tar", response_model=TarResult, tags=["files"])
async def upload_tar(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> Response:
    return await upload(request, svc, owner, sandbox_id, "/files/tar", "application/x-tar")


@router.get(SB + "/files/tar", responses=_TAR, tags=["files"])
async def download_tar(
    request: Request, sandbox_id: str, path: str, owner: Owner, svc: Svc
) -> StreamingResponse:
    return await stream(
        svc, owner, sandbox_id, "GET", "/files/tar", params=request.query_params, download=True
    )


# ---------------------------------------------------------------- routes: port proxy

PORTS = SB + "/ports/{port}/{path:path}"
_SMALL_BODY = 1 << 20
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _proxy_query(conn: HTTPConnection) -> str:
    return urlencode([(k, v) for k, v in conn.query_params.multi_items() if k != KEY_QUERY])


async def port_proxy(
    request: Request,
    sandbox_id: str,
    port: Annotated[int, PathParam(ge=1, le=65535)],
    path: str,
    owner: Annotated[str, Depends(require_port_owner)],
    svc: Svc,
) -> StreamingResponse:
    limit = svc.config.max_upload_bytes
    _check_length(request, limit)
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in _filtered(request.headers.raw)
        if k.lower() != b"content-length"
    ]
    declared = request.headers.get("content-length", "")
    content: bytes | AsyncIterator[bytes] | None = None
    if declared.isdigit() and int(declared) <= _SMALL_BODY:
        # Small bodies keep their Content-Length (many servers reject chunked requests).
        content = await request.body()
    elif _has_body(request):
        content = _limited(request, limit)
    return await stream(
        svc,
        owner,
        sandbox_id,
        request.method,
        f"/proxy/{port}/{quote(path)}",
        params=_proxy_query(request),
        headers=headers,
        content=content,
        passthrough_errors=True,
    )


for _method in _METHODS:  # one operation per method, so OpenAPI operation ids stay unique
    router.add_api_route(
        PORTS,
        port_proxy,
        methods=[_method],
        tags=["ports"],
        operation_id=f"port_proxy_{_method.lower()}",
        response_class=StreamingResponse,
        responses={502: {"model": ErrorResponse, "description": "nothing listens on the port"}},
    )


async def _deny(ws: WebSocket, err: OrchardError, metrics: Metrics) -> None:
    metrics.errors.labels(err.code).inc()
    try:
        await ws.send_denial_response(JSONResponse(err.to_body(), status_code=err.status))
    except RuntimeError:
        await ws.close(code=1008, reason=err.code)


@router.websocket(PORTS)
async def port_proxy_ws(ws: WebSocket, sandbox_id: str, port: int, path: str) -> None:
    """Bridge a WebSocket to the sandbox's server through the agent's /proxy route."""
    svc: SandboxService = ws.app.state.service
    try:
        owner = _owner(ws, allow_query=True)
        agent = await svc.agent(owner, sandbox_id)
        upstream = await _ws_connect(svc, owner, agent, sandbox_id, port, path, ws)
    except OrchardError as e:
        await _deny(ws, e, svc.metrics)
        return
    async with upstream:
        await ws.accept(subprotocol=upstream.subprotocol)
        await _ws_relay(svc, sandbox_id, ws, upstream)


async def _ws_connect(
    svc: SandboxService,
    owner: str,
    agent: AgentClient,
    sid: str,
    port: int,
    path: str,
    ws: WebSocket,
) -> ClientConnection:
    query = _proxy_query(ws)
    target = f"/proxy/{port}/{quote(path)}" + (f"?{query}" if query else "")
    skip = NOT_FORWARDED | {"origin", "cookie"}
    headers = [
        (k, v)
        for k, v in ws.headers.items()
        if k not in skip and not k.startswith("sec-websocket-")
    ]
    headers.append(("Authorization", f"Bearer {svc.config.agent_token(sid)}"))
    if "cookie" in ws.headers:
        headers.append(("Cookie", ws.headers["cookie"]))
    protocols: Any = ws.scope.get("subprotocols") or None
    opts: dict[str, Any] = {
        "additional_headers": headers,
        "subprotocols": protocols,
        "origin": ws.headers.get("origin"),
        "max_size": None,
        "compression": None,
        "open_timeout": 10,
        "ping_interval": None,
    }
    try:
        if agent.socket_path:
            return await unix_connect(agent.socket_path, f"ws://agent{target}", **opts)
        base = agent.base_url.replace("http", "ws", 1)
        return await connect(base + target, **opts)
    except InvalidStatus as e:
        if e.response.status_code == 401:
            raise AgentUnavailable(f"sandbox {sid}: agent refused the token") from e
        raise Unavailable(
            f"sandbox {sid}: port {port} answered HTTP {e.response.status_code} to the upgrade"
        ) from e
    except (OSError, WebSocketException, TimeoutError) as e:
        raise await svc.agent_failed(owner, sid, e) from e


async def _ws_relay(
    svc: SandboxService, sid: str, ws: WebSocket, upstream: ClientConnection
) -> None:
    async def client_to_upstream() -> None:
        while True:
            msg = await ws.receive()
            svc.touch(sid)
            if msg["type"] == "websocket.disconnect":
                await upstream.close(code=msg.get("code", 1000) or 1000)
                return
            if msg.get("text") is not None:
                await upstream.send(msg["text"])
            elif msg.get("bytes") is not None:
                await upstream.send(msg["bytes"])

    async def upstream_to_client() -> None:
        try:
            async for data in upstream:
                svc.touch(sid)
                if isinstance(data, str):
                    await ws.send_text(data)
                else:
                    await ws.send_bytes(data)
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        with contextlib.suppress(RuntimeError, OSError):
            await ws.close(code=1000 if code in (1005, 1006) else code)

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t


# ---------------------------------------------------------------- service routes


@router.get("/healthz", response_model=Health, tags=["service"])
async def healthz(svc: Svc) -> Health:
    return Health(
        status="ok" if svc.last_reconcile_ok else "degraded",
        version=__version__,
        backend=svc.backend.name,
        sandboxes=svc.count(),
    )


@router.get("/metrics", tags=["service"], response_class=Response)
async def metrics(svc: Svc) -> Response:
    svc.metrics.set_states(svc.states())
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ---------------------------------------------------------------- errors


def _flat_routes(routes: Iterable[Any]) -> Iterator[Any]:
    for route in routes:
        inner = getattr(route, "original_router", None)  # FastAPI's wrapper of include_router
        yield from _flat_routes(inner.routes) if inner is not None else (route,)


def _allowed_methods(request: Request) -> list[str]:
    """The methods of the path template Starlette matched first (as routing does)."""
    scope = {**request.scope, "type": "http"}
    routes = list(_flat_routes(request.app.router.routes))
    first = next((r for r in routes if r.matches(scope)[0] != Match.NONE), None)
    if first is None:
        return []
    same = (r for r in routes if getattr(r, "path", None) == first.path)
    return sorted({m for r in same for m in getattr(r, "methods", None) or ()})


def _error_reply(metrics: Metrics, err: OrchardError, status: int | None = None) -> JSONResponse:
    metrics.errors.labels(err.code).inc()
    return JSONResponse(err.to_body(), status_code=status or err.status)


def _install_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def reply(err: OrchardError, status: int | None = None) -> JSONResponse:
        return _error_reply(metrics, err, status)

    async def on_orchard(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, OrchardError)
        return reply(exc)

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type")}
            for e in exc.errors()
        ]
        if any(e["type"] == "json_invalid" for e in errors):
            return reply(BadRequest("malformed JSON body", details={"errors": errors}))
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return reply(InvalidRequest(f"{where}: {first['msg']}", details={"errors": errors}))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            err: OrchardError = NotFound(f"no route {request.method} {request.url.path}")
        else:
            err = OrchardError(str(exc.detail))
            # 400: a body FastAPI could not parse at all (e.g. invalid UTF-8 in JSON).
            err.code = {400: "bad_request", 405: "method_not_allowed"}.get(  # type: ignore[misc]
                exc.status_code, "http_error"
            )
        resp = reply(err, exc.status_code)
        if exc.status_code == 405:
            # RFC 9110: list every method of the path; Starlette names only one route's.
            resp.headers["Allow"] = ", ".join(_allowed_methods(request))
        elif exc.headers:
            resp.headers.update(exc.headers)
        return resp

    async def on_any(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return reply(OrchardError("internal error"), 500)

    app.add_exception_handler(OrchardError, on_orchard)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_any)


# ---------------------------------------------------------------- logs

_KEY_IN_QUERY = re.compile(rf"({KEY_QUERY}=)[^&\s\"]*")


class RedactKeys(logging.Filter):
    """Blank `orchard_key=...` in uvicorn's access log: API keys never reach a log line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if KEY_QUERY in message:
            record.msg, record.args = _KEY_IN_QUERY.sub(r"\1[redacted]", message), ()
        return True


_REDACT = RedactKeys()


# ---------------------------------------------------------------- body limit

# JSON bodies are read whole into memory before validation, so they are bounded here (the
# agent's own limit); uploads and the port proxy stream and have their own limit.
MAX_JSON_BODY = 16 << 20


def _streams_body(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    if "/ports/" in path:
        return True
    return scope.get("method") == "PUT" and path.endswith(("/files", "/files/tar"))


class JsonBodyLimit:
    """Answer 413 `too_large` to a buffered body over MAX_JSON_BODY before holding it all."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = TooLarge(f"request body over {MAX_JSON_BODY} bytes")
        self.metrics.errors.labels(err.code).inc()
        await JSONResponse(err.to_body(), status_code=err.status)(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _streams_body(scope):
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit():
            if int(declared) > MAX_JSON_BODY:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length (chunked): take it in up to the limit, then hand it on in one piece.
        body, more = bytearray(), True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if len(body) > MAX_JSON_BODY:
                await self._refuse(scope, receive, send)
                return
            more = msg.get("more_body", False)
        first: Message | None = {"type": "http.request", "body": bytes(body), "more_body": False}

        async def replay() -> Message:
            nonlocal first
            if first is not None:
                msg, first = first, None
                return msg
            return await receive()

        await self.app(scope, replay, send)


# ---------------------------------------------------------------- exec fast path

_EXEC_PATH = re.compile(r"/v1/sandboxes/([^/]+)/exec")


class ExecFastPath:
    """Serve `POST .../exec`, the hot route of an agent loop, without FastAPI's routing,
    dependency solving and inner middleware: service CPU per exec 0.82-0.93 -> 0.53-0.55 ms.

    Only a request the route accepts as is takes this path: JSON content type, a valid key,
    a body that ExecRequest accepts. Anything else goes on to the app with its body
    replayed, so every refusal is still the route's own answer. From the agent call on,
    errors are answered here the way the handlers answer them, never by the app: the
    command must not run twice. The route itself stays (OpenAPI, and the fallback).
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _EXEC_PATH.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:  # JsonBodyLimit, outside, has bounded it already
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        accepted = self._accept(scope, body)
        if accepted is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        owner, svc, request = accepted
        try:
            response = await exec_command(match.group(1), request, owner, svc)
        except OrchardError as err:
            response = _error_reply(self.metrics, err)
        except Exception as exc:
            log.error("unhandled error on POST %s", scope["path"], exc_info=exc)
            response = _error_reply(self.metrics, OrchardError("internal error"), 500)
        await response(scope, receive, send)

    @staticmethod
    def _accept(scope: Scope, body: bytes) -> tuple[str, SandboxService, ExecRequest] | None:
        conn = HTTPConnection(scope)
        ctype = conn.headers.get("content-type", "")
        if ctype.partition(";")[0].strip().lower() != "application/json":
            return None
        service: SandboxService | None = getattr(conn.app.state, "service", None)
        owner = conn.app.state.config.owner_for(_api_key(conn, allow_query=False))
        if service is None or owner is None:
            return None
        try:
            return owner, service, ExecRequest.model_validate(json.loads(body))
        except (ValueError, ValidationError):  # the route answers 400/422 in its own words
            return None


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


# ---------------------------------------------------------------- app


def make_backend(config: ServiceConfig) -> Backend:
    name = config.backend
    if name == "auto":  # docker when an engine answers, else local (root + runc)
        from orchard.env.backends.select import auto_backend

        name = auto_backend()
    if name in ("docker", "local"):
        from orchard.env.agent_client import locate_agent_binary

        binary = Path(config.agent_binary) if config.agent_binary else locate_agent_binary()
        if name == "local":
            from orchard.env.backends.local import LocalBackend

            return LocalBackend(config.state_dir, binary, extra_labels=config.extra_labels)
        from orchard.env.backends.docker import DockerBackend

        return DockerBackend(config.state_dir, binary, extra_labels=config.extra_labels)
    if name == "kubernetes":
        from orchard.env.backends.k8s_objects import KubernetesOptions
        from orchard.env.backends.kubernetes import KubernetesBackend

        # Cluster settings come from ORCHARD_K8S_* (docs/kubernetes.md).
        opts = KubernetesOptions.from_env()
        opts.extra_labels.update(
            {k.replace("orchard.", "orchard.dev/", 1): v for k, v in config.extra_labels.items()}
        )
        return KubernetesBackend(opts)
    raise InvalidRequest(
        f"unknown backend {config.backend!r} (available: auto, docker, local, kubernetes)"
    )


def create_app(config: ServiceConfig, backend: Backend | None = None) -> FastAPI:
    """The service as an ASGI app; its lifespan starts the service and the reconcile loop."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Added here, after uvicorn configured its loggers (it is idempotent).
        logging.getLogger("uvicorn.access").addFilter(_REDACT)
        try:
            service = SandboxService(config, backend or make_backend(config), metrics)
            await service.start()
        except BaseException as e:
            app.state.startup_error = e
            raise
        app.state.service = service
        try:
            yield
        finally:
            await service.stop(delete_created=app.state.delete_on_close)

    app = FastAPI(
        title="Orchard Env",
        version=__version__,
        description="Sandboxes for LLM agents (docs/rest-api.md).",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.delete_on_close = False
    app.state.startup_error = None
    _install_error_handlers(app, metrics)
    app.add_middleware(ExecFastPath, metrics=metrics)
    app.add_middleware(JsonBodyLimit, metrics=metrics)  # outermost: bounds the fast path too
    app.include_router(router)
    return app


def _unix_socket(path: str) -> socket.socket:
    """Bind a Unix socket only its owner may use (uvicorn's own would be 0666)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(2048)
    return sock


def serve(
    config: ServiceConfig,
    host: str | None = "127.0.0.1",
    port: int = 8080,
    uds: str | None = None,
    *,
    log_level: str = "info",
) -> None:
    """Run the service until interrupted (`orchard serve`); refuses unsafe binds first."""
    config.check_bind(None if uds else host, uds)
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host or "127.0.0.1",
            port=port,
            log_level=log_level,
            server_header=False,
            lifespan="on",  # a failed startup must stop the server, not serve without state
        )
    )
    if uds:
        server.run(sockets=[_unix_socket(uds)])
    else:
        server.run()


class EmbeddedService:
    """The service in a background thread on a private Unix socket (the SDK's no-URL mode).

    Auth is off unless `keep_api_keys` (the socket is 0600 in a 0700 temp folder); sandboxes
    it created are deleted on close only when asked, so scripts may leave work running.
    """

    def __init__(
        self,
        config: ServiceConfig | None = None,
        *,
        backend: Backend | None = None,
        delete_on_close: bool = False,
        keep_api_keys: bool = False,
        log_level: str = "warning",
    ) -> None:
        base = config or ServiceConfig.from_env()
        self.config = base if keep_api_keys else replace(base, api_keys={})
        self.delete_on_close = delete_on_close
        self._dir = Path(tempfile.mkdtemp(prefix="orchard-"))
        self.socket_path = str(self._dir / "orchard.sock")
        self.base_url = "http://orchard"
        self.app = create_app(self.config, backend)
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level=log_level, lifespan="on", server_header=False)
        )
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 30.0) -> EmbeddedService:
        """Start serving on `socket_path`; returns self."""
        sock = _unix_socket(self.socket_path)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
            name="orchard-embedded",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                err = self.app.state.startup_error
                self.stop()
                raise Unavailable(f"embedded Orchard service did not start: {err or 'timeout'}")
            time.sleep(0.005)
        return self

    def stop(self, delete_sandboxes: bool | None = None) -> None:
        """Stop serving; delete this instance's sandboxes if asked (here or at init)."""
        delete = self.delete_on_close if delete_sandboxes is None else delete_sandboxes
        self.app.state.delete_on_close = delete
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        shutil.rmtree(self._dir, ignore_errors=True)

    close = stop

    def __enter__(self) -> EmbeddedService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
