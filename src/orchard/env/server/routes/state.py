"""Sandbox state (docs/state.md): pause/resume, snapshots, fork, file diffs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from orchard.env.models import Sandbox
from orchard.env.models.state import (
    FileDiff,
    ForkRequest,
    ForkResult,
    Snapshot,
    SnapshotCreate,
    SnapshotList,
)
from orchard.env.server import state
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.routes._common import ERRORS, SB

router = APIRouter(responses=ERRORS, tags=["state"])
SNAP = "/v1/snapshots/{snapshot_id}"


@router.post(SB + "/pause", response_model=Sandbox)
async def pause(sandbox_id: str, owner: Owner, svc: Svc) -> Sandbox:
    return await state.pause(svc, owner, sandbox_id)


@router.post(SB + "/resume", response_model=Sandbox)
async def resume(sandbox_id: str, owner: Owner, svc: Svc) -> Sandbox:
    return await state.resume(svc, owner, sandbox_id)


@router.post(SB + "/snapshot", status_code=201, response_model=Snapshot)
async def snapshot(
    sandbox_id: str, owner: Owner, svc: Svc, body: SnapshotCreate | None = None
) -> Snapshot:
    return await state.take_snapshot(svc, owner, sandbox_id, body or SnapshotCreate())


@router.post(SB + "/fork", status_code=201, response_model=ForkResult)
async def fork(
    sandbox_id: str, owner: Owner, svc: Svc, body: ForkRequest | None = None
) -> ForkResult:
    return await state.fork(svc, owner, sandbox_id, body or ForkRequest())


@router.get(SB + "/diff", response_model=FileDiff)
async def diff(
    sandbox_id: str,
    owner: Owner,
    svc: Svc,
    since: Annotated[str, Query(max_length=64)] = "start",
) -> FileDiff:
    return await state.diff(svc, owner, sandbox_id, since)


@router.get("/v1/snapshots", response_model=SnapshotList)
async def list_snapshots(owner: Owner, svc: Svc) -> SnapshotList:
    return SnapshotList(snapshots=await state.list_snapshots(svc, owner))


@router.get(SNAP, response_model=Snapshot)
async def get_snapshot(snapshot_id: str, owner: Owner, svc: Svc) -> Snapshot:
    return await state.get_snapshot(svc, owner, snapshot_id)


@router.delete(SNAP, status_code=204)
async def delete_snapshot(snapshot_id: str, owner: Owner, svc: Svc) -> Response:
    await state.delete_snapshot(svc, owner, snapshot_id)
    return Response(status_code=204)
