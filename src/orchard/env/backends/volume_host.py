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
from typing import Any, Protocol, runtime_checkable

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.volume_base import (
    RootfsView,
    VolumeMount,
    VolumeStore,
    decode_mounts,
    resolve_mounts,
)
from orchard.env.errors import NotFound, VolumeFull

# A sandbox in one of these holds its mounts (a paused one too; an exited one no longer).
_HOLDING = ("pending", "running", "paused")


@runtime_checkable
class VolumeHost(Protocol):
    """What the service needs of a backend to offer volumes (docker and local have it)."""

    @property
    def volume_store(self) -> VolumeStore: ...

    async def volume_users(self) -> dict[str, builtins.list[str]]: ...

    async def sweep_volumes(self) -> builtins.list[str]: ...


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
