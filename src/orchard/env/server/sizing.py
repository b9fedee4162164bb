"""The size of a sandbox: one rule for every path that makes one (issue 31, holes 1 and 9).

Create, batch, fork, create-from-snapshot, a pool and its refills and claims all build
their spec with `SandboxService.build_spec`, which sizes it here: a `cpu` or `memory` left
out or given as null is the service's default (ORCHARD_DEFAULT_CPU / _MEMORY), never
"unlimited" (a null ran with no limit and counted as nothing against the quota). A cpu
above the host's CPUs is refused here, in Orchard's words, before a backend sees it (the
engine's refusal named the host's size; the local runtime took it silently).

An unlimited sandbox is only ever the operator's choice (a default of `none`); what it
counts as against its owner's quota is `NoLimit`, which admission.py applies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from orchard.env.config import ServiceConfig
from orchard.env.errors import InvalidRequest
from orchard.env.input_limits import parse_size


def meminfo(name: str) -> int | None:
    """A /proc/meminfo figure in bytes (MemAvailable, MemTotal), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def host_cpus() -> int:
    """The CPUs this service may run on: what its docker and local sandboxes can use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_memory(value: str | int | None) -> int | None:
    """Bytes from an int or a string like '512m', '2g', '1.5GiB' (input_limits.parse_size)."""
    try:
        return parse_size(value, "memory", 4 << 20)
    except ValueError as e:
        raise InvalidRequest(str(e)) from None


def size(
    config: ServiceConfig, cpu: float | None, memory: int | None, *, host: bool
) -> tuple[float | None, int | None]:
    """(cpu, memory bytes) of a create: what it asked, else the defaults; `host`: check the
    cpu against this host (docker, local; a cluster's scheduler decides for kubernetes)."""
    cpu = config.default_cpu if cpu is None else cpu
    memory = config.default_memory_bytes if memory is None else memory
    if host and cpu is not None:
        most = host_cpus()
        if cpu > most:
            raise InvalidRequest(
                f"cpu={cpu:g} is more than one sandbox can have on this host (at most {most})",
                details={"limit": "host_cpus", "max": most},
            )
    return cpu, memory


@runtime_checkable
class DefaultSized(Protocol):
    """A backend that sizes a sandbox which names no cpu/memory itself (kubernetes: its
    pod requests), so that such a sandbox is never unlimited there."""

    def default_size(self) -> tuple[float, int]: ...


@dataclass(frozen=True)
class NoLimit:
    """What a sandbox with no cpu (or memory) limit counts as against its owner's quota.

    docker/local: the whole host, which it may use, and `refused`: none is made for an
    owner with a max_cpu (max_memory), whose quota could not hold. kubernetes: the size
    the backend gives it, admitted like any other.
    """

    cpu: float
    memory: int
    refused: bool


def no_limit(backend: object) -> NoLimit:
    if isinstance(backend, DefaultSized):
        cpu, memory = backend.default_size()
        return NoLimit(float(cpu), int(memory), refused=False)
    return NoLimit(float(host_cpus()), meminfo("MemTotal") or 0, refused=True)
