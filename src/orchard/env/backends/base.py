"""The one small interface every backend implements (docker, local runc, kubernetes).

A backend owns the control plane only: create, delete, list, update, and where the
sandbox's agent listens. The data path (service -> agent over HTTP with the
per-sandbox token) is the same for all backends. The backend is the source of
truth: a service that restarts rebuilds its whole view from `list()`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from orchard.env.backends.volume_base import VolumeMount
from orchard.env.models import NetworkPolicy

BackendState = Literal["pending", "running", "paused", "exited", "failed"]

# Added to a sandbox's pids limit (Docker's PidsLimit, local's cgroup) for the agent's own
# threads (the Go runtime starts several):
# `pids_limit` counts the user's processes, and a small one must not stop the agent from
# starting ("failed to create new OS thread") or from serving once a fork bomb fills the rest.
AGENT_PIDS_RESERVE = 32


@dataclass(frozen=True)
class AgentEndpoint:
    """How to reach a sandbox's agent: a Unix socket on this host, or an HTTP base URL."""

    socket_path: str | None = None
    base_url: str | None = None

    @property
    def known(self) -> bool:
        """False while a pod has no IP yet (Kubernetes, before it runs)."""
        return bool(self.socket_path or self.base_url)


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to start one sandbox; ids and tokens are chosen by the service."""

    id: str
    owner: str
    image: str
    agent_token: str
    expires_at: float
    cmd: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    user: str | None = None
    cpu: float | None = None
    memory_bytes: int | None = None
    pids_limit: int | None = None
    # Bytes the sandbox may write to its root filesystem; None: the backend's default.
    disk_bytes: int | None = None
    idle_timeout_s: float | None = None
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    labels: dict[str, str] = field(default_factory=dict)
    # Start from this snapshot's files (backends/state_base.py); the service checked its owner.
    snapshot_id: str | None = None
    # Volumes to mount (backends/volume_host.py); the service checked their owner.
    volumes: tuple[VolumeMount, ...] = ()


@dataclass
class SandboxRecord:
    """What the backend knows of one sandbox; rebuilt from labels after a restart."""

    id: str
    owner: str
    image: str
    state: BackendState
    created_at: float
    expires_at: float
    endpoint: AgentEndpoint
    idle_timeout_s: float | None = None
    network: NetworkPolicy = field(default_factory=NetworkPolicy)
    labels: dict[str, str] = field(default_factory=dict)
    cpu: float | None = None
    memory_bytes: int | None = None
    pids_limit: int | None = None
    disk_bytes: int | None = None  # the limit in force; None: unlimited
    exit_code: int | None = None
    error: str | None = None
    # Who execs run as when a request names no user: the spec's user, else the image's USER.
    default_user: str | None = None
    volumes: tuple[VolumeMount, ...] = ()
    # The latest activity another replica may have seen (backends shared by replicas):
    # the idle clock runs from the later of this and the service's own.
    active_at: float | None = None
    # What the agent must be told before the sandbox's first use (AgentDefaults' JSON): a
    # claim on a backend shared by replicas writes it on the sandbox in its one write, and
    # each replica's connection sends it first (PUT /defaults: the same values again if told).
    agent_defaults: str | None = None


class Backend(Protocol):
    name: str

    async def create(self, spec: SandboxSpec) -> SandboxRecord:
        """Start the sandbox (pulling its image if missing) and return once its agent was started.

        Readiness (the agent answering /health) is checked by the service, not here.
        Raises ImageNotFound, RegistryUnavailable, Unavailable, InvalidRequest.
        """
        ...

    async def delete(self, sandbox_id: str) -> None:
        """Remove the sandbox and everything it left on the host; deleting what is gone is fine."""
        ...

    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    async def list(self) -> list[SandboxRecord]:
        """Every sandbox this backend manages (all owners), including exited ones."""
        ...

    async def set_expiry(self, sandbox_id: str, expires_at: float) -> SandboxRecord: ...

    async def set_network(self, sandbox_id: str, policy: NetworkPolicy) -> SandboxRecord:
        """Apply a new egress policy at run time (names re-resolved now)."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Retiring(Protocol):
    """Optional: a delete whose teardown can wait (kubernetes/retire.py).

    `kill` stops every process of the sandbox (the service asks its agent); the backend
    then keeps it from every listing and removes it when that costs the node least. False:
    this one must be deleted outright (the service then calls `delete`).
    """

    async def retire(self, sandbox_id: str, kill: Callable[[], Awaitable[object]]) -> bool: ...


@runtime_checkable
class OrphanCleaner(Protocol):
    """Optional: a backend that also leaves host-side remains `list()` cannot see.

    The service's reconcile calls it after its own pass (folders with no container, pods
    stuck pending), with the ids it still knows; it returns the ids it removed.
    """

    async def remove_orphans(self, known: set[str]) -> list[str]: ...
