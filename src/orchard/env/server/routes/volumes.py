"""Volumes (docs/volumes.md): folders that outlive sandboxes, mounted at create."""

from __future__ import annotations

from fastapi import APIRouter, Response

from orchard.env.models.volume import Volume, VolumeCreate, VolumeList
from orchard.env.server import volumes
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.routes._common import ERRORS

router = APIRouter(responses=ERRORS, tags=["volumes"])
VOL = "/v1/volumes/{name}"


@router.post("/v1/volumes", status_code=201, response_model=Volume)
async def create_volume(body: VolumeCreate, owner: Owner, svc: Svc) -> Volume:
    return await volumes.create_volume(svc, owner, body)


@router.get("/v1/volumes", response_model=VolumeList)
async def list_volumes(owner: Owner, svc: Svc) -> VolumeList:
    return VolumeList(volumes=await volumes.list_volumes(svc, owner))


@router.get(VOL, response_model=Volume)
async def get_volume(name: str, owner: Owner, svc: Svc) -> Volume:
    return await volumes.get_volume(svc, owner, name)


@router.delete(VOL, status_code=204)
async def delete_volume(name: str, owner: Owner, svc: Svc) -> Response:
    await volumes.delete_volume(svc, owner, name)
    return Response(status_code=204)
