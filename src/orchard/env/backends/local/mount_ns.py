"""A sandbox's root filesystem mounted in a private mount namespace, never on the host.

`runc run` copies the mount table of the namespace it starts in into each new container
(copy_mnt_ns, then an unmount of the old root: both O(mounts)). With every sandbox's
overlay mounted on the host, the n-th create copied n overlays: O(N²) over N sandboxes.
Instead, runc is started through `preexec`: in the forked child, before exec, it unshares
a mount namespace (a copy of the host's, which no longer grows per sandbox), makes it
private (nothing propagates back to the host), and mounts there the sandbox's tmpfs and
overlay. runc then builds the container from that small table and exits; the container's
namespace alone holds the overlay, so the kernel unmounts it when the sandbox's last
process ends. Nothing is left to unmount after a crash: only the folders on disk.

Without a tmpfs (no disk limit) there is nothing to mount outside the rootfs, so runc
itself mounts the overlay, as the first mount of the spec (destination `/`), in the
namespace it makes for the container (`oci_mount`): the same table, the same single
holder of the overlay, and no `preexec_fn`, which would force the service to fork its
whole address space (page tables, then a copy-on-write fault for every page it writes
afterwards) instead of vfork-ing runc.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
# The exit status of a runc child whose mounts failed; its message is in the log file.
MOUNT_FAILED = 125
# What runc's log says when the overlay it was to mount (oci_mount) failed.
RUNC_MOUNT_FAILED = 'mounting "overlay" to rootfs at "/"'
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: Path | str, fstype: str, data: str, flags: int = 0) -> None:
    raw_data = data.encode() if data else None
    raw_type = fstype.encode() if fstype else None
    if _libc.mount(source.encode(), str(target).encode(), raw_type, flags, raw_data):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {fstype or 'flags'} on {target}: {os.strerror(err)}")


def umount(target: Path) -> None:
    """Detach a mount if there is one (lazily: open files in it do not block a delete).

    Only sandboxes made before the private namespaces have their rootfs on the host."""
    if os.path.ismount(target):
        _libc.umount2(str(target).encode(), _MNT_DETACH)


@dataclass(frozen=True)
class RootfsMounts:
    """The mounts of one sandbox's rootfs, made in the namespace runc starts in."""

    lower: Path
    scratch: Path
    rootfs: Path
    tmpfs_bytes: int | None = None
    # Snapshot layers (top first) between the upper and the image: backends/local/state.py.
    layers: tuple[Path, ...] = ()

    @property
    def in_runc(self) -> bool:
        """Whether runc can make the mounts itself (`oci_mount`): no tmpfs outside the rootfs."""
        return not self.tmpfs_bytes

    def _overlay_data(self) -> str:
        upper, work = self.scratch / "upper", self.scratch / "work"
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        lower = ":".join(map(str, (*self.layers, self.lower)))
        return f"lowerdir={lower},upperdir={upper},workdir={work}"

    def oci_mount(self) -> dict[str, object]:
        """The overlay as the spec's first mount, for runc to make over the rootfs folder."""
        return {
            "destination": "/",
            "type": "overlay",
            "source": "overlay",
            "options": self._overlay_data().split(","),
        }

    def make(self) -> None:
        """Mount the (optional) tmpfs under the writable layer, then the overlay."""
        if self.tmpfs_bytes:
            mount("tmpfs", self.scratch, "tmpfs", f"size={self.tmpfs_bytes},mode=0700")
        mount("overlay", self.rootfs, "overlay", self._overlay_data())

    def preexec(self, hide: Path | None = None) -> Prestart:
        """What the runtime's child does before exec: a private namespace holding these
        mounts (`hide`: a mount to detach there first, crun's view of a hybrid cgroup
        host, oci_runtime.py)."""
        return Prestart(self, hide)

    def to_wire(self) -> dict[str, object]:
        return {
            "lower": str(self.lower),
            "scratch": str(self.scratch),
            "rootfs": str(self.rootfs),
            "tmpfs_bytes": self.tmpfs_bytes,
            "layers": [str(p) for p in self.layers],
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RootfsMounts:
        layers = tuple(Path(p) for p in d["layers"])
        return cls(
            Path(d["lower"]), Path(d["scratch"]), Path(d["rootfs"]), d["tmpfs_bytes"], layers
        )


@dataclass(frozen=True)
class Prestart:
    """A child's set-up before it execs the runtime: unshare a mount namespace, make it
    private (nothing propagates back to the host), detach `hide`, mount the rootfs.

    Callable as Popen's `preexec_fn` (a fork of the caller), or sent to the spawner
    (spawner.py), which runs it in a fork of its own small process instead. A failure
    is written to the child's stderr (the runtime's log) and ends it with MOUNT_FAILED,
    since Popen reports a raising preexec_fn without its message."""

    mounts: RootfsMounts
    hide: Path | None = None

    def __call__(self) -> None:
        try:
            if _libc.unshare(_CLONE_NEWNS):
                err = ctypes.get_errno()
                raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
            mount("none", "/", "", "", _MS_REC | _MS_PRIVATE)
            if self.hide is not None and _libc.umount2(str(self.hide).encode(), _MNT_DETACH):
                err = ctypes.get_errno()
                raise OSError(err, f"umount {self.hide}: {os.strerror(err)}")
            self.mounts.make()
        except OSError as exc:
            os.write(2, f"orchard: rootfs: {exc}\n".encode())
            os._exit(MOUNT_FAILED)

    def to_wire(self) -> dict[str, object]:
        return {"mounts": self.mounts.to_wire(), "hide": str(self.hide) if self.hide else None}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> Prestart:
        hide = Path(d["hide"]) if d.get("hide") else None
        return cls(RootfsMounts.from_wire(d["mounts"]), hide)
