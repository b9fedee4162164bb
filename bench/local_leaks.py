"""What a local stress run left behind: folders, cgroups, mounts, veths, processes.

`snapshot(state)` is taken while every sandbox lives (their ids and init pids);
`leftovers(state, seen)` after they were all deleted counts what is still there.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from orchard.env.backends.local.net import veth_names
from orchard.env.backends.runtimes import LEGACY_RUNTIME, RUNTIMES


def snapshot(state: Path) -> dict[str, tuple[int, int]]:
    """sandbox id -> (its init's pid, that process's start time), for every sandbox now."""
    seen: dict[str, tuple[int, int]] = {}
    for box in (state / "sandboxes").iterdir():
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((box / "meta.json").read_text())
            seen[box.name] = (int(meta.get("pid") or 0), int(meta.get("pid_start") or 0))
    return seen


def runtimes(state: Path) -> str:
    """The OCI runtimes the living sandboxes run under (their meta), e.g. `crun`."""
    names: set[str] = set()
    for box in (state / "sandboxes").iterdir():
        with contextlib.suppress(OSError, ValueError):
            meta = json.loads((box / "meta.json").read_text())
            names.add(str(meta.get("runtime", LEGACY_RUNTIME)))
    return "+".join(sorted(names))


def _alive(pid: int, started: int) -> bool:
    """The same process (a pid can be reused once it is gone), not a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0] not in "ZX" and int(fields[19]) == started


def leftovers(state: Path, seen: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Counts of what the deleted sandboxes left: each should be 0."""
    cgroups = sum(1 for sid in seen for _ in Path("/sys/fs/cgroup").glob(f"*/orchard/{sid}")) + sum(
        1 for sid in seen if Path(f"/sys/fs/cgroup/orchard/{sid}").exists()
    )
    # A sandbox's mounts name its id; the service's own (its sockets' tmpfs) stay.
    mounts = sum(
        1
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(state) in line and any(sid in line for sid in seen)
    )
    return {
        "folders": sum(1 for _ in (state / "sandboxes").iterdir()),
        "cgroups": cgroups,
        "mounts": mounts,
        "veths": sum(1 for sid in seen if Path(f"/sys/class/net/{veth_names(sid)[0]}").exists()),
        "processes": sum(1 for pid, t in seen.values() if pid and _alive(pid, t)),
        "runtime_states": sum(1 for sid in seen for rt in RUNTIMES if (state / rt / sid).exists()),
    }
