"""`client.sandboxes` and one `AsyncSandbox`: the sync names (`Sandboxes`, `Sandbox`), awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self, Unpack

from orchard.env import models as m
from orchard.env.errors import NotFound
from orchard.env.models import state as sm
from orchard.env.sdk import calls
from orchard.env.sdk.aio.files import AsyncFiles
from orchard.env.sdk.aio.processes import AsyncProcesses
from orchard.env.sdk.calls import CreateOptions, ExecOptions
from orchard.env.sdk.core import AsyncClient, Call, twin
from orchard.env.sdk.send import port_url
from orchard.env.sdk.sync.sandboxes import Batch, Egress, Network, Sandbox, Sandboxes


class AsyncSandboxes:
    """`client.sandboxes` (async)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    def create(self, image: str = "", **opts: Unpack[CreateOptions]) -> _PendingSandbox:
        """Start one sandbox: `await` it, or `async with` it to also delete it on exit.

        :param image: any OCI image reference (pulled if missing)
        :param opts: as for `Sandboxes.create`
        :return: an awaitable of the sandbox, also an async context manager
        :raises InvalidRequest: a bad argument, at once (before anything is awaited); the
            rest of `Sandboxes.create`'s errors when it is awaited
        """
        call = calls.create_sandbox(image, opts)  # validates now, before anything is awaited
        return _PendingSandbox(self._client, call)

    @twin(Sandboxes.create_batch)
    async def create_batch(
        self, image: str, count: int, **opts: Unpack[CreateOptions]
    ) -> AsyncBatch:
        result = await self._client._send(calls.create_batch(image, count, opts))
        return AsyncBatch([AsyncSandbox(self._client, s) for s in result.sandboxes], result.errors)

    @twin(Sandboxes.get)
    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._client, await self._client._send(calls.get_sandbox(sandbox_id)))

    @twin(Sandboxes.list)
    async def list(self, labels: dict[str, str] | None = None) -> list[AsyncSandbox]:
        infos = await self._client._send(calls.list_sandboxes(labels))
        return [AsyncSandbox(self._client, info) for info in infos]

    @twin(Sandboxes.delete)
    async def delete(self, sandbox_id: str) -> None:
        await self._client._send(calls.delete_sandbox(sandbox_id))


class _PendingSandbox:
    """What `AsyncSandboxes.create` returns: awaitable, and an async context manager."""

    def __init__(self, client: AsyncClient, call: Call[m.Sandbox]) -> None:
        self._client = client
        self._call = call
        self._sandbox: AsyncSandbox | None = None

    async def _create(self) -> AsyncSandbox:
        self._sandbox = AsyncSandbox(self._client, await self._client._send(self._call))
        return self._sandbox

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._create().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        return await self._create()

    async def __aexit__(self, *exc: object) -> None:
        if self._sandbox is not None:
            await self._sandbox.delete()


@dataclass
class AsyncBatch:
    """The outcome of `create_batch`; as an async context manager it deletes every sandbox."""

    sandboxes: list[AsyncSandbox]
    errors: list[m.ErrorBody] = field(default_factory=list)

    def __iter__(self) -> Iterator[AsyncSandbox]:
        return iter(self.sandboxes)

    def __getitem__(self, index: int) -> AsyncSandbox:
        return self.sandboxes[index]

    def __len__(self) -> int:
        return len(self.sandboxes)

    @twin(Batch.delete)
    async def delete(self) -> None:
        await asyncio.gather(*(sb.delete(missing_ok=True) for sb in self.sandboxes))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


@dataclass
class AsyncFork(AsyncBatch):
    """The outcome of `sb.fork(n)` (async)."""

    snapshot: sm.Snapshot | None = None


class AsyncSandbox:
    """One sandbox (async): the same names as `Sandbox`, awaited."""

    def __init__(self, client: AsyncClient, info: m.Sandbox) -> None:
        self._client = client
        self.info = info
        self.process = AsyncProcesses(client, info.id)
        self.files = AsyncFiles(client, info.id)
        self.network = AsyncNetwork(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, image={self.info.image!r})"

    @twin(Sandbox.refresh)
    async def refresh(self) -> m.Sandbox:
        self.info = await self._client._send(calls.get_sandbox(self.id))
        return self.info

    @twin(Sandbox.exec)
    async def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        return await self._client._send(calls.exec_call(self.id, cmd, opts))

    @twin(Sandbox.exec_stream)
    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> AsyncIterator[m.StreamEvent]:
        return self._client._events(calls.exec_stream(self.id, cmd, opts))

    @twin(Sandbox.set_timeout)
    async def set_timeout(self, timeout_s: float) -> m.Sandbox:
        self.info = await self._client._send(calls.set_timeout(self.id, timeout_s))
        return self.info

    @twin(Sandbox.pause)
    async def pause(self) -> m.Sandbox:
        self.info = await self._client._send(calls.pause(self.id))
        return self.info

    @twin(Sandbox.resume)
    async def resume(self) -> m.Sandbox:
        self.info = await self._client._send(calls.resume(self.id))
        return self.info

    @twin(Sandbox.snapshot)
    async def snapshot(
        self, name: str | None = None, *, timeout_s: float | None = None, memory: bool = False
    ) -> sm.Snapshot:
        return await self._client._send(calls.snapshot(self.id, name, timeout_s, memory))

    @twin(Sandbox.fork)
    async def fork(self, n: int = 1, **opts: Any) -> AsyncFork:
        result = await self._client._send(calls.fork(self.id, n, opts))
        copies = [AsyncSandbox(self._client, s) for s in result.sandboxes]
        return AsyncFork(copies, result.errors, result.snapshot)

    @twin(Sandbox.port_link)
    async def port_link(self, port: int, ttl_s: float = 600) -> m.PortLink:
        return await self._client._send(calls.port_link(self.id, port, ttl_s))

    @twin(Sandbox.port_url)
    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        return port_url(self._client.target, self.id, port, path, with_key)

    @twin(Sandbox.delete)
    async def delete(self, *, missing_ok: bool = True) -> None:
        try:
            await self._client._send(calls.delete_sandbox(self.id))
        except NotFound:
            if not missing_ok:
                raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


class AsyncNetwork:
    """`sb.network` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @property
    def policy(self) -> m.NetworkPolicy:
        """The policy as last seen (`await sb.refresh()` fetches it again)."""
        return self._sb.info.network

    @twin(Network.update)
    async def update(self, egress: Egress, allow: Iterable[str] | None = None) -> m.Sandbox:
        call = calls.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = await self._sb._client._send(call)
        return self._sb.info
