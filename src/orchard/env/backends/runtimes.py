"""What each OCI runtime of the local backend can do: one table, one row per runtime.

The backend, `auto` (`select.py`) and the settings (`ServiceConfig.local_runtime`) ask
this table instead of comparing names, so a runtime's abilities are written down once.
Why each column is what it is (measured, and tested in tests/backends/test_oci_runtime.py)
is in `local/oci_runtime.py`. The next runtime (youki, runsc, ...) is one more row here,
once the local backend's tests pass under it; until then `local_runtime` refuses it.

Pure data, no imports from the package: the settings load it without any backend.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeKind:
    """What one OCI runtime can do, as the local backend asks it."""

    name: str
    # Mounts the sandbox's overlay itself, as the spec's first mount (destination `/`), so
    # a create needs no `preexec` fork; otherwise it is mounted in the runtime's namespace.
    mounts_rootfs: bool
    # Can CRIU-dump and restore a sandbox (`checkpoint` / `restore`): memory snapshots.
    checkpoints: bool
    # Refuses a hybrid cgroup host whose v2 mount holds a controller: its creates detach
    # that mount in their private namespace first.
    refuses_hybrid_v2: bool
    why: str


# In the order `auto` picks them: the first one installed.
RUNTIMES: dict[str, RuntimeKind] = {
    "crun": RuntimeKind(
        "crun",
        mounts_rootfs=False,
        checkpoints=False,  # Debian's crun is built without CRIU
        refuses_hybrid_v2=True,
        why="C, one process per create: the fastest",
    ),
    "runc": RuntimeKind(
        "runc",
        mounts_rootfs=True,
        checkpoints=True,
        refuses_hybrid_v2=False,
        why="complete: memory snapshots (CRIU) need it",
    ),
}

# What `local_runtime` (ORCHARD_LOCAL_RUNTIME, `--local-runtime`) may name.
LOCAL_RUNTIMES = ("auto", *RUNTIMES)
# The runtime of sandboxes whose meta predates the `runtime` field.
LEGACY_RUNTIME = "runc"


def checkpointing() -> RuntimeKind:
    """The runtime memory snapshots dump with and restore under (the first that can)."""
    return next(kind for kind in RUNTIMES.values() if kind.checkpoints)
