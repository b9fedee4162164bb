"""Sandbox state on the local backend: cgroup freezer pause, overlay-layer snapshots.

- pause/resume: `crun|runc pause|resume` (the cgroup freezer: CPU stops, memory is kept).
- snapshot: a copy of the sandbox's overlay upper dir (`cp -a --reflink=auto`: shared
  extents where the filesystem can) into `<state>/snapshots/<id>/layer`, taken while the
  sandbox is frozen so the copy is consistent. Never the image: a sandbox made from the
  snapshot mounts that layer *below* its own empty upper, over the image (overlay
  lowerdir=layer:...:image), so create and fork copy nothing, and every copy writes only
  to its own upper. A snapshot of such a sandbox stacks its layer on the same chain.
- diff: the upper dir against its lowers (whiteouts are deletions).
The upper dir is on the host (`scratch/upper`) unless the sandbox has a disk limit; then
it is on a tmpfs that only the sandbox's mount namespace holds, bind-mounted read-only at
/.orchard/scratch so it is reachable as /proc/<init>/root/.orchard/scratch/upper.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import json
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.local import criu
from orchard.env.backends.local.memory import LocalMemory
from orchard.env.backends.local.oci_images import ImageStore, LocalImage
from orchard.env.backends.state_base import (
    Changes,
    SnapshotRecord,
    copy_tree,
    mount_points,
    require_live,
    tree_size,
    upper_changes,
)
from orchard.env.errors import Conflict, NotFound, Unavailable

SCRATCH_MOUNT = "/.orchard/scratch"


class LocalState(LocalMemory):
    """Mixin of LocalBackend: the Pausable, Snapshotting and MemorySnapshotting capabilities."""

    images: ImageStore

    async def _recover(self) -> None: ...

    @abstractmethod
    async def _require(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]: ...

    # ------------------------------------------------------------ pause / resume

    async def _freeze(self, sandbox_id: str, paused: bool) -> None:
        verb = "pause" if paused else "resume"
        rc, out = await self._oci(self._runtime_of(sandbox_id), verb, sandbox_id)
        if rc != 0:
            raise Unavailable(f"could not {verb} sandbox {sandbox_id}: {out[-300:]}")

    async def _running(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]:
        await self._recover()
        meta, rec = await self._require(sandbox_id)
        require_live(rec)
        return meta, rec

    async def pause(self, sandbox_id: str) -> SandboxRecord:
        _, rec = await self._running(sandbox_id)
        if rec.state != "paused":
            await self._freeze(sandbox_id, True)
            self._update_meta(sandbox_id, paused=True)
            rec.state = "paused"
        return rec

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        _, rec = await self._running(sandbox_id)
        if rec.state == "paused":
            await self._freeze(sandbox_id, False)
            self._update_meta(sandbox_id, paused=False)
            rec.state = "running"
        return rec

    async def _thaw_for_delete(self, sandbox_id: str, meta: Mapping[str, Any] | None) -> None:
        """A frozen init cannot die (cgroup v1 freezer): thaw it before the kill."""
        if meta and meta.get("paused"):
            with contextlib.suppress(Exception):
                await self._freeze(sandbox_id, False)

    # ------------------------------------------------------------ create from a snapshot

    async def _image_for(self, spec: SandboxSpec) -> tuple[LocalImage, list[str]]:
        """The image a sandbox starts from, and the snapshot layers (top first) above it."""
        if spec.snapshot_id is None:
            return await self.images.resolve(spec.image, owner=spec.owner), []
        snap = self.snapshots.get(spec.snapshot_id)
        if snap is None:
            raise NotFound(f"no snapshot {spec.snapshot_id!r}")
        image = self.images.cached(str(snap.extra.get("image_key"))) or await self.images.resolve(
            snap.image, owner=snap.owner
        )
        image = dataclasses.replace(
            image,
            env=tuple(snap.extra.get("env") or image.env),
            workdir=str(snap.extra.get("cwd") or image.workdir),
        )
        return image, list(snap.extra.get("layers") or [])

    def _layer_dirs(self, layers: list[str]) -> tuple[Path, ...]:
        return tuple(self.snapshots.folder(i) / "layer" for i in layers)

    # ------------------------------------------------------------ snapshots

    def _upper(self, sandbox_id: str, meta: Mapping[str, Any]) -> Path:
        if meta.get("disk"):
            return Path(f"/proc/{meta['pid']}/root{SCRATCH_MOUNT}/upper")
        return self._box(sandbox_id) / "scratch" / "upper"

    def _process_config(self, sandbox_id: str) -> tuple[list[str], str]:
        """The source's env (without its agent token) and working directory."""
        config = json.loads((self._box(sandbox_id) / "config.json").read_text())
        process = config.get("process") or {}
        env = [e for e in process.get("env") or [] if not e.startswith("ORCHARD_AGENT_")]
        return env, str(process.get("cwd") or "/")

    async def snapshot(self, sandbox_id: str, record: SnapshotRecord) -> SnapshotRecord:
        if record.memory:
            criu.require_support(await self.memory_unsupported())
        meta, rec = await self._running(sandbox_id)
        if record.memory:
            self._memory_source(sandbox_id, meta)
        env, cwd = self._process_config(sandbox_id)
        record.complete = False
        record.extra = {
            "layers": [record.id, *(meta.get("layers") or [])],
            "image_key": meta.get("image_key"),
            "env": env,
            "cwd": cwd,
        }
        self.snapshots.write(record)  # first: a crash from here on leaves a sweepable folder
        layer = self.snapshots.folder(record.id) / "layer"
        layer.mkdir()
        paused = rec.state == "paused"
        if record.memory:  # a paused agent is thawed a moment to let go of the service
            await self._unplug(sandbox_id, meta, paused)
        if not paused or record.memory:
            await self._freeze(sandbox_id, True)
        try:
            proc = await asyncio.create_subprocess_exec(
                *copy_tree(self._upper(sandbox_id, meta), layer),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await proc.communicate()
            if proc.returncode == 0 and record.memory:  # in the same freeze: files and memory agree
                await self._checkpoint(sandbox_id, meta, record)
        except BaseException:
            self.snapshots.mark_deleted(record.id)
            await asyncio.to_thread(self.sweep_snapshots)
            raise
        finally:
            if not paused:
                await self._freeze(sandbox_id, False)
        if proc.returncode != 0:
            self.snapshots.mark_deleted(record.id)
            raise Unavailable(f"snapshot of {sandbox_id} failed: {err.decode()[-300:]}")
        record.size_bytes = await asyncio.to_thread(tree_size, layer)
        record.size_bytes += int((record.extra.get("memory") or {}).get("bytes", 0))
        record.complete = True
        self.snapshots.write(record)
        return record

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.mark_deleted(snapshot_id)
        self.sweep_snapshots()

    def sweep_snapshots(self) -> builtins.list[str]:
        """Remove snapshot storage no sandbox and no other snapshot's chain uses."""
        used: set[str] = set()
        for box in (self.state_dir / "sandboxes").iterdir():
            used.update((self._read_meta(box.name) or {}).get("layers") or [])
        for snap in self.snapshots.all():
            used.update(snap.extra.get("layers") or [])
        return self.snapshots.sweep(used)

    async def remove_orphans(self, known: set[str]) -> builtins.list[str]:
        removed = await super().remove_orphans(known)
        await asyncio.to_thread(self.sweep_snapshots)
        return removed

    # ------------------------------------------------------------ diff

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes:
        meta, _ = await self._running(sandbox_id)
        layers = list(meta.get("layers") or [])
        lowers = [*self._layer_dirs(layers), Path(str(meta["lower"]))]
        old_upper = None
        if since is not None and (not layers or since.id != layers[0]):
            chain = since.extra.get("layers") or []
            if since.source != sandbox_id or chain[1:] != layers:
                raise Conflict(
                    f"snapshot {since.id} is neither of sandbox {sandbox_id} nor its origin",
                    details={"snapshot": since.id},
                )
            old_upper = self.snapshots.folder(since.id) / "layer"
        upper = self._upper(sandbox_id, meta)
        config = json.loads((self._box(sandbox_id) / "config.json").read_text())
        hidden = mount_points(str(m.get("destination", "")) for m in config.get("mounts") or [])
        return await asyncio.to_thread(upper_changes, upper, lowers, old_upper, hidden)
