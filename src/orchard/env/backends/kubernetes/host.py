"""What the backend's helpers (pools, tenants, replicas) use of the backend, as a Protocol.

They are handed the backend itself; typing them against this instead of
`KubernetesBackend` keeps the imports one way (backend -> helpers, never back)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import httpx2
from lightkube import AsyncClient

from orchard.env.backends.base import SandboxRecord
from orchard.env.backends.kubernetes.objects import KubernetesOptions
from orchard.env.errors import OrchardError

_T = TypeVar("_T")


class ClusterHost(Protocol):
    """The backend's API-call core and its watch cache."""

    opts: KubernetesOptions
    _sem: asyncio.Semaphore
    _pods: dict[str, dict[str, Any]]

    @property
    def client(self) -> AsyncClient: ...

    async def _call(self, what: str, fn: Callable[[], Awaitable[_T]]) -> _T: ...

    @staticmethod
    def _backoff(attempt: int) -> float: ...

    @staticmethod
    def _error(what: str, e: httpx2.HTTPStatusError) -> OrchardError: ...

    async def _gone_ok(self, what: str, fn: Callable[[], Awaitable[Any]]) -> None: ...

    def _store(self, pod: dict[str, Any]) -> str | None: ...

    def _ensure_watch(self) -> None: ...

    async def _annotate(self, sid: str, annotations: dict[str, str | None]) -> SandboxRecord: ...
