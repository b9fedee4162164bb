"""SDK calls of volumes (docs/volumes.md), described once like the routes of `_sdk_core`.

`Volumes` / `AsyncVolumes` are `client.volumes` of the twins; a volume is mounted with
`client.sandboxes.create(image, volumes={"/data": "name", "/cache": "pip:ro"})`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from orchard.env import volume_models as vm
from orchard.env._sdk_core import Call, _dump, _model, _none, _validated


def _vol(name: str) -> str:
    return f"/v1/volumes/{quote(name, safe='')}"


def create_volume(
    name: str, timeout_s: float | None, labels: dict[str, str] | None
) -> Call[vm.Volume]:
    fields: dict[str, Any] = {"name": name, "timeout_s": timeout_s}
    if labels:
        fields["labels"] = labels
    body = _validated(vm.VolumeCreate, **fields)
    return Call("POST", "/v1/volumes", _model(vm.Volume), json=_dump(body))


def list_volumes() -> Call[list[vm.Volume]]:
    def parse(r: httpx.Response) -> list[vm.Volume]:
        return vm.VolumeList.model_validate_json(r.content).volumes

    return Call("GET", "/v1/volumes", parse, idempotent=True)


def get_volume(name: str) -> Call[vm.Volume]:
    return Call("GET", _vol(name), _model(vm.Volume), idempotent=True)


def delete_volume(name: str) -> Call[None]:
    return Call("DELETE", _vol(name), _none, idempotent=True)


class Volumes:
    """`client.volumes`: the caller's volumes (mount one with `sandboxes.create(volumes=)`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def create(
        self,
        name: str,
        *,
        timeout_s: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> vm.Volume:
        """Create an empty volume.

        :param name: unique among the caller's volumes (letters, digits, `_.-`; 64 at most)
        :param timeout_s: time to live (removed once unmounted after it); None: kept
            until deleted
        :param labels: free-form labels kept with it
        :return: the volume; VolumeExists (409 `volume_exists`) if the name is taken
        """
        result: vm.Volume = self._client._send(create_volume(name, timeout_s, labels))
        return result

    def list(self) -> list[vm.Volume]:
        """The caller's volumes, oldest first, each with its size and who mounts it now."""
        result: list[vm.Volume] = self._client._send(list_volumes())
        return result

    def get(self, name: str) -> vm.Volume:
        """One volume; NotFound if the caller has none by that name."""
        result: vm.Volume = self._client._send(get_volume(name))
        return result

    def delete(self, name: str) -> None:
        """Delete a volume and its files; VolumeInUse (409) while a sandbox mounts it."""
        self._client._send(delete_volume(name))


class AsyncVolumes:
    """`client.volumes` (async): the same names, awaited."""

    def __init__(self, client: Any) -> None:
        self._client = client

    async def create(
        self,
        name: str,
        *,
        timeout_s: float | None = None,
        labels: dict[str, str] | None = None,
    ) -> vm.Volume:
        result: vm.Volume = await self._client._send(create_volume(name, timeout_s, labels))
        return result

    async def list(self) -> list[vm.Volume]:
        result: list[vm.Volume] = await self._client._send(list_volumes())
        return result

    async def get(self, name: str) -> vm.Volume:
        result: vm.Volume = await self._client._send(get_volume(name))
        return result

    async def delete(self, name: str) -> None:
        await self._client._send(delete_volume(name))


for _name in ("create", "list", "get", "delete"):
    getattr(AsyncVolumes, _name).__doc__ = getattr(Volumes, _name).__doc__
