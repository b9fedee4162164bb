"""The port proxy: HTTP and WebSocket to a server listening inside the sandbox.

Reached at `.../ports/{port}/{path}` through the agent's `/proxy` route; the key may
come in the query (`orchard_key`) for clients that can only be given a URL, and is
stripped before anything is passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import quote, unquote, urlencode

from fastapi import APIRouter, Request, WebSocket
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import HTTPConnection
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from orchard.env.errors import AgentUnavailable, BadRequest, OrchardError, Unavailable
from orchard.env.models import ErrorResponse
from orchard.env.server.agent_client import AgentClient
from orchard.env.server.auth import KEY_QUERY, PortOwner, Svc, api_key, authorize
from orchard.env.server.metrics import Metrics
from orchard.env.server.redact import redact
from orchard.env.server.relay import check_length, filtered, has_body, limited, stream
from orchard.env.server.routes._common import ERRORS, SB
from orchard.env.server.service import SandboxService
from orchard.env.wire import NOT_FORWARDED

router = APIRouter(responses=ERRORS, tags=["ports"])
PORTS = SB + "/ports/{port}/{path:path}"
_SMALL_BODY = 1 << 20
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _proxy_query(conn: HTTPConnection) -> str:
    return urlencode([(k, v) for k, v in conn.query_params.multi_items() if k != KEY_QUERY])


def check_path(conn: HTTPConnection, path: str) -> None:
    """Refuse `.`/`..` segments, however spelled (`%2e`), in the path a sandbox server gets.

    Joined into the agent's `/proxy/{port}/...` URL, `../../exec` would be resolved (by the
    HTTP client) to the agent's own routes, called with the service's token (hole 6).
    """
    raw = conn.scope.get("raw_path") or b""
    for candidate in (path, unquote(raw.decode("latin-1"))):
        if any(seg in (".", "..") for seg in candidate.replace("\\", "/").split("/")):
            raise BadRequest("dot segments ('.', '..', '%2e') are not allowed in a port path")


def scrub_headers(conn: HTTPConnection, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drop what would hand an API key to sandbox code: a Referer or cookie carrying
    `orchard_key`, and any header holding the caller's key (hole 5)."""
    key = api_key(conn, allow_query=True) or ""
    out = []
    for name, value in headers:
        low = name.lower()
        if low == "cookie":
            value = ";".join(c for c in value.split(";") if not _cookie_has_key(c, key)).strip()
        if not value or (key and key in value) or (low == "referer" and redact(value) != value):
            continue
        out.append((name, value))
    return out


def _cookie_has_key(cookie: str, key: str) -> bool:
    name, _, val = cookie.strip().partition("=")
    return unquote(name) == KEY_QUERY or KEY_QUERY in unquote(val) or bool(key and key in val)


async def port_proxy(
    request: Request,
    sandbox_id: str,
    port: Annotated[int, PathParam(ge=1, le=65535)],
    path: str,
    owner: PortOwner,
    svc: Svc,
) -> StreamingResponse:
    return await relay_port(request, svc, owner, sandbox_id, port, path)


async def relay_port(
    request: Request, svc: SandboxService, owner: str, sandbox_id: str, port: int, path: str
) -> StreamingResponse:
    """Relay one HTTP request to `port` in the sandbox (the port proxy and port links)."""
    check_path(request, path)
    limit = svc.config.max_upload_bytes
    check_length(request, limit)
    raw = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in filtered(request.headers.raw)
        if k.lower() != b"content-length"
    ]
    headers = scrub_headers(request, raw)
    declared = request.headers.get("content-length", "")
    content: bytes | AsyncIterator[bytes] | None = None
    if declared.isdigit() and int(declared) <= _SMALL_BODY:
        # Small bodies keep their Content-Length (many servers reject chunked requests).
        content = await request.body()
    elif has_body(request):
        content = limited(request, limit)
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


for _method in METHODS:  # one operation per method, so OpenAPI operation ids stay unique
    router.add_api_route(
        PORTS,
        port_proxy,
        methods=[_method],
        operation_id=f"port_proxy_{_method.lower()}",
        response_class=StreamingResponse,
        responses={502: {"model": ErrorResponse, "description": "nothing listens on the port"}},
    )


async def deny(ws: WebSocket, err: OrchardError, metrics: Metrics) -> None:
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
        owner = authorize(ws, allow_query=True)
    except OrchardError as e:
        await deny(ws, e, svc.metrics)
        return
    await bridge_ws(ws, svc, owner, sandbox_id, port, path)


async def bridge_ws(
    ws: WebSocket, svc: SandboxService, owner: str, sandbox_id: str, port: int, path: str
) -> None:
    """Bridge an authorized WebSocket to `port` in the sandbox (the port proxy and links)."""
    try:
        check_path(ws, path)
        if not 1 <= port <= 65535:
            raise BadRequest(f"port must be 1-65535, got {port}")
        agent = await svc.agent(owner, sandbox_id)
        upstream = await _ws_connect(svc, owner, agent, sandbox_id, port, path, ws)
    except OrchardError as e:
        await deny(ws, e, svc.metrics)
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
    skip = NOT_FORWARDED | {"origin"}
    headers = scrub_headers(
        ws,
        [
            (k, v)
            for k, v in ws.headers.items()
            if k not in skip and not k.startswith("sec-websocket-")
        ],
    )
    headers.append(("Authorization", f"Bearer {svc.config.agent_token(sid)}"))
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
