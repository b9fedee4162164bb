"""The service's own routes: health (liveness bare, counts with a key), metrics and usage."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from orchard._version import __version__
from orchard.env.errors import Unauthorized
from orchard.env.models import Health, Usage
from orchard.env.server.auth import Owner, Svc, authorize
from orchard.env.server.routes._common import ERRORS

router = APIRouter(responses=ERRORS, tags=["service"])


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz(svc: Svc, request: Request) -> Health:
    """Liveness for anyone; the backend and the sandbox count only for a valid key."""
    status: Literal["ok", "degraded"] = "ok" if svc.last_reconcile_ok else "degraded"
    try:
        authorize(request)
    except Unauthorized:
        return Health(status=status, version=__version__)
    return Health(
        status=status, version=__version__, backend=svc.backend.name, sandboxes=svc.count()
    )


@router.get("/metrics", response_class=Response)
async def metrics(_owner: Owner, svc: Svc) -> Response:
    """Prometheus metrics (any valid key: they count every owner's sandboxes)."""
    svc.metrics.set_states(svc.states())
    held = svc.admission.owners(svc.records())
    svc.metrics.set_owners({o: (h.sandboxes, h.cpu, h.memory) for o, h in held.items()})
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/usage", response_model=Usage)
async def usage(owner: Owner, svc: Svc) -> Usage:
    """What the caller's key holds now against its limits."""
    return svc.admission.usage(owner, svc.records())
