"""Warm pools (docs/pools.md): create, list, inspect, delete; claims are creates with `pool`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from orchard.env.models.pool import POOL_NAME_PATTERN, Pool, PoolCreate, PoolList
from orchard.env.server.auth import Owner, Svc
from orchard.env.server.routes._common import ERRORS

router = APIRouter(responses=ERRORS, tags=["pools"])
Name = Annotated[str, Path(pattern=POOL_NAME_PATTERN)]


@router.post("/v1/pools", status_code=201, response_model=Pool)
async def create_pool(body: PoolCreate, owner: Owner, svc: Svc) -> Pool:
    return await svc.pools.create(owner, body)


@router.get("/v1/pools", response_model=PoolList)
async def list_pools(owner: Owner, svc: Svc) -> PoolList:
    return PoolList(pools=await svc.pools.list(owner))


@router.get("/v1/pools/{name}", response_model=Pool)
async def get_pool(name: Name, owner: Owner, svc: Svc) -> Pool:
    return await svc.pools.get(owner, name)


@router.delete("/v1/pools/{name}", status_code=204)
async def delete_pool(name: Name, owner: Owner, svc: Svc) -> Response:
    await svc.pools.delete(owner, name)
    return Response(status_code=204)
