"""The OCI runtime a local sandbox runs under: crun where installed (fast), runc (complete).

Both take the same bundle (`oci_spec.runtime_spec`) and the same verbs (`run --detach`,
`pause`, `resume`, `delete --force`), so the backend drives either. They differ in cost
and in three abilities, written down once in `backends/runtimes.py` (the table this module's
`OciRuntime` reads), so the backend asks instead of comparing names:

- crun is C; runc is two Go processes per create (`runc run`, `runc init`), each with the
  Go runtime's start-up: crun takes less host CPU per sandbox (docs/benchmarks.md §3).
- runc can mount the sandbox's overlay itself (the spec's first mount, destination `/`),
  so a create needs no `preexec` fork of the service; crun cannot (it mounts relative to
  the rootfs), so its overlay is mounted in the private namespace crun starts in
  (`mount_ns.RootfsMounts.preexec`).
- crun refuses a hybrid cgroup host whose v2 hierarchy holds a controller ("cgroups in
  hybrid mode not supported"; here cgroup v2 holds `hugetlb`). In the private namespace
  it starts in, the v2 mount is detached first, so crun sees the v1 hierarchies only,
  which hold every controller the spec limits. Nothing changes on the host.
- Memory snapshots (CRIU, backends/local/criu.py) are `runc checkpoint|restore`: Debian's crun
  is built without CRIU. A sandbox keeps the runtime it started under (its meta), so a
  restored sandbox is runc's even where new ones are crun's.

`ORCHARD_LOCAL_RUNTIME` (`orchard serve --local-runtime`): `auto` (crun if installed,
else runc), `crun` or `runc`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from orchard.env.backends.local.runc_exe import sealed_runc
from orchard.env.backends.runtimes import LOCAL_RUNTIMES, RUNTIMES, RuntimeKind
from orchard.env.errors import Unavailable

UNIFIED = Path("/sys/fs/cgroup/unified")


def v2_holds_controllers(unified: Path = UNIFIED) -> bool:
    """Whether this is a hybrid host whose cgroup v2 mount holds a controller."""
    try:
        return bool((unified / "cgroup.controllers").read_text().split())
    except OSError:
        return False


@dataclass(frozen=True)
class OciRuntime:
    """One runtime binary and its state folder (`--root`), kept apart per runtime."""

    name: str
    path: str
    root: Path

    @property
    def kind(self) -> RuntimeKind:
        """Its row of the table: what it can do."""
        return RUNTIMES[self.name]

    @property
    def mounts_rootfs(self) -> bool:
        """Whether it mounts an overlay at `/` from the spec (`mount_ns.oci_mount`)."""
        return self.kind.mounts_rootfs

    @property
    def checkpoints(self) -> bool:
        """Whether it can CRIU-dump and restore a sandbox (memory snapshots)."""
        return self.kind.checkpoints

    @cached_property
    def hides_unified(self) -> bool:
        """Whether its creates need the cgroup v2 mount detached in their namespace."""
        return self.kind.refuses_hybrid_v2 and v2_holds_controllers()

    @property
    def names(self) -> frozenset[str]:
        """What its processes are called (/proc/<pid>/comm): its binary's name, or the
        descriptor number of its sealed copy that it was executed from."""
        return frozenset(Path(p).name[:15] for p in (self.path, sealed_runc(self.path)))

    def argv(self, *args: str) -> list[str]:
        """The command line: the binary from its sealed copy (runc_exe; crun checks the
        same seals before re-cloning itself), its own state folder, then `args`."""
        return [sealed_runc(self.path), "--root", str(self.root), *args]


def installed(state_dir: Path) -> dict[str, OciRuntime]:
    """The runtimes on PATH, each with its folder under the state dir (runc's: `runc/`)."""
    found = {}
    for name in RUNTIMES:
        path = shutil.which(name)
        if path is not None:
            found[name] = OciRuntime(name, path, state_dir / name)
    return found


def choose(requested: str, available: dict[str, OciRuntime]) -> OciRuntime:
    """The runtime new sandboxes start under; a clear error when it is not installed."""
    if requested not in LOCAL_RUNTIMES:
        choices = ", ".join(LOCAL_RUNTIMES)
        raise ValueError(f"local runtime must be one of {choices}, not {requested!r}")
    if requested == "auto":
        for name in RUNTIMES:  # in the table's order of preference
            if name in available:
                return available[name]
        raise Unavailable("the local backend needs runc or crun (apt-get install runc crun)")
    if requested not in available:
        raise Unavailable(
            f"the local backend was asked for `{requested}`, which is not on PATH "
            f"(apt-get install {requested})"
        )
    return available[requested]
