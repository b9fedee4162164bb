"""The client's own resources (async): `Snapshots`, `Pools`, `Volumes`' names, awaited."""

from __future__ import annotations

import asyncio
import time
from typing import Unpack

from orchard.env.errors import Unavailable
from orchard.env.models import pool as pm
from orchard.env.models import state as sm
from orchard.env.models import volume as vm
from orchard.env.sdk import calls
from orchard.env.sdk.calls import PoolOptions
from orchard.env.sdk.calls.pools import filled, unreachable
from orchard.env.sdk.core import AsyncClient, twin
from orchard.env.sdk.sync.resources import Pools, Snapshots, Volumes


class AsyncSnapshots:
    """`client.snapshots` (async): the same names, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @twin(Snapshots.list)
    async def list(self) -> list[sm.Snapshot]:
        return await self._client._send(calls.list_snapshots())

    @twin(Snapshots.get)
    async def get(self, snapshot_id: str) -> sm.Snapshot:
        return await self._client._send(calls.get_snapshot(snapshot_id))

    @twin(Snapshots.delete)
    async def delete(self, snapshot_id: str) -> None:
        await self._client._send(calls.delete_snapshot(snapshot_id))


class AsyncPools:
    """`client.pools` (async): the same names, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @twin(Pools.create)
    async def create(
        self, name: str, image: str, size: int, **opts: Unpack[PoolOptions]
    ) -> pm.Pool:
        return await self._client._send(calls.create_pool(name, image, size, opts))

    @twin(Pools.get)
    async def get(self, name: str) -> pm.Pool:
        return await self._client._send(calls.get_pool(name))

    @twin(Pools.list)
    async def list(self) -> list[pm.Pool]:
        return await self._client._send(calls.list_pools())

    @twin(Pools.delete)
    async def delete(self, name: str) -> None:
        await self._client._send(calls.delete_pool(name))

    @twin(Pools.wait_ready)
    async def wait_ready(self, name: str, timeout_s: float = 120.0) -> pm.Pool:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pool: pm.Pool | None = await self.get(name)
            except Unavailable as err:
                unreachable(err, deadline)
                pool = None
            if pool and filled(pool, name, deadline - time.monotonic()):
                return pool
            await asyncio.sleep(0.1)


class AsyncVolumes:
    """`client.volumes` (async): the same names, awaited."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @twin(Volumes.create)
    async def create(
        self,
        name: str,
        *,
        timeout_s: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> vm.Volume:
        return await self._client._send(calls.create_volume(name, timeout_s, labels))

    @twin(Volumes.list)
    async def list(self) -> list[vm.Volume]:
        return await self._client._send(calls.list_volumes())

    @twin(Volumes.get)
    async def get(self, name: str) -> vm.Volume:
        return await self._client._send(calls.get_volume(name))

    @twin(Volumes.delete)
    async def delete(self, name: str) -> None:
        await self._client._send(calls.delete_volume(name))
