"""Traffic to a sandbox's other ports (`E2b-Sandbox-Port` other than envd's 49983), such
as the code interpreter's Jupyter server on 49999: relayed by Orchard's port proxy.

A request routed to a sandbox and a port other than envd's matches here whatever its
path, before envd's own routes (only Orchard's own paths, `/v1/...`, `/healthz`,
`/metrics`, `/p/...`, `/openapi.json`, `/docs`, `/redoc`, come first). It needs the
sandbox's envd token or its traffic token (`E2B-Traffic-Access-Token`, which the
control API hands out and the SDKs send); neither, nor E2B's routing headers, reaches
the sandbox's server, so code in the sandbox never learns a token that opens envd.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Scope

from orchard.env.errors import OrchardError
from orchard.env.server.e2b.access import (
    ENVD_PORT,
    PORT_HEADER,
    SANDBOX_HEADER,
    TOKEN_HEADER,
    TRAFFIC_HEADER,
    admit,
    port_of,
    target,
)
from orchard.env.server.e2b.connect import CODE_STATUS, RpcError, from_orchard
from orchard.env.server.routes.ports import METHODS, relay_port

_KEPT_OUT = {h.encode() for h in (SANDBOX_HEADER, PORT_HEADER, TOKEN_HEADER, TRAFFIC_HEADER)}


def _other_port(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    found = target(scope)
    return found is not None and found[1] != str(ENVD_PORT)


class PortRoute(APIRoute):
    """Matches only requests routed to a sandbox port other than envd's."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if not _other_port(scope):
            return Match.NONE, {}
        return super().matches(scope)


def _error(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def to_port(request: Request, path: str) -> Response:
    try:
        envd = await admit(request)
        port = port_of(request)
        scope: dict[str, Any] = dict(request.scope)
        scope["headers"] = [(k, v) for k, v in request.scope["headers"] if k not in _KEPT_OUT]
        try:
            return await relay_port(
                Request(scope, request.receive), envd.svc, envd.owner, envd.sandbox_id, port, path
            )
        except OrchardError as e:
            raise from_orchard(e, envd.sandbox_id) from e
    except RpcError as e:
        # A sandbox that is not running is E2B's proxy's 502 "was not found".
        return _error(502 if e.code == "unavailable" else CODE_STATUS[e.code], e.message)


router = APIRouter(include_in_schema=False)
router.routes.append(PortRoute("/{path:path}", to_port, methods=METHODS, include_in_schema=False))
