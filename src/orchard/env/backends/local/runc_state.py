"""What runc leaves of a sandbox whose init has died, removed without starting runc.

`runc delete` of a stopped container loads its state, removes its cgroup in every
hierarchy and then its state folder: one more Go process (its CPU and a dynamic-loader
start: docs/benchmarks.md) per sandbox. Once the init is known dead (its pidfd
fired: the kernel ends the whole PID namespace before that, so no process of the sandbox
is left), the backend does the same two steps itself. Anything unexpected (a cgroup that
still has tasks, a state folder that will not go) is left for `runc delete --force`.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_dirs(parent: str, sandbox_id: str) -> list[Path]:
    """The sandbox's cgroup in each hierarchy (v1: one per controller mount; v2: one)."""
    return [CGROUP_ROOT / parent / sandbox_id, *CGROUP_ROOT.glob(f"*/{parent}/{sandbox_id}")]


def remove_cgroups(parent: str, sandbox_id: str) -> bool:
    """Remove the sandbox's (empty) cgroups; False if one is still in use."""
    clean = True
    for path in cgroup_dirs(parent, sandbox_id):
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError:  # EBUSY: tasks or child cgroups left
            clean = False
    return clean


def release_stopped(runc_root: Path, parent: str, sandbox_id: str) -> bool:
    """Do `runc delete` of a container whose init is dead; False: let runc do it."""
    if not remove_cgroups(parent, sandbox_id):
        return False
    state = runc_root / sandbox_id
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(state)
    return not state.exists()
