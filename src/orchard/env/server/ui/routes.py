"""`/ui`: the dashboard page and its assets, and the login that turns a key into a session.

The page is static (plain JS, no framework, xterm.js vendored at build time) and talks to
the ordinary REST API with a session token, so the dashboard can do nothing a key cannot.
None of these routes are in the OpenAPI spec: they serve a browser, not API clients.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import Field

from orchard.env.config import ServiceConfig
from orchard.env.errors import NotFound, Unauthorized
from orchard.env.models.base import WireModel
from orchard.env.server.auth import api_key
from orchard.env.server.ui.sessions import DEFAULT_TTL_S, MAX_TTL_S, SessionStore

STATIC = Path(__file__).parent / "static"
# The page runs only its own scripts and talks only to this origin; nothing is framed.
# Styles may be inline: xterm.js sets element styles from script.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ASSETS = {
    "app.js": "text/javascript",
    "app.css": "text/css",
    "vendor/xterm.js": "text/javascript",
    "vendor/xterm.css": "text/css",
}

router = APIRouter(include_in_schema=False)


class SessionCreate(WireModel):
    api_key: str = Field(min_length=1, max_length=4096)
    ttl_s: float = Field(default=DEFAULT_TTL_S, gt=0, le=MAX_TTL_S)


class SessionInfo(WireModel):
    token: str
    owner: str
    expires_at: datetime


def sessions_of(request: Request) -> SessionStore:
    store: SessionStore = request.app.state.ui_sessions
    return store


@router.get("/ui")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers=HEADERS)


@router.get("/ui/")
async def page_slash() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=308)


@router.get("/ui/static/{name:path}")
async def asset(name: str) -> FileResponse:
    """Only the files the page names: a fixed list, so no path reaches outside `static/`."""
    media = ASSETS.get(name)
    if media is None:
        raise NotFound(f"no dashboard asset {name!r}")
    if not (STATIC / name).is_file():  # vendor/: made by `make setup`, not committed
        raise NotFound(f"dashboard asset {name!r} missing: run scripts/vendor_xterm.sh")
    return FileResponse(STATIC / name, media_type=media, headers=HEADERS)


@router.post("/ui/session", status_code=201, response_model=SessionInfo)
async def login(body: SessionCreate, request: Request) -> SessionInfo:
    """A session token for an API key. Only a real key logs in: a session token cannot mint
    another, so a session ends when it expires whatever the page does."""
    config: ServiceConfig = request.app.state.config
    owner = config.owner_for(body.api_key)
    if owner is None:
        raise Unauthorized("invalid API key")
    s = sessions_of(request).create(owner, body.ttl_s)
    return SessionInfo(
        token=s.token, owner=s.owner, expires_at=datetime.fromtimestamp(s.expires_at, UTC)
    )


@router.delete("/ui/session", status_code=204)
async def logout(request: Request) -> Response:
    """End the caller's session (the page's log-out); 401 when it was not a live one."""
    if not sessions_of(request).revoke(api_key(request, allow_query=False)):
        raise Unauthorized("no such session")
    return Response(status_code=204)


def install_dashboard(app: FastAPI) -> None:
    """Serve the dashboard on `app`, with a fresh (in-memory) session store."""
    app.state.ui_sessions = SessionStore()
    app.include_router(router)
