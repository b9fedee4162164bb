"""Calls of sandboxes: create (one or a batch), get, list, delete, lifetime, egress, port links.

Each function describes one REST route as a `Call` (what to send, whether it is safe to
retry, how to parse the answer); the clients only send it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

import httpx

from orchard.env import models as m
from orchard.env.sdk.core import (
    Call,
    Params,
    dump,
    parse_model,
    parse_none,
    sandbox_path,
    validated,
)

# ---- typed keyword arguments shared by the twins (PEP 692), so options are declared once


class CreateOptions(TypedDict, total=False):
    snapshot: str | None
    pool: str | None
    cmd: list[str] | None
    env: dict[str, str]
    workdir: str | None
    user: str | None
    cpu: float | None
    memory: str | int | None
    pids_limit: int | None
    disk: str | int | None
    timeout_s: float
    idle_timeout_s: float | None
    network: m.NetworkPolicy | dict[str, Any]
    labels: dict[str, str]
    volumes: dict[str, str]
    wait: bool


def create_sandbox(image: str, opts: CreateOptions) -> Call[m.Sandbox]:
    body = validated(m.SandboxCreate, image=image, **opts)
    return Call("POST", "/v1/sandboxes", parse_model(m.Sandbox), json=dump(body), read_timeout=None)


def create_batch(image: str, count: int, opts: CreateOptions) -> Call[m.BatchCreateResult]:
    body = validated(m.SandboxCreate, image=image, count=count, **opts)
    return Call(
        "POST",
        "/v1/sandboxes/batch",
        parse_model(m.BatchCreateResult),
        json=dump(body),
        read_timeout=None,
    )


def get_sandbox(sandbox_id: str) -> Call[m.Sandbox]:
    return Call("GET", sandbox_path(sandbox_id), parse_model(m.Sandbox), idempotent=True)


def list_sandboxes(labels: Mapping[str, str] | None = None) -> Call[list[m.Sandbox]]:
    params: Params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]

    def parse(r: httpx.Response) -> list[m.Sandbox]:
        return m.SandboxList.model_validate_json(r.content).sandboxes

    return Call("GET", "/v1/sandboxes", parse, params=params, idempotent=True)


def delete_sandbox(sandbox_id: str) -> Call[None]:
    return Call("DELETE", sandbox_path(sandbox_id), parse_none, idempotent=True)


def port_link(sandbox_id: str, port: int, ttl_s: float) -> Call[m.PortLink]:
    body = validated(m.PortLinkCreate, port=port, ttl_s=ttl_s)
    path = f"{sandbox_path(sandbox_id)}/port-links"
    return Call("POST", path, parse_model(m.PortLink), json=dump(body))


def set_timeout(sandbox_id: str, timeout_s: float) -> Call[m.Sandbox]:
    body = validated(m.TimeoutUpdate, timeout_s=timeout_s)
    # Idempotent in effect: it sets expiry = now + timeout_s, whichever attempt lands.
    return Call(
        "POST",
        f"{sandbox_path(sandbox_id)}/timeout",
        parse_model(m.Sandbox),
        json=dump(body),
        idempotent=True,
    )


def set_network(
    sandbox_id: str, egress: Literal["none", "all", "allow"], allow: list[str] | None
) -> Call[m.Sandbox]:
    body = validated(m.NetworkPolicy, egress=egress, allow=list(allow or []))
    return Call(
        "PUT",
        f"{sandbox_path(sandbox_id)}/network",
        parse_model(m.Sandbox),
        json=body.model_dump(mode="json"),
        idempotent=True,
    )
