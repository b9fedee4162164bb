"""Exec: run a command to completion, or stream its output as NDJSON.

`POST .../exec` is the hot route of an agent loop, so `ExecFastPath` (middleware) serves
it without FastAPI's routing; both take a request in through `accept_exec`, and both run
it with `run_exec`, so the route and the fast path cannot drift apart.
"""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection

from orchard.env.models import ExecRequest, ExecResult
from orchard.env.server.auth import Owner, Svc, authorize, service_of
from orchard.env.server.relay import forward, json_body, read_timeout, stream
from orchard.env.server.routes._common import ERRORS, NDJSON, SB
from orchard.env.server.service import SandboxService

router = APIRouter(responses=ERRORS, tags=["exec"])
JSON_TYPES = ("application/json",)


def accept_exec(conn: HTTPConnection, body: bytes) -> tuple[str, SandboxService, ExecRequest]:
    """Authorize and validate one exec request: its owner, the service and its body.

    The route's checks, on a raw request: the same `authorize` its `Owner` dependency
    runs, and the same `ExecRequest` its body is validated as. Raises Unauthorized,
    ValueError (not JSON, no service yet) or ValidationError.
    """
    ctype = conn.headers.get("content-type", "")
    if ctype.partition(";")[0].strip().lower() not in JSON_TYPES:
        raise ValueError(f"not a JSON body: {ctype!r}")
    service = service_of(conn)
    if service is None:
        raise ValueError("the service has not started")
    owner = authorize(conn)
    return owner, service, ExecRequest.model_validate(json.loads(body))


async def run_exec(sandbox_id: str, body: ExecRequest, owner: str, svc: SandboxService) -> Response:
    """Forward one exec to the sandbox's agent, its latency recorded."""
    t0 = time.perf_counter()
    try:
        return await forward(
            svc,
            owner,
            sandbox_id,
            "POST",
            "/exec",
            content=json_body(body),
            timeout=read_timeout(body.timeout_s),
        )
    finally:
        svc.metrics.exec_latency.observe(time.perf_counter() - t0)


@router.post(SB + "/exec", response_model=ExecResult)
async def exec_command(sandbox_id: str, body: ExecRequest, owner: Owner, svc: Svc) -> Response:
    return await run_exec(sandbox_id, body, owner, svc)


@router.post(SB + "/exec/stream", responses=NDJSON)
async def exec_stream(
    sandbox_id: str, body: ExecRequest, owner: Owner, svc: Svc
) -> StreamingResponse:
    return await stream(
        svc,
        owner,
        sandbox_id,
        "POST",
        "/exec/stream",
        headers=[("Content-Type", "application/json")],
        content=json_body(body),
    )
