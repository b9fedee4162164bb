"""Volumes on a backend: one host folder per volume, bind-mounted into sandboxes.

No database, as for snapshots: a volume is `<state>/volumes/<id>/` with its `meta.json`
(owner, name, expiry) beside `data/`, the folder sandboxes see. `data/` is mode 0777 (no
sticky bit), so any user of any image can write there; files keep the uid, gid and mode
of the process that wrote them (docs/volumes.md). A crash mid-create leaves a folder with
no complete meta, a crash mid-delete a `.trash-*` folder: `VolumeStore.sweep` removes
both, and volumes deleted or expired while mounted once nothing mounts them.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from orchard.env.backends.meta_files import check_id, new_id, read_meta, write_meta
from orchard.env.errors import InvalidMount, InvalidRequest

VOLUME_GRACE_S = 120.0  # a half-made volume this young may still be being created
TRASH_PREFIX = ".trash-"
DATA_MODE = 0o777


def new_volume_id() -> str:
    return new_id("vol")


def check_volume_id(volume_id: str) -> None:
    check_id(volume_id, "vol", "volume")


@dataclass(frozen=True)
class VolumeMount:
    """One volume mounted into one sandbox; resolved (and owner-checked) by the service."""

    volume_id: str
    name: str
    target: str
    read_only: bool = False
    # The owner's max_volume_bytes: a create mounting a fuller volume is refused.
    max_bytes: int | None = None


def encode_mounts(mounts: Iterable[VolumeMount]) -> list[dict[str, Any]]:
    """For labels and meta files: what a record needs back (not the size limit)."""
    return [
        {"id": m.volume_id, "name": m.name, "target": m.target, "ro": m.read_only} for m in mounts
    ]


def decode_mounts(raw: Any) -> tuple[VolumeMount, ...]:
    """Mounts from `encode_mounts` output, or from its JSON text; () for anything else."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw else []
        except ValueError:
            return ()
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        if isinstance(item, dict) and {"id", "name", "target"} <= item.keys():
            out.append(
                VolumeMount(
                    str(item["id"]), str(item["name"]), str(item["target"]), bool(item.get("ro"))
                )
            )
    return tuple(out)


@dataclass
class VolumeRecord:
    id: str
    owner: str
    name: str
    created_at: float
    expires_at: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    complete: bool = True
    deleted: bool = False

    def live(self, now: float | None = None) -> bool:
        """Visible to its owner: complete, not deleted, not past its time to live."""
        expired = self.expires_at is not None and self.expires_at <= (now or time.time())
        return self.complete and not self.deleted and not expired


