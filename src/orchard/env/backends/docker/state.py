"""Sandbox state on the Docker backend: `docker pause`, commit snapshots, engine diffs.

- pause/resume: the engine's pause (the cgroup freezer), state `paused` from inspect.
- snapshot: a commit of the container: one new image layer of its changes only, the
  image below shared. Its config is the source's (env without the agent token, working
  directory); the original image's entrypoint/cmd/user are kept in the snapshot's meta.
  Images carry `orchard.snapshot` and `orchard.snapshot_dir` labels, so a sweep finds
  those left by a crash, or whose snapshot was deleted while a sandbox still used them.
  They are named `orchard-snapshot:<id>`, a repository the image policy reserves: a
  create from a snapshot starts the image id its record keeps, and no name or digest in
  `image` reaches one (its `orchard.snapshot` label refuses it, image_policy.Ownership).
- diff since start: the engine's `/containers/{id}/changes`; since a later snapshot of
  the same sandbox: the overlay2 upper dirs the engine reports (GraphDriver), when this
  process can read them (same host, root), else 501.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from orchard.env.backends.base import SandboxRecord, SandboxSpec
from orchard.env.backends.docker.images import DockerImages, ImageInfo, engine
from orchard.env.backends.state_base import (
    Changes,
    SnapshotCatalog,
    SnapshotRecord,
    mount_points,
    require_live,
    tidy,
    upper_changes,
)
from orchard.env.errors import Conflict, NotFound, NotSupported
from orchard.env.image_policy import OWNER_LABEL, SNAPSHOT_LABEL, SNAPSHOT_REPOSITORY

SNAPSHOT_REPO = SNAPSHOT_REPOSITORY
_KINDS = {0: "modified", 1: "added", 2: "deleted"}


class DockerState(SnapshotCatalog):
    """Mixin of DockerBackend: the Pausable and Snapshotting capabilities."""

    images: DockerImages

    @property
    @abstractmethod
    def docker(self) -> aiodocker.Docker: ...

    @abstractmethod
    async def _require(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]: ...

    async def _running(self, sandbox_id: str) -> tuple[dict[str, Any], SandboxRecord]:
        data, rec = await self._require(sandbox_id)
        require_live(rec)
        return data, rec

    # ------------------------------------------------------------ pause / resume

    async def pause(self, sandbox_id: str) -> SandboxRecord:
        data, rec = await self._running(sandbox_id)
        if rec.state != "paused":
            async with engine(f"pause sandbox {sandbox_id}"):
                await self.docker.containers.container(str(data["Id"])).pause()
            rec.state = "paused"
        return rec

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        data, rec = await self._running(sandbox_id)
        if rec.state == "paused":
            async with engine(f"resume sandbox {sandbox_id}"):
                await self.docker.containers.container(str(data["Id"])).unpause()
            rec.state = "running"
        return rec

    # ------------------------------------------------------------ create from a snapshot

    async def _image_for(self, spec: SandboxSpec) -> ImageInfo:
        if spec.snapshot_id is None:
            return await self.images.get(spec.image, owner=spec.owner)
        snap = self.snapshots.get(spec.snapshot_id)
        if snap is None:
            raise NotFound(f"no snapshot {spec.snapshot_id!r}")
        x = snap.extra
        return ImageInfo(str(x["image_id"]), list(x["entrypoint"]), list(x["cmd"]), str(x["user"]))

    # ------------------------------------------------------------ snapshots

    async def snapshot(self, sandbox_id: str, record: SnapshotRecord) -> SnapshotRecord:
        data, rec = await self._running(sandbox_id)
        base = await self.images.get(rec.image, owner=rec.owner)
        config = data.get("Config") or {}
        env = [e for e in config.get("Env") or [] if not e.startswith("ORCHARD_AGENT_")]
        record.complete = False
        self.snapshots.write(record)  # first: a crash from here on leaves a sweepable folder
        commit = {
            "Env": [*env, "ORCHARD_AGENT_TOKEN="],  # the engine would copy the source's in
            "WorkingDir": config.get("WorkingDir") or "",
            "Labels": {
                **(config.get("Labels") or {}),
                SNAPSHOT_LABEL: record.id,
                OWNER_LABEL: record.owner,
                "orchard.snapshot_dir": str(self.state_dir),
            },
        }
        async with engine(f"snapshot sandbox {sandbox_id}"):
            container = self.docker.containers.container(str(data["Id"]))
            out = await container.commit(
                repository=SNAPSHOT_REPO, tag=record.id, config=commit, pause=True
            )
            sized = await self.docker._query_json(
                f"containers/{data['Id']}/json", params={"size": "1"}
            )
        # The layer a sandbox made from this snapshot would compare against (diffs).
        parent = str(config.get("Image") or data.get("Image") or "")
        record.extra = {
            "image_id": str(out["Id"]),
            "parent_image": parent,
            "entrypoint": base.entrypoint,
            "cmd": base.cmd,
            "user": rec.default_user or base.user,
        }
        record.size_bytes = int(sized.get("SizeRw") or 0)
        record.complete = True
        self.snapshots.write(record)
        return record

    async def delete_snapshot(self, snapshot_id: str) -> None:
        self.snapshots.mark_deleted(snapshot_id)
        await self.sweep_snapshots()

    async def sweep_snapshots(self) -> builtins.list[str]:
        """Remove snapshot images whose snapshot is gone or half-made, once unused."""
        filters = {"label": [f"orchard.snapshot_dir={self.state_dir}"]}
        async with engine("list snapshot images"):
            images = await self.docker.images.list(filters=filters)
        live: set[str] = set()
        for image in images:
            sid = str((image.get("Labels") or {}).get(SNAPSHOT_LABEL) or "")
            rec = self.snapshots.read(sid) if sid.startswith("snap-") else None
            keep = rec is not None and rec.complete and not rec.deleted
            young = rec is not None and not rec.complete and rec.created_at > time.time() - 120
            if keep or young:
                live.add(sid)
                continue
            try:
                await self.docker.images.delete(str(image["Id"]), force=True)
            except DockerError as e:
                if e.status != 404:  # 409: a sandbox still runs on it; next sweep
                    live.add(sid)
        return self.snapshots.sweep(live)

    async def remove_orphans(self, known: set[str]) -> builtins.list[str]:
        removed = await super().remove_orphans(known)
        await self.sweep_snapshots()
        return removed

    # ------------------------------------------------------------ diff

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes:
        data, _ = await self._running(sandbox_id)
        cid = str(data["Id"])
        origin = since is not None and since.extra.get("image_id") == data.get("Image")
        if since is None or origin:
            async with engine(f"diff sandbox {sandbox_id}"):
                raw = await self.docker._query_json(f"containers/{cid}/changes") or []
            out: dict[str, list[str]] = {"added": [], "modified": [], "deleted": []}
            # Mount points (volumes) the engine made in the writable layer: never a change.
            hidden = mount_points(str(m.get("Destination", "")) for m in data.get("Mounts") or [])
            for change in raw:
                path = str(change["Path"])
                if path == "/.orchard" or path.startswith("/.orchard/") or path in hidden:
                    continue
                out[_KINDS[int(change["Kind"])]].append(path)
            return tidy(Changes(out["added"], out["modified"], out["deleted"]))
        if since.source != sandbox_id:
            raise Conflict(
                f"snapshot {since.id} is neither of sandbox {sandbox_id} nor its origin",
                details={"snapshot": since.id},
            )
        return await self._diff_layers(data, since)

    async def _diff_layers(self, data: dict[str, Any], since: SnapshotRecord) -> Changes:
        async with engine("snapshot layers"):
            image = await self.docker.images.inspect(str(since.extra["image_id"]))
        mine = (data.get("GraphDriver") or {}).get("Data") or {}
        theirs = (image.get("GraphDriver") or {}).get("Data") or {}
        try:
            upper, old = Path(mine["UpperDir"]), Path(theirs["UpperDir"])
            lowers = [Path(p) for p in str(mine.get("LowerDir") or "").split(":") if p]
            if not (upper.is_dir() and old.is_dir()):
                raise KeyError("UpperDir")
        except (KeyError, OSError) as e:
            raise NotSupported(
                "diff since a snapshot needs the engine's overlay2 folders on this host"
            ) from e
        # The container's lowers start with the image it runs; the snapshot's layer is newer.
        with contextlib.suppress(ValueError):
            lowers.remove(old)
        return await asyncio.to_thread(upper_changes, upper, lowers, old)
