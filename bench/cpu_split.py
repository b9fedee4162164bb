"""Where a local sandbox's CPU goes: the service, the runtime, the agent, the commands, the kernel.

All from /proc and the sandboxes' cgroups, so other work on a shared host is not counted
(it still slows ours down). For the `local` backend the service is the parent of
everything: runc and `ip` are its children, and each sandbox's init becomes its child too
(a child subreaper), so once every sandbox is deleted and reaped, the service's
children's CPU (cutime + cstime) is runc + ip + every sandbox's whole life. The sandboxes'
own share is read from their cgroups while they are still alive (`sandbox_cpu`): the
agent's threads (/proc/<pid>/task/*/schedstat: ns, not rounded to clock ticks; this
includes the last stage of `runc init`, which becomes the agent by exec) and the rest of
the cgroup, the commands it ran. What is left of the children is the runtime: `runc run`
and `runc init` up to joining the sandbox's cgroup, `runc delete`, `ip`.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[float, float, float, float]:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0, 0.0, 0.0
    f = text[text.rindex(")") + 2 :].split()
    u, s, cu, cs = (int(x) / TICK for x in f[11:15])
    return u, s, cu, cs


def _spawners(pid: int) -> list[int]:
    """The service's living spawner (backends/local/spawner.py), which forks the runtime's
    children that mount a rootfs first: its CPU and its reaped children's are the
    runtime's, not yet in the service's children's times while it lives."""
    found = []
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                if b"spawner.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
    return found


def proc_times(pid: int) -> dict[str, float]:
    """CPU seconds of a process: own user/sys and its reaped children's user/sys (with
    the spawner's whole tree as if it were reaped)."""
    u, s, cu, cs = _stat(pid)
    for helper in _spawners(pid):
        hu, hs, hcu, hcs = _stat(helper)
        cu, cs = cu + hu + hcu, cs + hs + hcs
    return {"user": u, "sys": s, "cuser": cu, "csys": cs}


def host_busy_s() -> float:
    """CPU seconds the whole host has been busy (every process and kernel thread)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in f]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / TICK


def _threads_s(pid: int) -> float:
    total = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def _cgroup_s(sandbox_id: str) -> tuple[float, float]:
    """(user, sys) seconds of a sandbox's cgroup (v1 cpuacct, else v2 cpu.stat)."""
    v1 = Path(f"/sys/fs/cgroup/cpuacct/orchard/{sandbox_id}")
    with contextlib.suppress(OSError, ValueError):
        user = int((v1 / "cpuacct.usage_user").read_text()) / 1e9
        sys_ = int((v1 / "cpuacct.usage_sys").read_text()) / 1e9
        return user, sys_
    stat: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/sys/fs/cgroup/orchard/{sandbox_id}/cpu.stat").read_text().splitlines():
            k, v = line.split()
            stat[k] = int(v)
    return stat.get("user_usec", 0) / 1e6, stat.get("system_usec", 0) / 1e6


def sandbox_cpu(state: Path) -> dict[str, float]:
    """CPU seconds so far of the living local sandboxes under a state folder."""
    out = {"sandboxes": 0.0, "sandbox_user": 0.0, "sandbox_sys": 0.0, "agent": 0.0}
    for box in (state / "sandboxes").iterdir():
        user, sys_ = _cgroup_s(box.name)
        out["sandboxes"] += 1
        out["sandbox_user"] += user
        out["sandbox_sys"] += sys_
        with contextlib.suppress(OSError, ValueError):
            pid = json.loads((box / "meta.json").read_text()).get("pid")
            if pid:
                out["agent"] += _threads_s(int(pid))
    return out


def split(
    before: dict[str, float], after: dict[str, float], boxes: dict[str, float], n: int
) -> dict[str, float]:
    """ms per sandbox of each part, from the service's times around the run and the boxes'."""
    d = {k: after[k] - before[k] for k in before}
    children = d["cuser"] + d["csys"]
    in_boxes = boxes["sandbox_user"] + boxes["sandbox_sys"]
    agent = min(boxes["agent"], in_boxes)
    parts = {
        "service": d["user"] + d["sys"],
        "service_sys": d["sys"],
        "runtime": max(children - in_boxes, 0.0),
        "agent": agent,
        "commands": in_boxes - agent,
        "sandbox_sys": boxes["sandbox_sys"],
        "children_sys": d["csys"],
    }
    # The kernel's share of it all (system time of the service, runc and the sandboxes).
    parts["kernel"] = d["sys"] + d["csys"]
    return {k: 1000 * v / n for k, v in parts.items()}