def tree_bytes(root: Path) -> int:
    """Blocks the files under `root` take (as `du`), symlinks never followed."""
    total, stack = 0, [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
    return total


class VolumeStore:
    """The volume folders of one state dir: `<root>/<id>/meta.json` and `<root>/<id>/data/`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        # Creates and deletes of this service, one at a time (a name stays unique).
        self.lock = asyncio.Lock()

    def folder(self, volume_id: str) -> Path:
        check_volume_id(volume_id)
        return self.root / volume_id

    def data(self, volume_id: str) -> Path:
        return self.folder(volume_id) / "data"

    def write(self, rec: VolumeRecord) -> None:
        write_meta(self.folder(rec.id), asdict(rec))

    def read(self, volume_id: str) -> VolumeRecord | None:
        try:
            return VolumeRecord(**read_meta(self.folder(volume_id)))
        except (OSError, ValueError, TypeError, InvalidRequest):
            return None

    def get(self, volume_id: str) -> VolumeRecord | None:
        rec = self.read(volume_id)
        return rec if rec is not None and rec.live() else None

    def all(self) -> builtins.list[VolumeRecord]:
        """Every live volume, all owners, oldest first."""
        out = []
        for folder in self.root.iterdir():
            if not folder.name.startswith(TRASH_PREFIX):
                rec = self.get(folder.name)
                if rec is not None:
                    out.append(rec)
        return sorted(out, key=lambda r: (r.created_at, r.id))

    def find(self, owner: str, name: str) -> VolumeRecord | None:
        return next((r for r in self.all() if r.owner == owner and r.name == name), None)

    def create(self, rec: VolumeRecord) -> VolumeRecord:
        folder = self.folder(rec.id)
        folder.mkdir(mode=0o700)
        rec.complete = False
        self.write(rec)  # first: a crash from here on leaves a sweepable folder
        data = self.data(rec.id)
        data.mkdir()
        data.chmod(DATA_MODE)  # not subject to the umask, unlike mkdir's mode
        rec.complete = True
        self.write(rec)
        return rec

    def set_deleted(self, volume_id: str, deleted: bool) -> None:
        rec = self.read(volume_id)
        if rec is not None:
            rec.deleted = deleted
            self.write(rec)

    def remove(self, volume_id: str) -> None:
        """Delete a volume's folder: renamed first, so a crash mid-way leaves only trash."""
        folder = self.folder(volume_id)
        trash = self.root / f"{TRASH_PREFIX}{volume_id}-{secrets.token_hex(4)}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def size(self, volume_id: str) -> int:
        return tree_bytes(self.data(volume_id))

    def sweep(self, in_use: Iterable[str]) -> builtins.list[str]:
        """Remove trash, half-made volumes, and deleted or expired ones nothing mounts."""
        used, now, removed = set(in_use), time.time(), []
        for folder in self.root.iterdir():
            if folder.name.startswith(TRASH_PREFIX):
                shutil.rmtree(folder, ignore_errors=True)
                continue
            rec = self.read(folder.name)
            if folder.name in used or (rec is not None and rec.live(now)):
                continue
            if rec is None or not rec.complete:
                with contextlib.suppress(OSError):
                    if now - folder.stat().st_mtime < VOLUME_GRACE_S:
                        continue
            with contextlib.suppress(InvalidRequest):
                self.remove(folder.name)
                removed.append(folder.name)
        return removed


def mount_strings(mounts: Iterable[VolumeMount]) -> dict[str, str]:
    """Mounts as a create asks for them (target -> "name" or "name:ro"): snapshot settings."""
    return {m.target: m.name + (":ro" if m.read_only else "") for m in mounts}


# ---------------------------------------------------------------- where a target lands

# Where the runtime and the agent live: a volume there would hide or replace them.
RESERVED_TARGETS = ("/.orchard", "/proc", "/sys", "/dev")
# Files the backends mount themselves (read-only): a volume there cannot replace them.
RUNTIME_FILES = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf")
MAX_SYMLINKS = 40  # as the kernel's own path walk (ELOOP)
MAX_LOOKUPS = 256  # path components looked up per target (an engine's walk: a request each)
# What a rootfs holds at a path: a directory, a symlink (and its target), anything else
# (a file, a device...), nothing (the runtime makes the missing folders of a target), or
# a symlink whose resolution loops (as an engine that resolves links itself reports).
Entry = tuple[Literal["dir", "symlink", "other", "missing", "loop"], str]


def bad_mount(target: str, reason: str, message: str) -> InvalidMount:
    """422 `invalid_mount` for one `volumes` entry; `details.reason` says which rule."""
    return InvalidMount(
        f"volumes[{target[:80]!r}]: {message}", details={"target": target[:256], "reason": reason}
    )


def reserved_by(path: str) -> str | None:
    """What reserves `path` (absolute and normal) for the runtime, or None."""
    if path == "/":
        return "/"
    for reserved in RESERVED_TARGETS:
        if path == reserved or path.startswith(reserved + "/"):
            return reserved
    return path if path in RUNTIME_FILES else None


class RootfsView(Protocol):
    """A sandbox's root filesystem before it runs, as its mounts will see it."""

    async def entry(self, parent: tuple[str, ...], name: str) -> Entry:
        """What is at `/parent.../name`; `parent` holds no symlink (it was resolved)."""
        ...


def _whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: str) -> bool:
    for attr in ("trusted.overlay.opaque", "user.overlay.opaque"):
        with contextlib.suppress(OSError):
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
    return False


