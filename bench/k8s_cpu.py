"""Where a cold create's CPU goes on the trial node: the node's whole CPU and its parts.

The cluster's daemons run as plain processes on this machine (deploy/cluster/cluster.sh),
its pods in the kubelet's `kubepods` cgroups, so one sample reads: the host's busy time
(/proc/stat), each daemon's own and reaped children's time (/proc/PID/stat of the pid
cluster.sh recorded), the pods'
cgroup (`cpuacct/kubepods`), the Orchard replicas' pod cgroups, and this process (the
bench's own client). What no part names ("rest": containerd's shims and the runc they
reap, the kernel's threads, anything else on the host) is the difference. A delta of two
samples, divided by the pods made, is the CPU per pod that bench/k8s_floor.py puts beside
the kubelet's floor.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
KUBEPODS = Path("/sys/fs/cgroup/cpuacct/kubepods")
CLUSTER_RUN = Path("/run/orchard-cluster")  # cluster.sh's pid files, one per daemon
DAEMONS = (
    "kube-apiserver",
    "etcd",
    "kubelet",
    "containerd",
    "kube-router",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
)


def _busy_s() -> float:
    """All cores' non-idle time (user, nice, system, irq, softirq, steal)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / TICK


def cluster_pids(names: tuple[str, ...] = DAEMONS, run: Path = CLUSTER_RUN) -> dict[str, int]:
    """The trial cluster's daemons that run now, by name, from their pid files in `run`
    (so Docker's own containerd is not counted as the node's)."""
    out: dict[str, int] = {}
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            pid = int((run / f"{name}.pid").read_text().strip())
            if Path(f"/proc/{pid}").exists():
                out[name] = pid
    return out


def proc_cpu_s(pid: int, children: bool = False) -> float:
    """A process's CPU seconds (utime + stime; `children`: with its reaped children's),
    NaN once it is gone."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(x) for x in f[11 : 15 if children else 13]) / TICK
    return float("nan")


def _daemon_s() -> dict[str, float]:
    pids = cluster_pids()
    return {n: proc_cpu_s(pids[n], children=True) if n in pids else 0.0 for n in DAEMONS}


def _cgroup_s(path: Path) -> float:
    try:
        return int((path / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        return 0.0


def _pods_s(pod_uids: list[str]) -> float:
    total = 0.0
    for uid in pod_uids:  # the kubelet's QoS levels (a recursive glob races pods going)
        for qos in ("", "burstable", "besteffort"):
            total += _cgroup_s(KUBEPODS / qos / f"pod{uid}")
    return total


def _self_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Sample:
    busy: float
    daemons: dict[str, float]
    kubepods: float
    service: float
    client: float


def sample(service_pod_uids: list[str] | None = None) -> Sample:
    """One reading; `service_pod_uids`: the Orchard replicas' pods (counted apart)."""
    return Sample(
        busy=_busy_s(),
        daemons=_daemon_s(),
        kubepods=_cgroup_s(KUBEPODS),
        service=_pods_s(service_pod_uids or []),
        client=_self_s(),
    )


def per_pod(before: Sample, after: Sample, pods: int) -> dict[str, float]:
    """Milliseconds of CPU per pod made between two samples, by part; `rest` is what no
    part names, `total` the node's busy time."""
    n = max(pods, 1)
    ms = {"total": (after.busy - before.busy) * 1000 / n}
    for name in DAEMONS:
        ms[name] = (after.daemons[name] - before.daemons[name]) * 1000 / n
    service = (after.service - before.service) * 1000 / n
    ms["orchard service pods"] = service
    ms["other pods (sandboxes, init, helpers)"] = (
        after.kubepods - before.kubepods
    ) * 1000 / n - service
    ms["bench client"] = (after.client - before.client) * 1000 / n
    ms["rest (shims, runc, kernel)"] = ms["total"] - sum(v for k, v in ms.items() if k != "total")
    return {k: round(v, 1) for k, v in ms.items()}


# ext4 without a journal (this host's root) skips inodes freed in the last 60 s (or 360 s
# while their table block is dirty) when it allocates new ones, so a burst of creates right
# after a burst of deletes costs more (docs/benchmarks.md, 3b).
RECENT_DELETES_S = 65.0


def settle(
    deleted_at: float | None = None, quiet_cores: float = 0.3, timeout_s: float = 240
) -> float:
    """Wait until the node is quiet: under `quiet_cores` busy over 3 s and, if something
    was deleted at `deleted_at` (time.monotonic()), RECENT_DELETES_S past it. So each side
    of a comparison starts on a node no earlier side's teardown still loads (a bare pod
    deleted with grace 0 leaves the API at once and its containers after). Seconds waited."""
    t0 = time.monotonic()
    if deleted_at is not None:
        time.sleep(max(0.0, deleted_at + RECENT_DELETES_S - t0))
    while time.monotonic() - t0 < timeout_s:
        b0 = _busy_s()
        time.sleep(3)
        if (_busy_s() - b0) / 3 < quiet_cores:
            break
    else:
        print(f"settle: the node is still busy after {timeout_s:.0f} s", file=sys.stderr)
    return time.monotonic() - t0
