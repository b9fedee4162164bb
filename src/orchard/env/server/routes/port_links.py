"""Port links: short-lived URLs for browsers that reach one port of one sandbox (hole 5).

A page served through `.../ports/{port}/?orchard_key=...` has the API key in its URL, so
its Referer and its scripts carry it. A link instead puts a token in the path prefix:
`/p/{sandbox}.{port}.{expiry}.{tag}{mac}/...`: `tag` names the owner (an HMAC of the
service secret over the owner: 16 hex digits), `mac` is an HMAC-SHA256 of the secret over
the sandbox, port, expiry and tag. It opens nothing else and expires by itself; any
replica can check it (nothing is stored). An invalid, expired or foreign token is a 404,
like an unknown sandbox.

The MAC is checked first, in constant time and with no lookup, so a forged token costs
the same whether its sandbox exists or not (issue 31, hole 5); only a genuine token looks
the sandbox up, and its owner must still be the tag's (a sandbox id another owner holds
now, or a link minted by another tenant for it, is a 404).
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


TAG_HEX, MAC_HEX = 16, 32


def _hmac(svc: SandboxService, *parts: object) -> str:
    msg = "\0".join(map(str, parts)).encode()
    return hmac.new(svc.config.secret, msg, hashlib.sha256).hexdigest()


def _tag(svc: SandboxService, owner: str) -> str:
    return _hmac(svc, "port-link-owner", owner)[:TAG_HEX]


def _mac(svc: SandboxService, sid: str, port: int, exp: int, tag: str) -> str:
    return _hmac(svc, "port-link", sid, port, exp, tag)[:MAC_HEX]


@router.post(SB + "/port-links", status_code=201, response_model=PortLink)
async def create_port_link(
    sandbox_id: str, body: PortLinkCreate, owner: Owner, svc: Svc
) -> PortLink:
    """A link to `port` of this sandbox for `ttl_s` seconds, usable without the API key."""
    await svc.get(owner, sandbox_id)
    exp = int(time.time() + body.ttl_s)
    tag = _tag(svc, owner)
    token = f"{sandbox_id}.{body.port}.{exp}.{tag}{_mac(svc, sandbox_id, body.port, exp, tag)}"
    return PortLink(url=f"/p/{token}/", token=token, expires_at=datetime.fromtimestamp(exp, UTC))


def _number(text: str, digits: int) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and len(text) <= digits else None


async def _resolve(svc: SandboxService, token: str) -> tuple[str, str, int]:
    """(owner, sandbox id, port) of a valid token, else NotFound.

    The MAC first (constant time, no lookup), then the expiry, then the owner."""
    sid, _, rest = token.partition(".")
    port_s, _, rest = rest.partition(".")
    exp_s, _, sig = rest.partition(".")
    tag, mac = sig[:TAG_HEX], sig[TAG_HEX:]
    port, exp = _number(port_s, 5), _number(exp_s, 12)
    gone = NotFound("no such port link (or it expired)")
    if port is None or exp is None or len(mac) != MAC_HEX or not sig.isascii():
        raise gone
    if not hmac.compare_digest(_mac(svc, sid, port, exp, tag), mac) or exp < time.time():
        raise gone
    owner = await svc.owner_of(sid)
    if owner is None or not hmac.compare_digest(_tag(svc, owner), tag):
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
