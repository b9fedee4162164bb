"""Sandbox state in the service: pause/resume, snapshots, create-from-snapshot, fork, diff.

Tenancy as for sandboxes: every call checks the caller owns the sandbox or snapshot, and
one it does not own is simply not found. What a backend cannot do answers 501
`not_supported` (kubernetes: memory snapshots; docs/state.md).
Clocks (docs/state.md): a paused sandbox's time to live keeps running (it is removed at
its expiry, paused or not); its idle clock stops while paused and restarts on resume.
Snapshots are admitted per owner (max_snapshots, max_snapshot_bytes: admission.py), and a
fork is all or nothing: its copies are admitted before its snapshot is taken, and the
snapshot goes again if the copies fail (issue 31, hole 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Protocol

from orchard.env.backends.base import Backend, SandboxRecord, SandboxSpec
from orchard.env.backends.local.criu import require_support
from orchard.env.backends.state_base import (
    Diffing,
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
from orchard.env.models.state import (
    FileDiff,
    ForkRequest,
    ForkResult,
    Snapshot,
    SnapshotCreate,
    SnapshotSettings,
)
from orchard.env.server.admission import Admission
from orchard.env.server.agent_client import AgentClient


class SandboxService(Protocol):
    """What this module needs of the service (`service.SandboxService`), named here so the
    service can import this module without a cycle."""

    backend: Backend
    admission: Admission

    def records(self) -> list[SandboxRecord]: ...
    def build_spec(self, owner: str, req: SandboxCreate) -> SandboxSpec: ...
    async def create_batch(self, owner: str, req: SandboxCreate) -> BatchCreateResult: ...
    async def live_or_paused(self, owner: str, sandbox_id: str) -> SandboxRecord: ...
    def remember(self, rec: SandboxRecord) -> None: ...
    def to_model(self, rec: SandboxRecord) -> Sandbox: ...
    def touch(self, sandbox_id: str) -> None: ...
    async def drop_conn(self, sandbox_id: str) -> None: ...
    def connection(self, rec: SandboxRecord) -> AgentClient: ...


# Fields of a create that, when not given, come from the snapshot's settings.
_INHERITED = ("cpu", "pids_limit", "idle_timeout_s", "user", "network", "labels", "volumes")


def _why_not(backend: str) -> str:
    return f"not supported on the {backend} backend"


def _pausable(svc: SandboxService) -> Pausable:
    if not isinstance(svc.backend, Pausable):
        raise NotSupported("pause/resume " + _why_not(svc.backend.name))
    return svc.backend


def _snapshotting(svc: SandboxService) -> Snapshotting:
    if not isinstance(svc.backend, Snapshotting):
        raise NotSupported("snapshots " + _why_not(svc.backend.name))
    return svc.backend


def _diffing(svc: SandboxService) -> Diffing:
    if not isinstance(svc.backend, Diffing):
        raise NotSupported("diffs " + _why_not(svc.backend.name))
    return svc.backend


async def _memory_capable(svc: SandboxService) -> None:
    backend = svc.backend
    if isinstance(backend, MemorySnapshotting):
        why = await backend.memory_unsupported()
    elif backend.name == "docker":
        why = "the docker backend keeps files only (docker checkpoint needs the engine's "
        why += "experimental mode and restores only into the container it was taken of)"
    elif backend.name == "kubernetes":
        # Tried on the trial cluster (docs/state.md): kubelet 1.34 serves the checkpoint
        # API, but containerd 1.6's CRI answers it Unimplemented, and no kubelet restores.
        why = "the kubernetes backend keeps files only: the kubelet's ContainerCheckpoint "
        why += "API needs containerd >= 1.7 (containerd 1.6 answers CheckpointContainer "
        why += "Unimplemented), and a restore needs containerd >= 2.0 (checkpoint images)"
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


def _settings(rec: SandboxRecord) -> SnapshotSettings:
    """What a snapshot of this sandbox keeps as the settings of sandboxes made from it."""
    return SnapshotSettings(
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


async def _held(backend: Snapshotting) -> list[SnapshotRecord]:
    """Every live snapshot (of every owner: admission picks the owner's)."""
    now = time.time()
    return [s for s in await backend.list_snapshots() if s.expires_at > now]


async def _discard(backend: Snapshotting, snapshot_id: str) -> None:
    with contextlib.suppress(Exception):  # what is left, the reconcile's sweep removes
        await backend.delete_snapshot(snapshot_id)


async def take_snapshot(
    svc: SandboxService, owner: str, sandbox_id: str, body: SnapshotCreate
) -> Snapshot:
    backend = _snapshotting(svc)
    rec = await svc.live_or_paused(owner, sandbox_id)
    if body.memory:
        await _memory_capable(svc)
    # The list is read with no await before the reservation on docker and local (their
    # snapshot stores are read synchronously), so concurrent snapshots cannot both pass.
    svc.admission.admit_snapshot(owner, await _held(backend))
    try:
        if body.memory:
            # CRIU cannot dump a Unix connection whose other end is outside the sandbox.
            await svc.drop_conn(sandbox_id)
        now = time.time()
        snap = SnapshotRecord(
            id=new_snapshot_id(),
            owner=owner,
            source=sandbox_id,
            image=rec.image,
            created_at=now,
            expires_at=now + body.timeout_s,
            settings=_settings(rec).model_dump(mode="json"),
            name=body.name,
            memory=body.memory,
        )
        with svc.connection(rec).held():  # frozen by us, not stopped: calls wait
            snap = await backend.snapshot(sandbox_id, snap)
        svc.touch(sandbox_id)
        try:  # its size is known only now: over the byte budget, it goes at once
            svc.admission.check_snapshot_bytes(snap, await _held(backend))
        except BaseException:
            await asyncio.shield(_discard(backend, snap.id))
            raise
    finally:
        svc.admission.release_snapshot(owner)
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


def _merged(settings: SnapshotSettings, image: str, req: SandboxCreate) -> SandboxCreate:
    """A create from a snapshot: the snapshot's settings where the create gives none (a
    null cpu or memory counts as not given: models.SandboxCreate)."""
    given = req.model_fields_set
    update: dict[str, object] = {"image": image}
    for name in _INHERITED:
        if name not in given:
            update[name] = getattr(settings, name)
    if "memory" not in given:
        update["memory"] = settings.memory_bytes
    if "disk" not in given:
        update["disk"] = settings.disk_bytes
    return req.model_copy(update=update)


async def spec_from_snapshot(svc: SandboxService, owner: str, req: SandboxCreate) -> SandboxSpec:
    """The spec of a create with `snapshot`: the snapshot's settings, unless overridden."""
    snap = await _owned(svc, owner, str(req.snapshot))
    settings = SnapshotSettings.model_validate(snap.settings)
    spec = svc.build_spec(owner, _merged(settings, snap.image, req))
    return SandboxSpec(**{**spec.__dict__, "snapshot_id": snap.id})


async def fork(svc: SandboxService, owner: str, sandbox_id: str, body: ForkRequest) -> ForkResult:
    """One snapshot, then `count` sandboxes from it (as a batch create), all or nothing."""
    backend = _snapshotting(svc)
    rec = await svc.live_or_paused(owner, sandbox_id)
    fields: dict[str, object] = {"count": body.count, "wait": body.wait}
    for name in ("timeout_s", "labels", "network"):
        if getattr(body, name) is not None:
            fields[name] = getattr(body, name)
    if body.env:
        fields["env"] = body.env
    # The copies, as they will be, are admitted first: a fork refused (over max_batch, a
    # quota, the create rate's burst) takes no snapshot. (Only asked: the batch admits.)
    one = SandboxCreate.model_validate({**fields, "image": rec.image, "count": 1})
    copy = svc.build_spec(owner, _merged(_settings(rec), rec.image, one))
    svc.admission.admit([copy] * body.count, svc.records(), reserve=False)
    name = body.name or f"fork of {sandbox_id}"
    asked = SnapshotCreate(name=name, timeout_s=body.snapshot_timeout_s, memory=body.memory)
    snap = await take_snapshot(svc, owner, sandbox_id, asked)
    try:
        batch = await svc.create_batch(
            owner, SandboxCreate.model_validate({**fields, "snapshot": snap.id})
        )
    except BaseException:  # refused, failed or cancelled: no copy is left, nor the snapshot
        await asyncio.shield(_discard(backend, snap.id))
        raise
    return ForkResult(snapshot=snap, sandboxes=batch.sandboxes, errors=batch.errors)


# ---------------------------------------------------------------- diff


async def diff(svc: SandboxService, owner: str, sandbox_id: str, since: str) -> FileDiff:
    backend = _diffing(svc)
    await svc.live_or_paused(owner, sandbox_id)
    snap = None if since == "start" else await _owned(svc, owner, since)
    changes = await backend.diff(sandbox_id, snap)
    return FileDiff(
        since=since, added=changes.added, modified=changes.modified, deleted=changes.deleted
    )
