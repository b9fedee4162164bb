"""SDK calls of warm pools (docs/pools.md): `client.pools` of both twins.

Described once here like the routes of `_sdk_core`; a claim is a create with
`pool=NAME` (`client.sandboxes.create(pool=...)`), whose answer says `from_pool`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypedDict, Unpack
from urllib.parse import quote

import httpx

from orchard.env import models as m
from orchard.env import pool_models as pm
from orchard.env._sdk_core import Call, _dump, _model, _none, _validated
from orchard.env.errors import Unavailable


class PoolOptions(TypedDict, total=False):
    cpu: float | None
    memory: str | int | None
    disk: str | int | None
    pids_limit: int | None
    network: m.NetworkPolicy | dict[str, Any]


def _path(name: str) -> str:
    return f"/v1/pools/{quote(name, safe='')}"


def create_pool(name: str, image: str, size: int, opts: PoolOptions) -> Call[pm.Pool]:
    body = _validated(pm.PoolCreate, name=name, image=image, size=size, **opts)
    return Call("POST", "/v1/pools", _model(pm.Pool), json=_dump(body))


def list_pools() -> Call[list[pm.Pool]]:
    def parse(r: httpx.Response) -> list[pm.Pool]:
        return pm.PoolList.model_validate_json(r.content).pools

    return Call("GET", "/v1/pools", parse, idempotent=True)


def get_pool(name: str) -> Call[pm.Pool]:
    return Call("GET", _path(name), _model(pm.Pool), idempotent=True)


def delete_pool(name: str) -> Call[None]:
    return Call("DELETE", _path(name), _none, idempotent=True, read_timeout=None)


def _filled(pool: pm.Pool, name: str, timeout_s: float) -> bool:
    if pool.ready >= pool.size:
        return True
    if timeout_s <= 0:
        raise Unavailable(
            f"pool {name!r}: {pool.ready} of {pool.size} ready after the wait "
            f"(last error: {pool.last_error or 'none'})",
            details={"ready": pool.ready, "size": pool.size},
        )
    return False


class Pools:
    """`client.pools`: the caller's warm pools; claim from one with
    `client.sandboxes.create(pool=name)`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def create(self, name: str, image: str, size: int, **opts: Unpack[PoolOptions]) -> pm.Pool:
        """Keep `size` sandboxes of `image` ready; the pool starts filling at once.

        :param name: unique among the caller's pools (lower case, digits, `.`, `_`, `-`)
        :param image: what its sandboxes run; claims must ask for this image (or none)
        :param size: how many to keep ready (0 to 100); they count against the quotas
        :param opts: `cpu`, `memory`, `disk`, `pids_limit` (every sandbox of the pool has
            these; a claim asking for others is refused with PoolMismatch), `network`
            (the egress they are born with; a claim may ask for another)
        :return: the pool (`ready` grows as it fills: see `wait_ready`)
        """
        result: pm.Pool = self._client._send(create_pool(name, image, size, opts))
        return result

    def get(self, name: str) -> pm.Pool:
        """One pool: ready, creating and failed counts, the last refill error; NotFound
        if the caller has no pool by that name."""
        result: pm.Pool = self._client._send(get_pool(name))
        return result

    def list(self) -> list[pm.Pool]:
        """The caller's pools, by name."""
        result: list[pm.Pool] = self._client._send(list_pools())
        return result

    def delete(self, name: str) -> None:
        """Delete a pool and its unclaimed sandboxes (claimed ones are the claimers')."""
        self._client._send(delete_pool(name))

    def wait_ready(self, name: str, timeout_s: float = 120.0) -> pm.Pool:
        """Poll until the pool is full.

        :return: the pool; Unavailable (with the last refill error) after `timeout_s`
        """
        deadline = time.monotonic() + timeout_s
        while not _filled(pool := self.get(name), name, deadline - time.monotonic()):
            time.sleep(0.1)
        return pool


class AsyncPools:
    """`client.pools` (async): the same names, awaited."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def create(
        self, name: str, image: str, size: int, **opts: Unpack[PoolOptions]
    ) -> pm.Pool:
        result: pm.Pool = await self._client._send(create_pool(name, image, size, opts))
        return result

    async def get(self, name: str) -> pm.Pool:
        result: pm.Pool = await self._client._send(get_pool(name))
        return result

    async def list(self) -> list[pm.Pool]:
        result: list[pm.Pool] = await self._client._send(list_pools())
        return result

    async def delete(self, name: str) -> None:
        await self._client._send(delete_pool(name))

    async def wait_ready(self, name: str, timeout_s: float = 120.0) -> pm.Pool:
        deadline = time.monotonic() + timeout_s
        while not _filled(pool := await self.get(name), name, deadline - time.monotonic()):
            await asyncio.sleep(0.1)
        return pool


for _name in ("create", "get", "list", "delete", "wait_ready"):
    getattr(AsyncPools, _name).__doc__ = getattr(Pools, _name).__doc__
