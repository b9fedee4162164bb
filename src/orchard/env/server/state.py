"""Sandbox state in the service: pause/resume, snapshots, create-from-snapshot, fork, diff.

Tenancy as for sandboxes: every call checks the caller owns the sandbox or snapshot, and
one it does not own is simply not found. What a backend cannot do answers 501
`not_supported` (kubernetes: no freezer or commit through the pod API; docs/state.md).
Clocks (docs/state.md): a paused sandbox's time to live keeps running (it is removed at
its expiry, paused or not); its idle clock stops while paused and restarts on resume.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.backends.criu import require_support
from orchard.env.backends.state_base import (
    MemorySnapshotting,
    Pausable,
    SnapshotRecord,
    Snapshotting,
    check_snapshot_id,
    new_snapshot_id,
)
from orchard.env.backends.volume_base import mount_strings
from orchard.env.errors import NotFound, NotSupported, SandboxPaused
from orchard.env.models import BatchCreateResult, Sandbox, SandboxCreate
from orchard.env.state_models import (
    FileDiff,
    ForkRequest,
    ForkResult,
    Snapshot,
    SnapshotCreate,
    SnapshotSettings,
)


class SandboxService(Protocol):
    """What this module needs of the service (`service.SandboxService`), named here so the
    service can import this module without a cycle."""

    backend: Backend

    def build_spec(self, owner: str, req: SandboxCreate) -> SandboxSpec: ...
    async def create_batch(self, owner: str, req: SandboxCreate) -> BatchCreateResult: ...
    async def live_or_paused(self, owner: str, sandbox_id: str) -> SandboxRecord: ...
    def remember(self, rec: SandboxRecord) -> None: ...
    def to_model(self, rec: SandboxRecord) -> Sandbox: ...
    def touch(self, sandbox_id: str) -> None: ...
    async def drop_conn(self, sandbox_id: str) -> None: ...


# Fields of a create that, when not given, come from the snapshot's settings.
_INHERITED = ("cpu", "pids_limit", "idle_timeout_s", "user", "network", "labels", "volumes")


def _why_not(backend: str) -> str:
    if backend == "kubernetes":
        return "not supported on kubernetes (the pod API has no freezer and no commit)"
    return f"not supported on the {backend} backend"


def _pausable(svc: SandboxService) -> Pausable:
    if not isinstance(svc.backend, Pausable):
        raise NotSupported("pause/resume " + _why_not(svc.backend.name))
    return svc.backend


def _snapshotting(svc: SandboxService) -> Snapshotting:
    if not isinstance(svc.backend, Snapshotting):
        raise NotSupported("snapshots " + _why_not(svc.backend.name))
    return svc.backend


async def _memory_capable(svc: SandboxService) -> None:
    backend = svc.backend
    if isinstance(backend, MemorySnapshotting):
        why = await backend.memory_unsupported()
    elif backend.name == "docker":
        why = "the docker backend keeps files only (docker checkpoint needs the engine's "
        why += "experimental mode and restores only into the container it was taken of)"
    else:
        why = f"the {backend.name} backend keeps files only"
    require_support(why)


def paused_error(sandbox_id: str) -> SandboxPaused:
    return SandboxPaused(
        f"sandbox {sandbox_id} is paused: resume it first", details={"state": "paused"}
    )


# ---------------------------------------------------------------- pause / resume


async def pause(svc: SandboxService, owner: str, sandbox_id: str) -> Sandbox:
    backend = _pausable(svc)
    await svc.live_or_paused(owner, sandbox_id)
    rec = await backend.pause(sandbox_id)
    svc.remember(rec)
    return svc.to_model(rec)


async def resume(svc: SandboxService, owner: str, sandbox_id: str) -> Sandbox:
    backend = _pausable(svc)
    await svc.live_or_paused(owner, sandbox_id)
    rec = await backend.resume(sandbox_id)
    svc.remember(rec)
    svc.touch(sandbox_id)  # the idle clock restarts
    return svc.to_model(rec)


# ---------------------------------------------------------------- snapshots


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def to_model(rec: SnapshotRecord) -> Snapshot:
    return Snapshot(
        id=rec.id,
        name=rec.name,
        source=rec.source,
        image=rec.image,
        created_at=_dt(rec.created_at),
        expires_at=_dt(rec.expires_at),
        size_bytes=rec.size_bytes,
        memory=rec.memory,
        settings=SnapshotSettings.model_validate(rec.settings),
    )


async def take_snapshot(
    svc: SandboxService, owner: str, sandbox_id: str, body: SnapshotCreate
) -> Snapshot:
    backend = _snapshotting(svc)
    rec = await svc.live_or_paused(owner, sandbox_id)
    if body.memory:
        await _memory_capable(svc)
        # CRIU cannot dump a Unix connection whose other end is outside the sandbox.
        await svc.drop_conn(sandbox_id)
    now = time.time()
    settings = SnapshotSettings(
        image=rec.image,
        cpu=rec.cpu,
        memory_bytes=rec.memory_bytes,
        pids_limit=rec.pids_limit,
        disk_bytes=rec.disk_bytes,
        idle_timeout_s=rec.idle_timeout_s,
        user=rec.default_user,
        network=rec.network,
        labels=rec.labels,
        volumes=mount_strings(rec.volumes),
    )
    snap = SnapshotRecord(
        id=new_snapshot_id(),
        owner=owner,
        source=sandbox_id,
        image=rec.image,
        created_at=now,
        expires_at=now + body.timeout_s,
        settings=settings.model_dump(mode="json"),
        name=body.name,
        memory=body.memory,
    )
    snap = await backend.snapshot(sandbox_id, snap)
    svc.touch(sandbox_id)
    return to_model(snap)


async def _owned(svc: SandboxService, owner: str, snapshot_id: str) -> SnapshotRecord:
    backend = _snapshotting(svc)
    check_snapshot_id(snapshot_id)
    snap = await backend.get_snapshot(snapshot_id)
    if snap is None or snap.owner != owner or snap.expires_at <= time.time():
        raise NotFound(f"no snapshot {snapshot_id!r}")
    return snap


async def get_snapshot(svc: SandboxService, owner: str, snapshot_id: str) -> Snapshot:
    return to_model(await _owned(svc, owner, snapshot_id))


async def list_snapshots(svc: SandboxService, owner: str) -> list[Snapshot]:
    now = time.time()
    snaps = await _snapshotting(svc).list_snapshots()
    return [to_model(s) for s in snaps if s.owner == owner and s.expires_at > now]


async def delete_snapshot(svc: SandboxService, owner: str, snapshot_id: str) -> None:
    await _owned(svc, owner, snapshot_id)
    await _snapshotting(svc).delete_snapshot(snapshot_id)


async def expire_snapshots(svc: SandboxService) -> list[str]:
    """Reconcile's share: delete snapshots past their time to live."""
    if not isinstance(svc.backend, Snapshotting):
        return []
    now = time.time()
    gone = [s.id for s in await svc.backend.list_snapshots() if s.expires_at <= now]
    for sid in gone:
        await svc.backend.delete_snapshot(sid)
    return gone


