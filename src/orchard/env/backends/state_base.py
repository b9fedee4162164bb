"""Sandbox state on a backend: pause/resume, filesystem snapshots, diffs (docs/state.md).

Optional capabilities: a backend that has them implements `Pausable` / `Snapshotting` /
`Diffing`; the service answers 501 `not_supported` for one that does not (kubernetes keeps
its snapshots in the cluster: kubernetes/snapshotting.py). Snapshots,
like sandboxes, need no database: each is a folder `<state>/snapshots/<id>/` with its
`meta.json` (owner, settings, expiry, backend details) beside its storage; storage
without a complete meta (a crash mid-snapshot) or whose meta was deleted is removed by
`SnapshotStore.sweep` once nothing uses it.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.host_folders import HostFolders
from orchard.env.backends.meta_files import check_id, new_id, read_meta, write_meta
from orchard.env.errors import InvalidRequest, SandboxExited

SNAPSHOT_GRACE_S = 120.0  # a half-made snapshot this young may still be being written
# What the agent's own mounts put into a sandbox's writable layer: never a change.
HIDDEN_PREFIX = "/.orchard"


def new_snapshot_id() -> str:
    return new_id("snap")


def check_snapshot_id(snapshot_id: str) -> None:
    check_id(snapshot_id, "snap", "snapshot")


def require_live(rec: SandboxRecord) -> None:
    """Pause, snapshot and diff need a sandbox that runs (or is paused)."""
    if rec.state not in ("running", "paused"):
        raise SandboxExited(f"sandbox {rec.id} is not running", details={"state": rec.state})


@dataclass
class SnapshotRecord:
    """One snapshot as its backend keeps it; `settings` is the source's SnapshotSettings."""

    id: str
    owner: str
    source: str
    image: str
    created_at: float
    expires_at: float
    settings: dict[str, Any]
    name: str | None = None
    size_bytes: int = 0
    # Backend details: docker: the image id; local: the layer chain, env, cwd.
    extra: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    deleted: bool = False
    # Processes and memory kept too (backends/local/criu.py), not the files only.
    memory: bool = False


@dataclass(frozen=True)
class Changes:
    """Paths changed relative to a base, each absolute inside the sandbox."""

    added: list[str]
    modified: list[str]
    deleted: list[str]


@runtime_checkable
class Pausable(Protocol):
    async def pause(self, sandbox_id: str) -> SandboxRecord: ...

    async def resume(self, sandbox_id: str) -> SandboxRecord: ...


@runtime_checkable
class Diffing(Protocol):
    """Optional: file diffs. Every Snapshotting backend has them; kubernetes has them
    (through its node helper) without snapshots, so `since` is always None there."""

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes: ...


@runtime_checkable
class MemorySnapshotting(Protocol):
    """Optional: a Snapshotting backend that can also keep processes and memory (CRIU)."""

    async def memory_unsupported(self) -> str | None:
        """None when memory snapshots work on this host, else why not (said in the 501)."""
        ...


@runtime_checkable
class Snapshotting(Protocol):
    async def snapshot(self, sandbox_id: str, record: SnapshotRecord) -> SnapshotRecord:
        """Keep the sandbox's filesystem changes; `record` says owner, settings, expiry."""
        ...

    async def list_snapshots(self) -> builtins.list[SnapshotRecord]: ...

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None: ...

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Forget it; its storage goes as soon as no sandbox uses it any more."""
        ...

    async def diff(self, sandbox_id: str, since: SnapshotRecord | None) -> Changes:
        """Changes since the sandbox started (None) or since a snapshot of its lineage."""
        ...


class SnapshotStore:
    """The snapshot folders of one state dir: `<root>/<id>/meta.json` (+ backend storage)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def folder(self, snapshot_id: str) -> Path:
        check_snapshot_id(snapshot_id)
        return self.root / snapshot_id

    def write(self, rec: SnapshotRecord) -> None:
        folder = self.folder(rec.id)
        folder.mkdir(exist_ok=True)
        write_meta(folder, asdict(rec))

    def read(self, snapshot_id: str) -> SnapshotRecord | None:
        try:
            return SnapshotRecord(**read_meta(self.folder(snapshot_id)))
        except (OSError, ValueError, TypeError, InvalidRequest):
            return None

    def get(self, snapshot_id: str) -> SnapshotRecord | None:
        rec = self.read(snapshot_id)
        return rec if rec is not None and rec.complete and not rec.deleted else None

    def all(self) -> builtins.list[SnapshotRecord]:
        out = []
        for folder in self.root.iterdir():
            rec = self.read(folder.name)
            if rec is not None and rec.complete and not rec.deleted:
                out.append(rec)
        return sorted(out, key=lambda r: (r.created_at, r.id))

    def mark_deleted(self, snapshot_id: str) -> None:
        rec = self.read(snapshot_id)
        if rec is not None:
            rec.deleted = True
            self.write(rec)

    def sweep(self, in_use: Iterable[str]) -> builtins.list[str]:
        """Remove folders of deleted or half-made snapshots that nothing uses; their ids."""
        used, now, removed = set(in_use), time.time(), []
        for folder in self.root.iterdir():
            rec = self.read(folder.name)
            if folder.name in used:
                continue
            if rec is None or not (rec.complete or rec.deleted):  # a failed one goes now
                with contextlib.suppress(OSError):
                    if now - folder.stat().st_mtime < SNAPSHOT_GRACE_S:
                        continue
            elif not rec.deleted:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
        return removed


