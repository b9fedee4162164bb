"""The OCI runtime spec (runc's config.json) of one local sandbox, as a plain function.

It matches what the Docker backend asks of the engine, so a sandbox behaves the same on
both: the agent (bind-mounted read-only) is the process and runs as root; Docker's default
capabilities minus NET_RAW, MKNOD, AUDIT_WRITE and SETFCAP; no new privileges; masked and
read-only /proc paths as runc's default spec; its own PID, mount, IPC, UTS and network
namespaces; cgroup limits for cpu, memory (no swap beyond it) and pids; no IPv6.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CPU_PERIOD_US = 100_000
# Docker's default set without NET_RAW (forged source addresses), MKNOD, AUDIT_WRITE and
# SETFCAP; SETUID/SETGID, CHOWN, DAC_OVERRIDE, FOWNER and KILL stay for the root agent.
CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
)
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)
# Syscalls no sandbox needs and that widen the kernel's attack surface (a deny list, so
# ordinary programs never meet a surprise EPERM). Namespace creation is refused below too:
# without it an unprivileged user namespace would hand the sandbox fresh capabilities.
DENIED_SYSCALLS = (
    "acct",
    "add_key",
    "bpf",
    "delete_module",
    "finit_module",
    "init_module",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "open_by_handle_at",
    "perf_event_open",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "swapoff",
    "swapon",
    "syslog",
    "unshare",
    "userfaultfd",
)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
_CLONE_NS_FLAGS = (0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000)
_EPERM = 1
_ENOSYS = 38


@dataclass(frozen=True)
class SpecInput:
    """What differs between sandboxes; everything else is fixed policy."""

    rootfs: str
    args: Sequence[str]
    env: Sequence[str]
    cwd: str
    hostname: str
    cgroups_path: str
    binds: Sequence[tuple[str, str, bool]] = ()  # (host source, destination, read-only)
    # A mount runc makes over the rootfs folder first (the overlay: mount_ns.oci_mount).
    rootfs_mount: Mapping[str, Any] | None = None
    cpu: float | None = None
    memory_bytes: int | None = None
    pids_limit: int | None = None
    sysctl: Mapping[str, str] = field(default_factory=dict)
    shm_bytes: int = 64 << 20
    # Open files: the service's own hard limit (runc cannot raise it; Docker passes its own).
    nofile: int = field(default_factory=lambda: resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def merge_env(image_env: Sequence[str], overrides: Mapping[str, str]) -> list[str]:
    """The image's env with the request's on top (as Docker merges them); PATH always set."""
    merged: dict[str, str] = {}
    for item in image_env:
        key, _, value = item.partition("=")
        merged[key] = value
    merged.update(overrides)
    merged.setdefault("PATH", DEFAULT_PATH)
    return [f"{k}={v}" for k, v in merged.items()]


def _seccomp() -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": _EPERM},
        # glibc falls back to clone(2) on ENOSYS, where the flags can be inspected.
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": _ENOSYS},
    ]
    for flag in _CLONE_NS_FLAGS:
        rules.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": _EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules,
    }


def _mounts(inp: SpecInput) -> list[dict[str, Any]]:
    nosuid = ["nosuid", "noexec", "nodev"]
    mounts: list[dict[str, Any]] = [dict(inp.rootfs_mount)] if inp.rootfs_mount else []
    mounts += [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": nosuid},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": [*nosuid, "mode=1777", f"size={inp.shm_bytes}"],
        },
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": nosuid},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*nosuid, "ro"]},
    ]
    for source, dest, readonly in inp.binds:
        opts = ["bind", "nosuid", "nodev"] + (["ro"] if readonly else [])
        mounts.append({"destination": dest, "type": "bind", "source": source, "options": opts})
    return mounts


def _resources(inp: SpecInput) -> dict[str, Any]:
    res: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    if inp.cpu:
        res["cpu"] = {"quota": int(inp.cpu * CPU_PERIOD_US), "period": CPU_PERIOD_US}
    if inp.memory_bytes:
        res["memory"] = {"limit": inp.memory_bytes, "swap": inp.memory_bytes}
    if inp.pids_limit:
        res["pids"] = {"limit": inp.pids_limit}
    return res


def runtime_spec(inp: SpecInput) -> dict[str, Any]:
    """config.json for `runc run`; the network namespace is always a new one (see backend.py)."""
    caps = list(CAPABILITIES)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(inp.args),
            "env": list(inp.env),
            "cwd": inp.cwd or "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": inp.nofile, "soft": inp.nofile}],
            "noNewPrivileges": True,
        },
        "root": {"path": inp.rootfs, "readonly": False},
        "hostname": inp.hostname,
        "mounts": _mounts(inp),
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "cgroupsPath": inp.cgroups_path,
            # Nothing propagates into the sandbox's mounts from the host, nor back (runc's
            # default, rslave, would let the host's later mounts under them in).
            "rootfsPropagation": "rprivate",
            "resources": _resources(inp),
            "sysctl": dict(inp.sysctl),
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
            "seccomp": _seccomp(),
        },
    }
