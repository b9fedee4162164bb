"""Port links: short-lived URLs for browsers that reach one port of one sandbox (hole 5).

A page served through `.../ports/{port}/?orchard_key=...` has the API key in its URL, so
its Referer and its scripts carry it. A link instead puts a token in the path prefix:
`/p/{sandbox}.{port}.{expiry}.{mac}/...`, the MAC an HMAC-SHA256 of the service secret
over the sandbox, port, expiry and owner. It opens nothing else and expires by itself;
any replica can check it (nothing is stored). An invalid, expired or foreign token is a
404, like an unknown sandbox.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from datetime import UTC, datetime

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import StreamingResponse

from orchard.env.errors import NotFound, OrchardError
from orchard.env.models import PortLink, PortLinkCreate
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.routes._common import ERRORS, SB
from orchard.env.server.routes.ports import METHODS, bridge_ws, deny, relay_port
from orchard.env.server.service import SandboxService

router = APIRouter(responses=ERRORS, tags=["ports"])
LINK = "/p/{token}/{path:path}"


def _mac(svc: SandboxService, sid: str, port: int, exp: int, owner: str) -> str:
    msg = f"port-link\0{sid}\0{port}\0{exp}\0{owner}".encode()
    return hmac.new(svc.config.secret, msg, hashlib.sha256).hexdigest()[:32]


@router.post(SB + "/port-links", status_code=201, response_model=PortLink)
async def create_port_link(
    sandbox_id: str, body: PortLinkCreate, owner: Owner, svc: Svc
) -> PortLink:
    """A link to `port` of this sandbox for `ttl_s` seconds, usable without the API key."""
    await svc.get(owner, sandbox_id)
    exp = int(time.time() + body.ttl_s)
    token = f"{sandbox_id}.{body.port}.{exp}.{_mac(svc, sandbox_id, body.port, exp, owner)}"
    return PortLink(url=f"/p/{token}/", token=token, expires_at=datetime.fromtimestamp(exp, UTC))


async def _resolve(svc: SandboxService, token: str) -> tuple[str, str, int]:
    """(owner, sandbox id, port) of a valid token, else NotFound."""
    sid, _, rest = token.partition(".")
    port_s, _, rest = rest.partition(".")
    exp_s, _, mac = rest.partition(".")
    gone = NotFound("no such port link (or it expired)")
    if not (port_s.isdigit() and exp_s.isdigit() and mac) or int(exp_s) < time.time():
        raise gone
    owner = await svc.owner_of(sid)
    port, exp = int(port_s), int(exp_s)
    if owner is None or not hmac.compare_digest(_mac(svc, sid, port, exp, owner), mac):
        raise gone
    return owner, sid, port


async def port_link(request: Request, token: str, path: str, svc: Svc) -> StreamingResponse:
    owner, sid, port = await _resolve(svc, token)
    return await relay_port(request, svc, owner, sid, port, path)


for _method in METHODS:
    router.add_api_route(
        LINK,
        port_link,
        methods=[_method],
        operation_id=f"port_link_{_method.lower()}",
        response_class=StreamingResponse,
    )


@router.websocket(LINK)
async def port_link_ws(ws: WebSocket, token: str, path: str) -> None:
    svc: SandboxService = ws.app.state.service
    try:
        owner, sid, port = await _resolve(svc, token)
    except OrchardError as e:
        await deny(ws, e, svc.metrics)
        return
    await bridge_ws(ws, svc, owner, sid, port, path)
