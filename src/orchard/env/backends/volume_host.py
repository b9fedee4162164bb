"""The volume capability of the backends whose sandboxes run on this host (docker, local).

Both keep volumes the same way (`volume_base.VolumeStore` under the state dir) and bind-
mount a volume's `data/` folder at its target: local through the OCI spec's bind mounts
(read-only ones remounted `ro` by runc), docker through `HostConfig.Mounts` of type
`bind` (which, unlike `Binds`, refuses a missing source instead of creating it). Each
is mounted where its target leads in the sandbox's image, its symlinks followed there
(volume_base.resolve_mounts), never at the target as written, which a runtime would
follow onto its own paths (/.orchard, /dev, /proc/sys: issue 31, hole 8). A
sandbox's mounts are recorded in its `meta.json` (docker: also its labels) before
anything is mounted, which is what `volume_users` reads: a delete racing a create either
sees the create's mounts (409) or the create finds the volume gone (404), never both.
"""

from __future__ import annotations

import asyncio
import builtins
from abc import abstractmethod
from functools import cached_property
from pathlib import Path
from typing import Any

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.volume_base import (
    RootfsView,
    VolumeMount,
    VolumeRecord,
    VolumeStore,
    decode_mounts,
    resolve_mounts,
)
from orchard.env.errors import NotFound, VolumeExists, VolumeFull, VolumeInUse

# A sandbox in one of these holds its mounts (a paused one too; an exited one no longer).
_HOLDING = ("pending", "running", "paused")


class VolumeFolders:
    """Mixin of DockerBackend and LocalBackend: volume storage, mounts, users, sweep."""

    state_dir: Path

    @abstractmethod
    def _read_meta(self, sandbox_id: str) -> dict[str, Any] | None: ...

    @abstractmethod
    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    @cached_property
    def volume_store(self) -> VolumeStore:
        return VolumeStore(self.state_dir / "volumes")

    @cached_property
    def volumes(self) -> HostVolumes:
        """The service's view (volume_api.BackendVolumes) of these folders."""
        return HostVolumes(self)

    async def volume_binds(
        self, spec: SandboxSpec, rootfs: RootfsView
    ) -> builtins.list[tuple[str, str, bool]]:
        """(host folder, where it lands, read-only) of each of the spec's volumes, parents
        first. The runtime is given the path each target leads to in `rootfs` (symlinks
        followed there), never the target itself, and refuses none that reaches its own.

        Checked here, after the sandbox's meta recorded its mounts: the volume still
        exists, and holds no more than the owner's max_volume_bytes."""
        if not spec.volumes:
            return []
        store, binds = self.volume_store, []
        for m, where in await resolve_mounts(rootfs, spec.volumes):
            if store.get(m.volume_id) is None:
                raise NotFound(f"no volume {m.name!r} (deleted meanwhile)")
            if m.max_bytes is not None:
                size = await asyncio.to_thread(store.size, m.volume_id)
                if size > m.max_bytes:
                    raise VolumeFull(
                        f"volume {m.name!r} holds {size} bytes, over the limit of "
                        f"{m.max_bytes}: free some space in it (mount it elsewhere) first",
                        details={"volume": m.name, "size_bytes": size, "max_bytes": m.max_bytes},
                    )
            binds.append((str(store.data(m.volume_id)), where, m.read_only))
        return binds

    async def volume_users(self) -> dict[str, builtins.list[str]]:
        """Volume id -> the sandboxes that mount it now (or may: half-made, creating)."""
        users: dict[str, builtins.list[str]] = {}
        for sandbox_id, mounts in await asyncio.to_thread(self._mounts_on_disk):
            rec = await self.get(sandbox_id)
            if rec is None or rec.state in _HOLDING:
                for m in mounts:
                    users.setdefault(m.volume_id, []).append(sandbox_id)
        return users

    def _mounts_on_disk(self) -> builtins.list[tuple[str, tuple[VolumeMount, ...]]]:
        """Each sandbox folder that names volumes, with them (one pass over the metas)."""
        out = []
        for box in sorted((self.state_dir / "sandboxes").iterdir()):
            mounts = decode_mounts((self._read_meta(box.name) or {}).get("volumes"))
            if mounts:
                out.append((box.name, mounts))
        return out

    async def sweep_volumes(self) -> builtins.list[str]:
        """Remove the storage of volumes gone (deleted, expired, half-made) and unmounted."""
        async with self.volume_store.lock:  # not mid-way through a delete's in-use check
            users = await self.volume_users()
            return await asyncio.to_thread(self.volume_store.sweep, users)


class HostVolumes:
    """`volume_api.BackendVolumes` over one state dir's folders, for docker and local.

    Creates and deletes of this service run one at a time under the store's lock, so a
    name stays unique and a delete's in-use check sees every mount recorded before it."""

    def __init__(self, host: VolumeFolders) -> None:
        self.host = host
        self.store = host.volume_store

    def mount_id(self, owner: str, name: str) -> str | None:
        rec = self.store.find(owner, name)
        return rec.id if rec is not None else None

    async def create(self, rec: VolumeRecord, size_bytes: int | None) -> VolumeRecord:
        async with self.store.lock:
            if self.store.find(rec.owner, rec.name) is not None:
                raise VolumeExists(
                    f"volume {rec.name!r} already exists", details={"volume": rec.name}
                )
            return await asyncio.to_thread(self.store.create, rec)

    async def find(self, owner: str, name: str) -> VolumeRecord | None:
        return self.store.find(owner, name)

    async def list(self, owner: str) -> builtins.list[VolumeRecord]:
        return [r for r in self.store.all() if r.owner == owner]

    async def count(self, owner: str) -> int:
        return len(await self.list(owner))

    async def delete(self, rec: VolumeRecord) -> None:
        store = self.store
        async with store.lock:
            # Hidden first, so a create racing this one fails to find it (module docstring).
            store.set_deleted(rec.id, True)
            try:
                users = (await self.host.volume_users()).get(rec.id, [])
            except BaseException:  # cancelled, or the engine failed: the volume stays
                store.set_deleted(rec.id, False)
                raise
            if users:
                store.set_deleted(rec.id, False)
                raise in_use(rec.name, users)
            # Off the event loop: a cache of many files takes a while to remove.
            await asyncio.to_thread(store.remove, rec.id)

    async def size(self, rec: VolumeRecord) -> int | None:
        return await asyncio.to_thread(self.store.size, rec.id)

    async def users(self) -> dict[str, builtins.list[str]]:
        return await self.host.volume_users()

    async def sweep(self) -> builtins.list[str]:
        return await self.host.sweep_volumes()


def in_use(name: str, users: builtins.list[str]) -> VolumeInUse:
    return VolumeInUse(
        f"volume {name!r} is mounted by {len(users)} sandbox(es): delete them first",
        details={"volume": name, "sandboxes": sorted(users)},
    )