async def spec_from_snapshot(svc: SandboxService, owner: str, req: SandboxCreate) -> SandboxSpec:
    """The spec of a create with `snapshot`: the snapshot's settings, unless overridden."""
    snap = await _owned(svc, owner, str(req.snapshot))
    settings = SnapshotSettings.model_validate(snap.settings)
    given = req.model_fields_set
    update: dict[str, object] = {"image": snap.image}
    for name in _INHERITED:
        if name not in given:
            update[name] = getattr(settings, name)
    if "memory" not in given:
        update["memory"] = settings.memory_bytes
    if "disk" not in given:
        update["disk"] = settings.disk_bytes
    merged = req.model_copy(update=update)
    spec = svc.build_spec(owner, merged)
    return SandboxSpec(**{**spec.__dict__, "snapshot_id": snap.id})


async def fork(svc: SandboxService, owner: str, sandbox_id: str, body: ForkRequest) -> ForkResult:
    """One snapshot, then `count` sandboxes from it (as a batch create)."""
    name = body.name or f"fork of {sandbox_id}"
    asked = SnapshotCreate(name=name, timeout_s=body.snapshot_timeout_s, memory=body.memory)
    snap = await take_snapshot(svc, owner, sandbox_id, asked)
    fields: dict[str, object] = {"snapshot": snap.id, "count": body.count, "wait": body.wait}
    for name in ("timeout_s", "labels", "network"):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    if body.env:
        fields["env"] = body.env
    batch = await svc.create_batch(owner, SandboxCreate.model_validate(fields))
    return ForkResult(snapshot=snap, sandboxes=batch.sandboxes, errors=batch.errors)


# ---------------------------------------------------------------- diff


async def diff(svc: SandboxService, owner: str, sandbox_id: str, since: str) -> FileDiff:
    backend = _snapshotting(svc)
    await svc.live_or_paused(owner, sandbox_id)
    snap = None if since == "start" else await _owned(svc, owner, since)
    changes = await backend.diff(sandbox_id, snap)
    return FileDiff(
        since=since, added=changes.added, modified=changes.modified, deleted=changes.deleted
    )
