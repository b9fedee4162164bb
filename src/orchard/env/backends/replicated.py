"""What a backend shared by several service replicas offers the service (Kubernetes).

A replica's memory holds only its own view: what it is creating, which sandboxes it saw
active, what its list said a moment ago. Where replicas share a backend, whatever one of
them decides for all (a quota, an idle or expired sandbox, a create nobody finishes) must
be read from, and written to, the backend. These Protocols are those seams; the service
uses them where a backend has them (docs/kubernetes.md, "Several replicas").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from orchard.env.backends.base import SandboxRecord


@dataclass(frozen=True)
class TenantHeld:
    """What one owner holds, counted where every replica counts the same (the cluster)."""

    sandboxes: int
    creating: int
    cpu: float
    memory: int


@runtime_checkable
class ClusterQuota(Protocol):
    """A backend that enforces the owners' quotas itself (the API server's ResourceQuota)."""

    async def tenant_usage(self, owner: str) -> TenantHeld | None:
        """What `owner` holds now, read from the backend; None where it does not count."""
        ...


@runtime_checkable
class ReplicaShared(Protocol):
    """A backend whose sandboxes several replicas create, reap and serve at once."""

    @property
    def coordinates_replicas(self) -> bool:
        """True when the backend itself finds creates abandoned by a dead replica, so the
        service leaves a pod pending for long alone (another replica may still wait)."""
        ...

    async def handed_over(self, sandbox_id: str) -> None:
        """The create is answered: the sandbox is its owner's, no longer a create of ours."""
        ...

    def note_activity(self, sandbox_id: str, at: float) -> None:
        """A request reached the sandbox (cheap: written to the backend now and then)."""
        ...

    async def delete_if(self, sandbox_id: str, still: Callable[[SandboxRecord], bool]) -> bool:
        """Delete the sandbox if `still(fresh record)` holds and nothing changed it since
        (an optimistic lock): False, and kept, when another replica extended, touched or
        claimed it meanwhile. Absent counts as deleted."""
        ...
