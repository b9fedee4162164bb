"""Calls of warm pools (docs/pools.md), for `client.pools` of both twins.

A claim is a create with `pool=NAME` (`client.sandboxes.create(pool=...)`), whose answer
says `from_pool`.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict
from urllib.parse import quote

import httpx

from orchard.env import models as m
from orchard.env.errors import Unavailable
from orchard.env.models import pool as pm
from orchard.env.sdk.core import Call, dump, parse_model, parse_none, validated


class PoolOptions(TypedDict, total=False):
    cpu: float | None
    memory: str | int | None
    disk: str | int | None
    pids_limit: int | None
    network: m.NetworkPolicy | dict[str, Any]


def _path(name: str) -> str:
    return f"/v1/pools/{quote(name, safe='')}"


def create_pool(name: str, image: str, size: int, opts: PoolOptions) -> Call[pm.Pool]:
    body = validated(pm.PoolCreate, name=name, image=image, size=size, **opts)
    return Call("POST", "/v1/pools", parse_model(pm.Pool), json=dump(body))


def list_pools() -> Call[list[pm.Pool]]:
    def parse(r: httpx.Response) -> list[pm.Pool]:
        return pm.PoolList.model_validate_json(r.content).pools

    return Call("GET", "/v1/pools", parse, idempotent=True)


def get_pool(name: str) -> Call[pm.Pool]:
    return Call("GET", _path(name), parse_model(pm.Pool), idempotent=True)


def delete_pool(name: str) -> Call[None]:
    return Call("DELETE", _path(name), parse_none, idempotent=True, read_timeout=None)


def unreachable(err: Unavailable, deadline: float) -> None:
    """A poll that could not reach the service (a replica restarting): nothing to judge,
    so the wait goes on; past its deadline the error stands."""
    if time.monotonic() >= deadline:
        raise err


def filled(pool: pm.Pool, name: str, timeout_s: float) -> bool:
    """Whether a pool being waited for is full; Unavailable once the wait is over."""
    if pool.ready >= pool.size:
        return True
    if timeout_s <= 0:
        raise Unavailable(
            f"pool {name!r}: {pool.ready} of {pool.size} ready after the wait "
            f"(last error: {pool.last_error or 'none'})",
            details={"ready": pool.ready, "size": pool.size},
        )
    return False
