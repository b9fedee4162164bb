"""The asynchronous SDK: `AsyncOrchard` and its resources, the same names as the sync ones.

Each method is the awaited twin of the sync method of the same name, and carries its
documentation (`_twin`), so the two cannot drift apart in what they promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self, TypeVar, Unpack

import httpx

from orchard.env import _sdk_core as core
from orchard.env import _sdk_pools as pools
from orchard.env import _sdk_state as st
from orchard.env import _sdk_sync as sync
from orchard.env import _sdk_volumes as vol
from orchard.env import models as m
from orchard.env import state_models as sm
from orchard.env._sdk_base import connect, port_url, send_async
from orchard.env._sdk_core import CreateOptions, ExecOptions, FileData, ProcessOptions, RetryPolicy
from orchard.env._sdk_sync import Egress, Stream
from orchard.env.errors import NotFound
from orchard.env.http11 import async_transport_for

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def _twin(sync_method: Callable[..., Any]) -> Callable[[F], F]:
    """Give an async method the documentation of its sync twin."""

    def copy(method: F) -> F:
        method.__doc__ = sync_method.__doc__
        return method

    return copy


class AsyncOrchard:
    """Asynchronous client of an Orchard service: `Orchard`'s names, awaited.

    :param base_url: `http(s)://host:port`, or `unix:///path/to.sock`; default ORCHARD_URL
    :param api_key: sent as a bearer token; default ORCHARD_API_KEY
    :param timeout: default timeouts of a call (commands with `timeout_s` wait longer)
    :param retry: how transient failures are retried (idempotent calls only, once sent)
    :param service_config: the in-process service's settings, when there is no URL
    :param transport: how requests are sent (default: Orchard's lean asyncio transport;
        httpx's where proxies are set); e.g. `httpx.MockTransport(handler)` in tests. With
        a transport and no URL, no service is started: the transport answers.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.target, self._service = connect(
            base_url, api_key, service_config, embed=transport is None
        )
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._transport = transport or async_transport_for(self.target.base_url, self.target.uds)
        self._http: httpx.AsyncClient | None = None
        self.sandboxes = AsyncSandboxes(self)
        self.snapshots = st.AsyncSnapshots(self)
        self.volumes = vol.AsyncVolumes(self)
        self.pools = pools.AsyncPools(self)

    @property
    def http(self) -> httpx.AsyncClient:
        """An httpx client for this service (e.g. for `sb.port_url(...)`), made on first use."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                base_url=self.target.base_url,
                headers=core.auth_headers(self.target),
                timeout=self._timeout,
                transport=self._transport,
            )
        return self._http

    @_twin(sync.Orchard.health)
    async def health(self) -> m.Health:
        return await self._send(core.health())

    @_twin(sync.Orchard.usage)
    async def usage(self) -> m.Usage:
        return await self._send(core.usage())

    @_twin(sync.Orchard.close)
    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
        await self._transport.aclose()
        if self._service is not None:
            service, self._service = self._service, None
            await asyncio.to_thread(service.stop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- sending

    async def _request(self, call: core.Call[Any], *, stream: bool) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await send_async(
                    self._transport, self.target, call, self._timeout, stream=stream
                )
            except httpx.TransportError as exc:
                if self._retry.should_retry_error(exc, call.idempotent, attempt):
                    await asyncio.sleep(self._retry.delay(attempt))
                    continue
                raise core.transport_error(exc, call) from exc
            if response.status_code >= 400:
                if self._retry.should_retry_status(response.status_code, call.idempotent, attempt):
                    await response.aclose()
                    await asyncio.sleep(self._retry.delay(attempt))
                    continue
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                core.raise_for_status(response)
            return response

    async def _send(self, call: core.Call[T]) -> T:
        return call.parse(await self._request(call, stream=False))

    @contextlib.asynccontextmanager
    async def _stream(self, call: core.Call[Any]) -> AsyncIterator[httpx.Response]:
        response = await self._request(call, stream=True)
        try:
            yield response
        except httpx.TransportError as exc:
            raise core.transport_error(exc, call) from exc
        finally:
            await response.aclose()

    async def _events(self, call: core.Call[Any]) -> AsyncIterator[m.StreamEvent]:
        async with self._stream(call) as response:
            async for line in response.aiter_lines():
                if (event := core.parse_event(line)) is not None:
                    yield event


class AsyncSandboxes:
    """`client.sandboxes` (async)."""

    def __init__(self, client: AsyncOrchard) -> None:
        self._client = client

    def create(self, image: str = "", **opts: Unpack[CreateOptions]) -> _PendingSandbox:
        """Start one sandbox: `await` it, or `async with` it to also delete it on exit.

        :param image: any OCI image reference (pulled if missing)
        :param opts: as for `Sandboxes.create`
        :return: an awaitable of the sandbox, also an async context manager
        """
        call = core.create_sandbox(image, opts)  # validates now, before anything is awaited
        return _PendingSandbox(self._client, call)

    @_twin(sync.Sandboxes.create_batch)
    async def create_batch(
        self, image: str, count: int, **opts: Unpack[CreateOptions]
    ) -> AsyncBatch:
        result = await self._client._send(core.create_batch(image, count, opts))
        return AsyncBatch([AsyncSandbox(self._client, s) for s in result.sandboxes], result.errors)

    @_twin(sync.Sandboxes.get)
    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._client, await self._client._send(core.get_sandbox(sandbox_id)))

    @_twin(sync.Sandboxes.list)
    async def list(self, labels: dict[str, str] | None = None) -> list[AsyncSandbox]:
        infos = await self._client._send(core.list_sandboxes(labels))
        return [AsyncSandbox(self._client, info) for info in infos]

    @_twin(sync.Sandboxes.delete)
    async def delete(self, sandbox_id: str) -> None:
        await self._client._send(core.delete_sandbox(sandbox_id))


class _PendingSandbox:
    """What `AsyncSandboxes.create` returns: awaitable, and an async context manager."""

    def __init__(self, client: AsyncOrchard, call: core.Call[m.Sandbox]) -> None:
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

    @_twin(sync.Batch.delete)
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

    def __init__(self, client: AsyncOrchard, info: m.Sandbox) -> None:
        self._client = client
        self.info = info
        self.process = AsyncProcesses(self)
        self.files = AsyncFiles(self)
        self.network = AsyncNetwork(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"AsyncSandbox(id={self.id!r}, image={self.info.image!r})"

    @_twin(sync.Sandbox.refresh)
    async def refresh(self) -> m.Sandbox:
        self.info = await self._client._send(core.get_sandbox(self.id))
        return self.info

    @_twin(sync.Sandbox.exec)
    async def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        return await self._client._send(core.exec_call(self.id, cmd, opts))

    @_twin(sync.Sandbox.exec_stream)
    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> AsyncIterator[m.StreamEvent]:
        return self._client._events(core.exec_stream(self.id, cmd, opts))

    @_twin(sync.Sandbox.set_timeout)
    async def set_timeout(self, timeout_s: float) -> m.Sandbox:
        self.info = await self._client._send(core.set_timeout(self.id, timeout_s))
        return self.info

    @_twin(sync.Sandbox.pause)
    async def pause(self) -> m.Sandbox:
        self.info = await self._client._send(st.pause(self.id))
        return self.info

    @_twin(sync.Sandbox.resume)
    async def resume(self) -> m.Sandbox:
        self.info = await self._client._send(st.resume(self.id))
        return self.info

    @_twin(sync.Sandbox.snapshot)
    async def snapshot(
        self, name: str | None = None, *, timeout_s: float | None = None, memory: bool = False
    ) -> sm.Snapshot:
        return await self._client._send(st.snapshot(self.id, name, timeout_s, memory))

    @_twin(sync.Sandbox.fork)
    async def fork(self, n: int = 1, **opts: Any) -> AsyncFork:
        result = await self._client._send(st.fork(self.id, n, opts))
        copies = [AsyncSandbox(self._client, s) for s in result.sandboxes]
        return AsyncFork(copies, result.errors, result.snapshot)

    @_twin(sync.Sandbox.port_link)
    async def port_link(self, port: int, ttl_s: float = 600) -> m.PortLink:
        return await self._client._send(core.port_link(self.id, port, ttl_s))

    @_twin(sync.Sandbox.port_url)
    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        return port_url(self._client.target, self.id, port, path, with_key)

    @_twin(sync.Sandbox.delete)
    async def delete(self, *, missing_ok: bool = True) -> None:
        try:
            await self._client._send(core.delete_sandbox(self.id))
        except NotFound:
            if not missing_ok:
                raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


class AsyncProcesses:
    """`sb.process` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def _send(self, call: core.Call[T]) -> T:
        return await self._sb._client._send(call)

    @_twin(sync.Processes.start)
    async def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        return await self._send(core.start_process(self._sb.id, cmd, opts))

    @_twin(sync.Processes.list)
    async def list(self) -> list[m.ProcessInfo]:
        return await self._send(core.list_processes(self._sb.id))

    @_twin(sync.Processes.get)
    async def get(self, pid: str) -> m.ProcessInfo:
        return await self._send(core.get_process(self._sb.id, pid))

    @_twin(sync.Processes.output)
    async def output(
        self,
        pid: str,
        stream: Stream = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: m.Encoding = "text",
    ) -> m.ProcessOutput:
        call = core.process_output(self._sb.id, pid, stream, offset, limit, encoding)
        return await self._send(call)

    @_twin(sync.Processes.follow)
    def follow(
        self,
        pid: str,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: m.Encoding = "text",
    ) -> AsyncIterator[m.StreamEvent]:
        call = core.follow_process(self._sb.id, pid, stdout_offset, stderr_offset, encoding)
        return self._sb._client._events(call)

    @_twin(sync.Processes.stdin)
    async def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        await self._send(core.write_stdin(self._sb.id, pid, data, close))

    @_twin(sync.Processes.close_stdin)
    async def close_stdin(self, pid: str) -> None:
        await self._send(core.write_stdin(self._sb.id, pid, "", True))

    @_twin(sync.Processes.signal)
    async def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        await self._send(core.signal_process(self._sb.id, pid, signal, group))

    @_twin(sync.Processes.resize)
    async def resize(self, pid: str, rows: int, cols: int) -> None:
        await self._send(core.resize_process(self._sb.id, pid, rows, cols))

    @_twin(sync.Processes.wait)
    async def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        return await self._send(core.wait_process(self._sb.id, pid, timeout_s))

    @_twin(sync.Processes.kill)
    async def kill(self, pid: str) -> None:
        await self.signal(pid, "KILL")

    @_twin(sync.Processes.remove)
    async def remove(self, pid: str) -> None:
        await self._send(core.remove_process(self._sb.id, pid))


class AsyncFiles:
    """`sb.files` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def _send(self, call: core.Call[T]) -> T:
        return await self._sb._client._send(call)

    @_twin(sync.Files.read)
    async def read(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        return await self._send(core.read_file(self._sb.id, path, offset, length))

    @_twin(sync.Files.write)
    async def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        return await self._send(core.write_file(self._sb.id, path, data, mode, overwrite))

    @_twin(sync.Files.list)
    async def list(self, path: str) -> list[m.FileStat]:
        return await self._send(core.list_files(self._sb.id, path))

    @_twin(sync.Files.stat)
    async def stat(self, path: str) -> m.FileStat:
        return await self._send(core.stat_file(self._sb.id, path))

    @_twin(sync.Files.exists)
    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    @_twin(sync.Files.mkdir)
    async def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        return await self._send(core.mkdir(self._sb.id, path, mode, parents))

    @_twin(sync.Files.remove)
    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._send(core.remove_file(self._sb.id, path, recursive))

    @_twin(sync.Files.move)
    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        return await self._send(core.move_file(self._sb.id, src, dst, overwrite))

    @_twin(sync.Files.diff)
    async def diff(self, since: str = "start") -> sm.FileDiff:
        return await self._send(st.diff(self._sb.id, since))

    @_twin(sync.Files.upload_dir)
    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        return await self._send(core.upload_tar(self._sb.id, local_dir, remote_dir))

    @_twin(sync.Files.download_dir)
    async def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> m.TarResult:
        # Spool to a temporary file so extraction (blocking disk work) runs in a thread.
        with tempfile.TemporaryFile() as spool:
            async with self._sb._client._stream(
                core.download_tar(self._sb.id, remote_dir)
            ) as response:
                async for chunk in response.aiter_bytes(core.CHUNK):
                    spool.write(chunk)
            spool.seek(0)
            return await asyncio.to_thread(core.extract_tar, spool, local_dir)


class AsyncNetwork:
    """`sb.network` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    @property
    def policy(self) -> m.NetworkPolicy:
        """The policy as last seen (`await sb.refresh()` fetches it again)."""
        return self._sb.info.network

    @_twin(sync.Network.update)
    async def update(self, egress: Egress, allow: Iterable[str] | None = None) -> m.Sandbox:
        call = core.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = await self._sb._client._send(call)
        return self._sb.info
