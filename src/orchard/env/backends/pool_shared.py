"""Warm pools held by the cluster, shared by every service replica (docs/pools.md).

Docker and local keep a pool in the service's state dir and its membership in memory
(server/pools.py); that is one service's truth. A backend that several replicas share
(kubernetes) offers this instead: pool definitions the whole cluster sees, membership
read from the sandboxes themselves, a claim that only one replica can win (an
optimistic-lock update), and a lease naming the one replica that refills. The service's
side of it is server/pools_cluster.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.pool_claim import Claim

MemberState = Literal["creating", "ready", "claiming"]


@dataclass(frozen=True)
class PoolMember:
    """One unclaimed sandbox of a pool, as the cluster shows it now."""

    id: str
    state: MemberState
    since: float  # wall time: made (creating, ready) or taken (claiming)
    version: str  # what the optimistic lock of a claim compares
    record: SandboxRecord


@dataclass(frozen=True)
class PoolCounts:
    claimed: int = 0
    failed: int = 0
    last_error: str | None = None


class PoolCluster(Protocol):
    """Pools in the cluster. Pool records are server/pool_store.PoolRecord as dicts (this
    layer may not import the service's)."""

    async def start(self) -> None:
        """Begin watching pools; returns once the first list is in."""
        ...

    async def close(self) -> None: ...

    def definitions(self) -> list[dict[str, Any]]:
        """Every pool of this service instance, from the watch."""
        ...

    async def definition(self, owner: str, name: str) -> dict[str, Any] | None:
        """One pool: from the watch, else asked of the cluster (made a moment ago elsewhere)."""
        ...

    async def define(self, pool: dict[str, Any]) -> None:
        """Create a pool; `Conflict` if it exists (made by any replica)."""
        ...

    async def undefine(self, owner: str, name: str) -> None: ...

    def counts(self, owner: str, name: str) -> PoolCounts: ...

    async def add_counts(self, owner: str, name: str, counts: PoolCounts) -> None:
        """Add claims and failed refills to what the pool shows (last error replaced)."""
        ...

    def members(self, owner: str, name: str) -> list[PoolMember]:
        """The pool's unclaimed sandboxes (running or not), from the watch."""
        ...

    def strays(self, known: set[tuple[str, str]]) -> list[PoolMember]:
        """Unclaimed sandboxes whose pool is not among `known` (owner, name)."""
        ...

    async def take(self, member: PoolMember, claim: Claim | None, by: str) -> SandboxRecord | None:
        """Win `member` for a claim, or None when another claim (any replica) won it first
        or it is gone. With `claim` the hand-over is complete in the same update; without,
        the sandbox is held as `claiming` until `hand_over` (or, past a deadline, removed
        by the refiller)."""
        ...

    async def hand_over(self, sandbox_id: str, claim: Claim) -> SandboxRecord:
        """Finish a claim that `take` began: the sandbox leaves its pool."""
        ...

    async def mark_ready(self, sandbox_id: str) -> None:
        """A `creating` sandbox's agent answers: claims may take it now."""
        ...

    async def lead(self, holder: str, duration_s: int) -> bool:
        """Take or renew the refiller's lease; False while another holder's is valid."""
        ...

    async def resign(self, holder: str) -> None:
        """Give the lease up (a stopping replica), so another takes over at once."""
        ...


@runtime_checkable
class SharedPools(Protocol):
    def shared_pools(self) -> PoolCluster: ...
