"""The service's own routes: health (liveness bare, counts with a key), metrics and usage.

A tenant's key sees its own figures only; the whole service's need an operator's key
(`ServiceConfig.operators`).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from orchard._version import __version__
from orchard.env.backends.replicated import ClusterQuota
from orchard.env.errors import Unauthorized
from orchard.env.models import Health, Usage
from orchard.env.server.auth import Owner, Svc, authorize
from orchard.env.server.routes._common import ERRORS

router = APIRouter(responses=ERRORS, tags=["service"])


@router.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz(svc: Svc, request: Request) -> Health:
    """Liveness for anyone; the backend and the sandbox count only for a valid key: an
    operator's key counts every owner's sandboxes, any other key its own."""
    status: Literal["ok", "degraded"] = "ok" if svc.last_reconcile_ok else "degraded"
    try:
        owner = authorize(request)
    except Unauthorized:
        return Health(status=status, version=__version__)
    if svc.config.is_operator(owner):
        count = svc.count()
    else:
        count = sum(1 for r in svc.records() if r.owner == owner)
    return Health(status=status, version=__version__, backend=svc.backend.name, sandboxes=count)


@router.get("/metrics", response_class=Response)
async def metrics(owner: Owner, svc: Svc) -> Response:
    """Prometheus metrics: an operator's key (`ORCHARD_OPERATORS`) gets the whole service's,
    any other key only its own owner's sandboxes, holdings and refusals."""
    records = svc.records()
    if not svc.config.is_operator(owner):
        mine = (svc.to_model(r).status for r in records if r.owner == owner)
        own = svc.admission.held(owner, records)
        body = svc.metrics.render_owner(owner, mine, (own.sandboxes, own.cpu, own.memory))
        return Response(body, media_type=CONTENT_TYPE_LATEST)
    held = svc.admission.owners(records)
    svc.metrics.set_states(svc.states())
    svc.metrics.set_owners({o: (h.sandboxes, h.cpu, h.memory) for o, h in held.items()})
    return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/usage", response_model=Usage)
async def usage(owner: Owner, svc: Svc) -> Usage:
    """What the caller's key holds now against its limits: counted by the backend where it
    enforces the quota itself (a cluster's ResourceQuota: the same on every replica)."""
    counted = None
    if isinstance(svc.backend, ClusterQuota):
        counted = await svc.backend.tenant_usage(owner)
    return svc.admission.usage(owner, svc.records(), counted=counted)
