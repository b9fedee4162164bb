"""The service's own routes: health and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from orchard._version import __version__
from orchard.env.models import Health
from orchard.env.server.auth import Svc
from orchard.env.server.routes._common import ERRORS

router = APIRouter(responses=ERRORS, tags=["service"])


@router.get("/healthz", response_model=Health)
async def healthz(svc: Svc) -> Health:
    return Health(
        status="ok" if svc.last_reconcile_ok else "degraded",
        version=__version__,
        backend=svc.backend.name,
        sandboxes=svc.count(),
    )


@router.get("/metrics", response_class=Response)
async def metrics(svc: Svc) -> Response:
    svc.metrics.set_states(svc.states())
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)
