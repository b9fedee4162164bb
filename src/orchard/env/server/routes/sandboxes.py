"""Sandboxes: create (one or a batch), list, get, delete, lifetime and egress policy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request, Response

from orchard.env.errors import InvalidRequest, OrchardError, ServiceStopping, Unavailable
from orchard.env.models import (
    BatchCreateResult,
    NetworkPolicy,
    Sandbox,
    SandboxCreate,
    SandboxList,
    TimeoutUpdate,
)
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.routes._common import ERRORS, SB

router = APIRouter(responses=ERRORS, tags=["sandboxes"])
T = TypeVar("T")


async def while_connected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run a create, cancelled (so undone) as soon as its client goes away.

    A server stopping past its graceful timeout cancels this handler: the create was
    cancelled at SIGTERM already, so its clean-up is waited for and the caller gets the
    503 it would have had, not the server's bare 500.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, OrchardError):
                    await task
                raise Unavailable("the client went away; the create was undone")
    except asyncio.CancelledError:
        service = getattr(request.app.state, "service", None)
        current = asyncio.current_task()
        if not getattr(service, "stopping", False) or current is None:
            raise
        current.uncancel()
        # Not cancelled again (that would cut its clean-up short): waited for, so what it
        # made is removed before the backend closes.
        with contextlib.suppress(BaseException):
            await asyncio.shield(task)
        raise ServiceStopping(ServiceStopping.UNDONE) from None


@router.post("/v1/sandboxes", status_code=201, response_model=Sandbox)
async def create_sandbox(body: SandboxCreate, owner: Owner, svc: Svc, request: Request) -> Sandbox:
    if body.count != 1:
        raise InvalidRequest("count must be 1 here; use POST /v1/sandboxes/batch")
    return await while_connected(request, svc.create(owner, body))


@router.post("/v1/sandboxes/batch", status_code=201, response_model=BatchCreateResult)
async def create_batch(
    body: SandboxCreate, owner: Owner, svc: Svc, request: Request
) -> BatchCreateResult:
    """All or nothing: if one create fails, the batch is undone and answers that error."""
    return await while_connected(request, svc.create_batch(owner, body))


@router.get("/v1/sandboxes", response_model=SandboxList)
async def list_sandboxes(
    owner: Owner, svc: Svc, label: Annotated[list[str] | None, Query()] = None
) -> SandboxList:
    wanted: dict[str, str] = {}
    for item in label or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidRequest(f"label filter must be key=value, got {item!r}")
        wanted[k] = v
    return SandboxList(sandboxes=await svc.list_sandboxes(owner, wanted))


@router.get(SB, response_model=Sandbox)
async def get_sandbox(sandbox_id: str, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.get(owner, sandbox_id)


@router.delete(SB, status_code=204)
async def delete_sandbox(sandbox_id: str, owner: Owner, svc: Svc) -> Response:
    await svc.delete(owner, sandbox_id)
    return Response(status_code=204)


@router.post(SB + "/timeout", response_model=Sandbox)
async def set_timeout(sandbox_id: str, body: TimeoutUpdate, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.set_timeout(owner, sandbox_id, body.timeout_s)


@router.put(SB + "/network", response_model=Sandbox)
async def set_network(sandbox_id: str, body: NetworkPolicy, owner: Owner, svc: Svc) -> Sandbox:
    return await svc.set_network(owner, sandbox_id, body)