# ---------------------------------------------------------------- overlay upper dirs


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def mount_points(destinations: Iterable[str]) -> set[str]:
    """The runtime's mount points and their parents: in the upper dir, never a change."""
    hidden: set[str] = set()
    for dest in destinations:
        path = os.path.normpath("/" + dest.lstrip("/"))
        while path != "/":
            hidden.add(path)
            path = os.path.dirname(path)
    return hidden


def walk_upper(upper: Path, hidden: set[str] | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry of an overlay upper dir: (absolute path in the sandbox, lstat), but for
    the runtime's own mount points (`hidden`, which a change to is never shown)."""
    stack = [upper]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            rel = "/" + os.path.relpath(entry.path, upper)
            if rel == HIDDEN_PREFIX or rel.startswith(HIDDEN_PREFIX + "/"):
                continue
            if hidden and rel in hidden:
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))  # what else is in /etc is a change
                continue
            yield rel, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))


def in_lower(path: str, lowers: list[Path]) -> bool:
    """Whether `path` exists in the merged view of these lower layers (top first)."""
    for layer in lowers:
        try:
            st = os.lstat(layer / path.lstrip("/"))
        except OSError:
            continue
        return not _is_whiteout(st)
    return False


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_mode, a.st_size, a.st_mtime_ns) == (b.st_mode, b.st_size, b.st_mtime_ns)


def upper_changes(
    upper: Path,
    lowers: list[Path],
    old_upper: Path | None = None,
    hidden: set[str] | None = None,
) -> Changes:
    """The changes an upper dir holds over its lowers; with `old_upper` (a copy of the same
    sandbox's upper taken earlier), only those made since that copy."""
    now = dict(walk_upper(upper, hidden))
    before = dict(walk_upper(old_upper, hidden)) if old_upper is not None else {}
    added, modified, deleted = [], [], []

    def existed(path: str) -> bool:
        if path in before:
            return not _is_whiteout(before[path])
        return in_lower(path, lowers)

    for path, st in now.items():
        if path in before and _same(before[path], st):
            continue
        if _is_whiteout(st):
            if existed(path):
                deleted.append(path)
        elif not existed(path):
            added.append(path)
        elif not stat.S_ISDIR(st.st_mode):
            modified.append(path)
    for path, st in before.items():
        if path not in now and not _is_whiteout(st):
            # Gone from the upper with no whiteout: what shows now is the lower's (or nothing).
            (modified if in_lower(path, lowers) else deleted).append(path)
    return tidy(Changes(added, modified, deleted))


def tidy(changes: Changes) -> Changes:
    """Sorted, without directories that are `modified` only because something inside was."""
    every = changes.added + changes.modified + changes.deleted
    parents = {os.path.dirname(p) for p in every}
    modified = [p for p in changes.modified if p not in parents]
    return Changes(sorted(changes.added), sorted(modified), sorted(changes.deleted))


def copy_tree(src: Path, dst: Path) -> list[str]:
    """The argv of a copy keeping devices (whiteouts), xattrs (opaque dirs), owners, times;
    reflinked where the filesystem can, so a snapshot of big files costs no data copy."""
    return ["cp", "-a", "--reflink=auto", f"{src}/.", str(dst)]


def tree_size(root: Path) -> int:
    total = 0
    for _, st in walk_upper(root):
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512
    return total


class SnapshotCatalog(HostFolders):
    """Mixin: the snapshots both filesystem backends keep under `<state>/snapshots/`."""

    @property
    def snapshots(self) -> SnapshotStore:
        return SnapshotStore(self.state_dir / "snapshots")

    async def list_snapshots(self) -> builtins.list[SnapshotRecord]:
        return self.snapshots.all()

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        return self.snapshots.get(snapshot_id)
