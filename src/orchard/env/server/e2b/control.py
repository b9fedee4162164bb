"""E2B's control API (`E2B_API_URL`) on Orchard's service: create, list, get, kill,
timeout, refresh, connect, pause and resume.

Every call goes through `SandboxService` with the caller's API key (`X-API-KEY`, as the
SDK sends it, or a bearer token) and so gets the tenancy, quotas, admission and limits
of Orchard's own routes. Answers and errors are E2B's shapes (shapes.py): the SDK maps
an error by its status to its own exception types.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from orchard.env.errors import (
    AgentUnavailable,
    InvalidRequest,
    NotFound,
    NotSupported,
    OrchardError,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from orchard.env.models import Sandbox, SandboxCreate
from orchard.env.server import state
from orchard.env.server.auth import authorize, service_of
from orchard.env.server.e2b import shapes
from orchard.env.server.e2b.access import envd_token
from orchard.env.server.e2b.connect import RpcError, bounded_body
from orchard.env.server.routes.sandboxes import while_connected
from orchard.env.server.service import SandboxService

router = APIRouter(include_in_schema=False)
MAX_PAGE = 1000
READY_PROBE = httpx.Timeout(5.0, connect=5.0)


class Call:
    """One admitted control call: the service and the caller's owner."""

    def __init__(self, request: Request) -> None:
        svc = service_of(request)
        if svc is None:
            raise InvalidRequest("the service has not started")
        self.svc: SandboxService = svc
        self.owner = authorize(request)
        self.request = request

    def token(self, sandbox_id: str) -> str:
        return envd_token(self.svc.config.secret, self.owner, sandbox_id)

    def created(self, sandbox: Sandbox) -> dict[str, Any]:
        """E2B's `Sandbox` for one of the caller's, with its envd and traffic tokens."""
        secret = self.svc.config.secret
        traffic = envd_token(secret, self.owner, sandbox.id, kind="traffic")
        return shapes.created(sandbox, self.token(sandbox.id), traffic)

    async def body(self) -> dict[str, Any]:
        try:
            raw = await bounded_body(self.request)
        except RpcError as e:
            raise TooLarge(e.message) from None
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise InvalidRequest("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        return body

    async def live(self, sandbox_id: str) -> Sandbox:
        """The caller's sandbox as E2B sees it: an exited one is not found."""
        sandbox = await self.svc.get(self.owner, sandbox_id)
        if shapes.state_of(sandbox) is None:
            raise NotFound(f"sandbox {sandbox_id!r} is not running")
        return sandbox


Handler = Callable[[Call], Awaitable[Response]]


def route(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Admit the call, run the handler, answer any failure in E2B's error shape."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(Call(request))
        except Unauthorized as e:
            return shapes.error(401, e.message)
        except ValidationError as e:
            first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return shapes.error(400, f"{where}: {first.get('msg')}")
        except OrchardError as e:
            return shapes.from_orchard(e, request.scope.get("e2b_template"))

    return endpoint


def json_answer(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(data, status_code=status, headers=headers)


def seconds(value: Any, default: float | None = None) -> float | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidRequest("timeout must be a number of seconds, at least 0")
    return float(max(1, value))


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"{what} must map strings to strings")
    return value


# ---------------------------------------------------------------- create / connect


async def find_snapshot(call: Call, template_id: str) -> str | None:
    """The caller's snapshot a template id names (E2B starts sandboxes from snapshots as
    from templates), by id or name, if any."""
    try:
        snaps = await state.list_snapshots(call.svc, call.owner)
    except NotSupported:  # a backend without snapshots: every template is an image
        return None
    return next((s.id for s in snaps if template_id in (s.id, s.name)), None)


async def create(call: Call) -> Response:
    body = await call.body()
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise InvalidRequest("templateID is required")
    call.request.scope["e2b_template"] = template
    metadata = _strings(body.get("metadata"), "metadata")
    if any(k.startswith(shapes.LABEL_PREFIX) for k in metadata):
        raise InvalidRequest(f"metadata keys starting with {shapes.LABEL_PREFIX!r} are reserved")
    snapshot = None if template in shapes.templates() else await find_snapshot(call, template)
    req = SandboxCreate(
        image="" if snapshot else shapes.image_for(template),
        snapshot=snapshot,
        # A template's own start command runs, as E2B's do (the kubernetes backend does
        # not read image configs, so there none runs).
        cmd=None if snapshot or call.svc.backend.name == "kubernetes" else [],
        timeout_s=seconds(body.get("timeout")) or shapes.DEFAULT_TIMEOUT_S,
        env=_strings(body.get("envVars"), "envVars"),
        labels={**metadata, shapes.TEMPLATE_LABEL: template},
        network=shapes.network_policy(body),
    )
    port = shapes.ready_ports().get(template)
    sandbox = await while_connected(call.request, _create_ready(call, req, port))
    return json_answer(call.created(sandbox), 201)


async def _create_ready(call: Call, req: SandboxCreate, port: int | None) -> Sandbox:
    """Create, then (for a template with a ready port) wait until its server answers
    there, as E2B's create returns once a template's start command is ready. A sandbox
    that never gets ready, or whose create is cancelled meanwhile, is removed."""
    sandbox = await call.svc.create(call.owner, req)
    if port is None:
        return sandbox
    try:
        await _wait_port(call, sandbox.id, port)
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(OrchardError):
            await call.svc.delete(call.owner, sandbox.id)
        raise
    return sandbox


async def _wait_port(call: Call, sandbox_id: str, port: int) -> None:
    limit = call.svc.config.ready_timeout_s
    deadline = time.monotonic() + limit
    agent = await call.svc.agent(call.owner, sandbox_id)
    while True:
        with contextlib.suppress(AgentUnavailable):
            answer = await agent.call("GET", f"/proxy/{port}/", timeout=READY_PROBE)
            if not (answer.status == 502 and b"bad_gateway" in answer.content):
                return
        if time.monotonic() > deadline:
            raise Unavailable(f"nothing answered on the template's port {port} within {limit:g} s")
        await asyncio.sleep(0.1)


async def connect(call: Call) -> Response:
    """Resume a paused sandbox (201) or keep a running one (200); a `timeout` only ever
    lengthens its life, as E2B's does."""
    sid = call.request.path_params["sandbox_id"]
    body = await call.body()
    timeout = seconds(body.get("timeout"))
    sandbox = await call.live(sid)
    status = 200
    if sandbox.status == "paused":
        sandbox = await state.resume(call.svc, call.owner, sid)
        status = 201
    if timeout and sandbox.expires_at.timestamp() < time.time() + timeout:
        sandbox = await call.svc.set_timeout(call.owner, sid, timeout)
    return json_answer(call.created(sandbox), status)


# ---------------------------------------------------------------- list / get / kill


def _metadata_filter(raw: str) -> dict[str, str]:
    """The SDK's `metadata` query: `k=v&k2=v2`, each key and value quoted once more."""
    pairs = urllib.parse.parse_qsl(raw, keep_blank_values=True)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def _wanted_states(params: Any) -> set[str]:
    states = {s for raw in params.getlist("state") for s in raw.split(",") if s}
    return states or {"running", "paused"}


async def _listed(call: Call) -> list[Sandbox]:
    params = call.request.query_params
    wanted = _metadata_filter(params.get("metadata", ""))
    states = _wanted_states(params)
    template = params.get("template")
    out = []
    for sb in await call.svc.list_sandboxes(call.owner):
        meta = shapes.metadata_of(sb)
        if shapes.state_of(sb) not in states:
            continue
        if any(meta.get(k) != v for k, v in wanted.items()):
            continue
        if template and template not in (shapes.template_of(sb), sb.image):
            continue
        out.append(sb)
    if params.get("order") == "desc":
        out.reverse()
    return out


async def list_v1(call: Call) -> Response:
    return json_answer([shapes.listed(sb) for sb in await _listed(call)])


async def list_v2(call: Call) -> Response:
    """One page: `limit` (at most 1000) from after `nextToken` (the last id sent);
    `x-next-token` names the last of this page while more follow."""
    params = call.request.query_params
    limit = params.get("limit", "100")
    if not limit.isdigit() or not 0 < int(limit) <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1 to {MAX_PAGE}")
    items = await _listed(call)
    after = params.get("nextToken")
    if after:
        ids = [sb.id for sb in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[: int(limit)]
    headers = {"x-next-token": page[-1].id} if len(items) > len(page) else None
    return json_answer([shapes.listed(sb) for sb in page], headers=headers)


async def get(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    return json_answer(shapes.detail(await call.live(sid), call.token(sid)))


async def kill(call: Call) -> Response:
    await call.svc.delete(call.owner, call.request.path_params["sandbox_id"])
    return Response(status_code=204)


# ---------------------------------------------------------------- lifetime


async def set_timeout(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    timeout = seconds((await call.body()).get("timeout"))
    if timeout is None:
        raise InvalidRequest("timeout is required")
    await call.live(sid)
    await call.svc.set_timeout(call.owner, sid, timeout)
    return Response(status_code=204)


async def refresh(call: Call) -> Response:
    """Keep the sandbox alive `duration` seconds more from now (never shorter)."""
    sid = call.request.path_params["sandbox_id"]
    duration = seconds((await call.body()).get("duration"), 60.0) or 60.0
    sandbox = await call.live(sid)
    if sandbox.expires_at.timestamp() < time.time() + duration:
        await call.svc.set_timeout(call.owner, sid, duration)
    return Response(status_code=204)


async def pause(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    sandbox = await call.live(sid)
    if sandbox.status == "paused":
        return shapes.error(409, f"sandbox {sid} is already paused")
    await state.pause(call.svc, call.owner, sid)
    return Response(status_code=204)


async def resume(call: Call) -> Response:
    sid = call.request.path_params["sandbox_id"]
    body = await call.body()
    sandbox = await call.live(sid)
    if sandbox.status != "paused":
        return shapes.error(409, f"sandbox {sid} is not paused")
    sandbox = await state.resume(call.svc, call.owner, sid)
    timeout = seconds(body.get("timeout"))
    if timeout:
        sandbox = await call.svc.set_timeout(call.owner, sid, timeout)
    return json_answer(call.created(sandbox), 201)


async def metrics(call: Call) -> Response:
    await call.live(call.request.path_params["sandbox_id"])
    return json_answer([])


SB = "/sandboxes/{sandbox_id}"
for _path, _method, _handler in (
    ("/sandboxes", "POST", create),
    ("/v2/sandboxes", "POST", create),
    ("/sandboxes", "GET", list_v1),
    ("/v2/sandboxes", "GET", list_v2),
    (SB, "GET", get),
    (SB, "DELETE", kill),
    (SB + "/timeout", "POST", set_timeout),
    (SB + "/refreshes", "POST", refresh),
    (SB + "/connect", "POST", connect),
    ("/v2" + SB + "/connect", "POST", connect),
    (SB + "/pause", "POST", pause),
    (SB + "/resume", "POST", resume),
    (SB + "/metrics", "GET", metrics),
):
    router.add_api_route(_path, route(_handler), methods=[_method])