class LayerView:
    """An overlay's merged view read from its layer folders (top first), never mounted:
    the upper entry wins, a whiteout (char device 0:0) deletes, an opaque folder hides the
    folders below it, a non-folder hides everything below it (the kernel's rules)."""

    def __init__(self, layers: Iterable[Path | str]) -> None:
        self._dirs: dict[tuple[str, ...], list[str]] = {(): [str(p) for p in layers]}

    def _folders(self, path: tuple[str, ...]) -> list[str]:
        """The layer folders that make up the merged folder `path` (none: not a folder)."""
        found = self._dirs.get(path)
        if found is not None:
            return found
        found = []
        for layer in self._folders(path[:-1]):
            here = os.path.join(layer, path[-1])
            try:
                st = os.lstat(here)
            except OSError:
                continue  # not in this layer: the ones below may have it
            if not stat.S_ISDIR(st.st_mode):
                break  # a whiteout or a non-folder hides the layers below
            found.append(here)
            if _opaque(here):
                break
        self._dirs[path] = found
        return found

    async def entry(self, parent: tuple[str, ...], name: str) -> Entry:
        for layer in self._folders(parent):
            here = os.path.join(layer, name)
            try:
                st = os.lstat(here)
            except OSError:
                continue
            if _whiteout(st):
                return "missing", ""
            if stat.S_ISLNK(st.st_mode):
                return "symlink", os.readlink(here)
            return ("dir" if stat.S_ISDIR(st.st_mode) else "other"), ""
        return "missing", ""


async def resolve_target(view: RootfsView, target: str) -> str:
    """Where a runtime mounts `target` in this rootfs: every symlink on the way followed
    with the rootfs as `/` (absolute links restart there, `..` stops there), as runc's
    and Docker's scoped path walks do. Raises 422 `invalid_mount` for a path that reaches
    the runtime's (`reserved`, checked at each step), a loop, a non-folder on the way, or
    a path over MAX_LOOKUPS components."""
    todo = [p for p in reversed(target.split("/")) if p]
    done: list[str] = []
    links = lookups = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        lookups += 1
        if lookups > MAX_LOOKUPS:
            raise bad_mount(target, "invalid", "its path in the image is too deep")
        kind, link = await view.entry(tuple(done), name)
        if kind == "symlink":
            links += 1
        if kind == "loop" or links > MAX_SYMLINKS:
            raise bad_mount(target, "symlink_loop", "too many symbolic links in the image")
        if kind == "symlink":
            if link.startswith("/"):
                done = []
            todo += [p for p in reversed(link.split("/")) if p]
            continue
        done.append(name)
        where = "/" + "/".join(done)
        owner = reserved_by(where)
        if owner is not None:  # checked on the way: what lies below is the runtime's
            raise bad_mount(
                target,
                "reserved",
                f"leads to {where[:80]!r} in the image: {owner} is the runtime's",
            )
        if kind == "other":
            raise bad_mount(target, "not_a_directory", f"{where[:80]!r} is not a folder")
    if not done:
        raise bad_mount(target, "reserved", "leads to the root of the image")
    return "/" + "/".join(done)


async def resolve_mounts(
    view: RootfsView, mounts: Iterable[VolumeMount]
) -> builtins.list[tuple[VolumeMount, str]]:
    """Each mount with the path it lands on, parents first; refused (422 `invalid_mount`)
    when that path is the runtime's (reason `reserved`), or one lands in another (`nested`):
    a mount point made inside a volume would follow symlinks its files hold."""
    out = [(m, await resolve_target(view, m.target)) for m in mounts]
    out.sort(key=lambda mw: mw[1])
    for i, (inner, b) in enumerate(out):  # at most 16: every pair
        for outer, a in out[:i]:
            if b == a or b.startswith(a + "/"):
                raise bad_mount(
                    inner.target,
                    "nested",
                    f"leads into the target {outer.target[:80]!r} of another volume",
                )
    return out
