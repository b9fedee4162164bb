"""One router per resource; `ROUTERS` is what the app includes, in this order."""

from __future__ import annotations

from fastapi import APIRouter

from orchard.env.server.routes import (
    exec,
    files,
    health,
    pools,
    port_links,
    ports,
    processes,
    sandboxes,
    state,
    volumes,
)

ROUTERS: tuple[APIRouter, ...] = (
    sandboxes.router,
    state.router,
    volumes.router,
    pools.router,
    exec.router,
    processes.router,
    files.router,
    ports.router,
    port_links.router,
    health.router,
)
