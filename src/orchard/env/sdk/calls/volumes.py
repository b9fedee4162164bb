"""Calls of volumes (docs/volumes.md), for `client.volumes` of both twins.

A volume is mounted with
`client.sandboxes.create(image, volumes={"/data": "name", "/cache": "pip:ro"})`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from orchard.env.models import volume as vm
from orchard.env.sdk.core import Call, dump, parse_model, parse_none, validated


def _vol(name: str) -> str:
    return f"/v1/volumes/{quote(name, safe='')}"


def create_volume(
    name: str, timeout_s: float | None, labels: dict[str, str] | None
) -> Call[vm.Volume]:
    fields: dict[str, Any] = {"name": name, "timeout_s": timeout_s}
    if labels:
        fields["labels"] = labels
    body = validated(vm.VolumeCreate, **fields)
    return Call("POST", "/v1/volumes", parse_model(vm.Volume), json=dump(body))


def list_volumes() -> Call[list[vm.Volume]]:
    def parse(r: httpx.Response) -> list[vm.Volume]:
        return vm.VolumeList.model_validate_json(r.content).volumes

    return Call("GET", "/v1/volumes", parse, idempotent=True)


def get_volume(name: str) -> Call[vm.Volume]:
    return Call("GET", _vol(name), parse_model(vm.Volume), idempotent=True)


def delete_volume(name: str) -> Call[None]:
    return Call("DELETE", _vol(name), parse_none, idempotent=True)
