"""Who is calling: the API key (bearer, X-API-Key, or `orchard_key` for port URLs) -> owner;
a dashboard session token (bearer or X-API-Key only) -> the owner whose key made it.

`authorize` is the one check: the routes' dependencies, the WebSocket port proxy and the
exec fast path all call it, so a request is let in (or refused) the same way everywhere.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.requests import HTTPConnection

from orchard.env.config import ServiceConfig
from orchard.env.errors import Unauthorized
from orchard.env.server.service import SandboxService
from orchard.env.server.ui.sessions import SessionStore

KEY_QUERY = "orchard_key"


def api_key(conn: HTTPConnection, *, allow_query: bool) -> str | None:
    """The key a request carries; the query form only where a URL is all a client can send."""
    auth = conn.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    if conn.headers.get("x-api-key"):
        return conn.headers["x-api-key"].strip()
    if allow_query:
        return conn.query_params.get(KEY_QUERY)
    return None


def authorize(conn: HTTPConnection, *, allow_query: bool = False) -> str:
    """The owner the request's key belongs to; raises Unauthorized (401) for none or a bad one.

    A dashboard session token (`ui/sessions.py`) counts as its owner's key, but only in a
    header: it is never accepted from a URL.
    """
    config: ServiceConfig = conn.app.state.config
    owner = config.owner_for(api_key(conn, allow_query=allow_query))
    if owner is None:
        sessions: SessionStore | None = getattr(conn.app.state, "ui_sessions", None)
        if sessions is not None:
            owner = sessions.owner_for(api_key(conn, allow_query=False))
    if owner is None:
        raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")
    return owner


def service_of(conn: HTTPConnection) -> SandboxService | None:
    """The app's running service (None before its lifespan started it)."""
    service: SandboxService | None = getattr(conn.app.state, "service", None)
    return service


# Declared so /openapi.json documents both ways to pass the key; checked in `authorize`.
_bearer = HTTPBearer(auto_error=False, description="API key as a bearer token")
_header_key = APIKeyHeader(name="X-API-Key", auto_error=False)


async def require_owner(
    request: Request,
    _b: Annotated[Any, Depends(_bearer)] = None,
    _h: Annotated[Any, Depends(_header_key)] = None,
) -> str:
    return authorize(request)


async def require_port_owner(
    request: Request,
    _b: Annotated[Any, Depends(_bearer)] = None,
    _h: Annotated[Any, Depends(_header_key)] = None,
) -> str:
    return authorize(request, allow_query=True)


async def get_service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.service
    return service


Owner = Annotated[str, Depends(require_owner)]
PortOwner = Annotated[str, Depends(require_port_owner)]
Svc = Annotated[SandboxService, Depends(get_service)]
