"""The volume store every backend offers the service (server/volumes.py), async.

Two implementations: host folders under the state dir (docker, local: volume_host.py,
a lock in this process keeps names unique) and PersistentVolumeClaims through the API
server (kubernetes/volume_store.py: the claim is the record, so every replica sees the
same volumes and a racing create loses on the claim's name). The service keeps the rules
that are the same everywhere (names, per-owner cap, mount syntax, who may see what).
"""

from __future__ import annotations

import builtins
from typing import Any, Protocol, runtime_checkable

from orchard.env.backends.volume_base import VolumeRecord


@runtime_checkable
class BackendVolumes(Protocol):
    """One backend's volumes, all owners; the caller has checked the owner and name."""

    def mount_id(self, owner: str, name: str) -> str | None:
        """The id a create mounts for the owner's volume `name` (build_spec is sync): host
        folders know now (None: no such volume); a cluster store derives it and the
        backend checks the claim when it makes the pod (404 then)."""
        ...

    async def create(self, rec: VolumeRecord, size_bytes: int | None) -> VolumeRecord:
        """Make it; `volume_exists` (409) if the owner has one of that name already."""
        ...

    async def find(self, owner: str, name: str) -> VolumeRecord | None: ...

    async def list(self, owner: str) -> builtins.list[VolumeRecord]: ...

    async def count(self, owner: str) -> int: ...

    async def delete(self, rec: VolumeRecord) -> None:
        """Remove it and its files; `volume_in_use` (409) while a sandbox mounts it."""
        ...

    async def size(self, rec: VolumeRecord) -> int | None:
        """Bytes its files take now; None where the service cannot see them."""
        ...

    async def users(self) -> dict[str, builtins.list[str]]:
        """Volume id -> the sandboxes that mount it now (pending, running or paused)."""
        ...

    async def sweep(self) -> builtins.list[str]:
        """Remove the storage of volumes expired, deleted or half-made, once unmounted."""
        ...


def volumes_of(backend: Any) -> BackendVolumes | None:
    """The backend's volume store, or None where it has none."""
    store = getattr(backend, "volumes", None)
    return store if isinstance(store, BackendVolumes) else None
