"""Volumes in the service (docs/volumes.md): create, get, list, delete, mount, expire.

Tenancy as for sandboxes and snapshots: a volume is found by its owner and name, and
another owner's volume is simply not found (404) for get, delete and mount. The storage
is the backend's (volume_api.BackendVolumes: host folders, or PVCs on kubernetes); a
backend without one answers 501 `not_supported`.
"""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Protocol

from orchard.env.backends.base import Backend
from orchard.env.backends.volume_api import BackendVolumes, volumes_of
from orchard.env.backends.volume_base import (
    VolumeMount,
    VolumeRecord,
    bad_mount,
    new_volume_id,
    reserved_by,
)
from orchard.env.config import ServiceConfig
from orchard.env.errors import (
    InvalidMount,
    InvalidRequest,
    NotFound,
    NotSupported,
    QuotaExceeded,
)
from orchard.env.models.volume import VOLUME_NAME_PATTERN, Volume, VolumeCreate

MAX_MOUNTS = 16
MAX_VOLUMES = 1000  # per owner: stops a runaway loop, not work (a fixed cap, no limits key)
MAX_TARGET_LEN = 256
_NAME_RE = re.compile(VOLUME_NAME_PATTERN)


class VolumeService(Protocol):
    """What this module needs of the service (`service.SandboxService`)."""

    backend: Backend
    config: ServiceConfig


def _store(backend: Backend) -> BackendVolumes:
    store = volumes_of(backend)
    if store is None:
        raise NotSupported(f"volumes are not supported on the {backend.name} backend")
    return store


_bad_mount = bad_mount


def check_target(target: str) -> None:
    """An absolute, normal path, not the root, not over the runtime's own mounts (as
    written: the backend checks again where it leads in the image, volume_base.py)."""
    if not target.startswith("/"):
        raise _bad_mount(target, "not_absolute", "the target must be an absolute path")
    if len(target) > MAX_TARGET_LEN or "\x00" in target:
        raise _bad_mount(target, "invalid", f"at most {MAX_TARGET_LEN} characters, no NUL")
    if ".." in target.split("/"):
        raise _bad_mount(target, "dotdot", "the target must not contain '..'")
    if posixpath.normpath(target) != target or target.startswith("//"):
        raise _bad_mount(
            target, "not_normal", "write the target without '.', '//' or a '/' at the end"
        )
    if target == "/":
        raise _bad_mount(target, "reserved", "a volume cannot replace the root filesystem")
    reserved = reserved_by(target)
    if reserved is not None:
        raise _bad_mount(target, "reserved", f"{reserved} belongs to the runtime")


def parse_mounts(volumes: Mapping[str, str]) -> list[tuple[str, str, bool]]:
    """(target, volume name, read-only) of a create's `volumes`, checked."""
    if len(volumes) > MAX_MOUNTS:
        raise InvalidMount(
            f"at most {MAX_MOUNTS} volumes per sandbox", details={"reason": "too_many"}
        )
    out = []
    for target, value in volumes.items():
        check_target(target)
        name, _, mode = value.partition(":")
        if mode not in ("", "ro", "rw"):
            raise _bad_mount(
                target, "bad_mode", f'use "name", "name:ro" or "name:rw", not {value[:80]!r}'
            )
        if not _NAME_RE.match(name):
            raise _bad_mount(target, "bad_name", f"{name[:80]!r} is not a volume name")
        out.append((target, name, mode == "ro"))
    for inner in sorted(volumes):  # at most 16: every pair
        outer = next((t for t in volumes if inner.startswith(t + "/")), None)
        if outer is not None:
            # The mount point would be made inside the outer volume's files (or fail, ro).
            raise _bad_mount(inner, "nested", f"inside the target {outer[:80]!r} of another volume")
    return out


def resolve_mounts(
    svc: VolumeService, owner: str, volumes: Mapping[str, str]
) -> tuple[VolumeMount, ...]:
    """The mounts of a create (build_spec): each volume the owner's, else 404."""
    if not volumes:
        return ()
    wanted = parse_mounts(volumes)
    store = _store(svc.backend)
    limit = svc.config.limits.of(owner).max_volume_bytes
    mounts = []
    for target, name, read_only in wanted:
        volume_id = store.mount_id(owner, name)
        if volume_id is None:
            raise NotFound(f"no volume {name!r}", details={"volume": name})
        mounts.append(VolumeMount(volume_id, name, target, read_only, limit))
    return tuple(mounts)


# ---------------------------------------------------------------- the volume resource


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts is not None else None


async def _model(svc: VolumeService, rec: VolumeRecord, users: dict[str, list[str]]) -> Volume:
    size = await _store(svc.backend).size(rec)
    return Volume(
        id=rec.id,
        name=rec.name,
        created_at=datetime.fromtimestamp(rec.created_at, UTC),
        expires_at=_dt(rec.expires_at),
        size_bytes=size,
        max_bytes=svc.config.limits.of(rec.owner).max_volume_bytes,
        mounted_by=sorted(users.get(rec.id, [])),
        labels=rec.labels,
    )


def _check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise InvalidRequest(f"invalid volume name {name[:64]!r}")


async def _owned(svc: VolumeService, owner: str, name: str) -> VolumeRecord:
    _check_name(name)
    rec = await _store(svc.backend).find(owner, name)
    if rec is None:
        raise NotFound(f"no volume {name!r}")
    return rec


async def create_volume(svc: VolumeService, owner: str, body: VolumeCreate) -> Volume:
    """409 `volume_exists` for a name the owner has; a size over its max_volume_bytes is
    429 `quota_exceeded` (kubernetes: the claim's request; elsewhere only recorded)."""
    store = _store(svc.backend)
    limit = svc.config.limits.of(owner).max_volume_bytes
    if body.size_bytes is not None and limit is not None and body.size_bytes > limit:
        raise QuotaExceeded(
            f"a volume of {body.size_bytes} bytes is over the limit of {limit}",
            details={"limit": "max_volume_bytes", "value": limit},
        )
    held = await store.count(owner)
    if held >= MAX_VOLUMES:
        raise QuotaExceeded(
            f"at most {MAX_VOLUMES} volumes per owner: delete some first",
            details={"limit": "max_volumes", "value": MAX_VOLUMES, "held": held},
        )
    now = time.time()
    expires = now + body.timeout_s if body.timeout_s is not None else None
    rec = VolumeRecord(new_volume_id(), owner, body.name, now, expires, dict(body.labels))
    rec = await store.create(rec, body.size_bytes if body.size_bytes is not None else limit)
    return await _model(svc, rec, {})


async def get_volume(svc: VolumeService, owner: str, name: str) -> Volume:
    rec = await _owned(svc, owner, name)
    return await _model(svc, rec, await _store(svc.backend).users())


async def list_volumes(svc: VolumeService, owner: str) -> list[Volume]:
    store = _store(svc.backend)
    mine = await store.list(owner)
    users = await store.users() if mine else {}
    return [await _model(svc, r, users) for r in mine]


async def delete_volume(svc: VolumeService, owner: str, name: str) -> None:
    """409 `volume_in_use` while a sandbox mounts it; else its storage goes now."""
    rec = await _owned(svc, owner, name)
    await _store(svc.backend).delete(rec)


async def expire_volumes(svc: VolumeService) -> list[str]:
    """Reconcile's share: the storage of expired, deleted and half-made volumes, once unused."""
    store = volumes_of(svc.backend)
    return await store.sweep() if store is not None else []
