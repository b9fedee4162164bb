"""The Orchard SDK: `Orchard` (sync) and `AsyncOrchard` (async), over lean HTTP/1.1 transports.

    from orchard import Orchard

    with Orchard() as client, client.sandboxes.create(image="debian:12") as sb:
        print(sb.exec("uname -a").stdout)

The twins have the same method names. Each route is described once in `_sdk_core` (what to
send, whether it is safe to retry, how to parse the answer); the classes here only send.
With no URL (argument or ORCHARD_URL) the client runs the service in-process on the local
Docker engine and stops it on `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import tempfile
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Literal, Self, TypeVar, Unpack
from urllib.parse import urlencode

import httpx

from orchard.env import _sdk_core as core
from orchard.env import models as m
from orchard.env._sdk_ahttp import async_lean_transport
from orchard.env._sdk_core import (
    CreateOptions,
    ExecOptions,
    FileData,
    ProcessOptions,
    RetryPolicy,
    Target,
)
from orchard.env._sdk_http import lean_transport
from orchard.env.errors import NotFound

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig
    from orchard.env.server import EmbeddedService

__all__ = [
    "AsyncBatch",
    "AsyncOrchard",
    "AsyncSandbox",
    "Batch",
    "Orchard",
    "RetryPolicy",
    "Sandbox",
]

T = TypeVar("T")
Stream = Literal["stdout", "stderr"]
Egress = Literal["none", "all", "allow"]


def _connect(
    base_url: str | None, api_key: str | None, service_config: ServiceConfig | None
) -> tuple[Target, EmbeddedService | None]:
    target = core.resolve_target(base_url, api_key)
    if target is not None:
        return target, None
    # Imported here: the service (FastAPI, Docker client) is only needed in this mode.
    from orchard.env.server import EmbeddedService

    service = EmbeddedService(service_config).start()
    return Target(core.UDS_HOST, uds=service.socket_path), service


def _port_url(target: Target, sandbox_id: str, port: int, path: str, with_key: bool) -> str:
    url = f"{target.base_url}{core.sandbox_path(sandbox_id)}/ports/{port}/{path.lstrip('/')}"
    if with_key and target.api_key:
        url += "?" + urlencode({"orchard_key": target.api_key})
    return url


# ================================================================ sync


class Orchard:
    """Synchronous client. `Orchard()` alone runs the service in-process on local Docker."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
    ) -> None:
        self.target, self._service = _connect(base_url, api_key, service_config)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        transport = httpx.HTTPTransport(uds=self.target.uds) if self.target.uds else None
        self.http = httpx.Client(
            base_url=self.target.base_url,
            headers=core.auth_headers(self.target),
            timeout=timeout,
            transport=transport,
        )
        # Calls without a body stream (exec and most others) skip httpx's per-request cost.
        self._lean = lean_transport(self.target, core.auth_headers(self.target))
        self.sandboxes = Sandboxes(self)

    def health(self) -> m.Health:
        return self._send(core.health())

    def close(self) -> None:
        if self._lean is not None:
            self._lean.close()
        self.http.close()
        if self._service is not None:
            self._service.stop()
            self._service = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- transport

    def _attempt(self, call: core.Call[Any], stream: bool) -> httpx.Response:
        if self._lean is not None and not stream and call.body is None:
            return self._lean.request(call, self._timeout)
        request = self.http.build_request(
            call.method,
            call.path,
            params=httpx.QueryParams(call.params),
            json=call.json,
            content=call.body() if call.body else None,
            headers=None if call.length is None else {"Content-Length": str(call.length)},
            timeout=call.timeout(self._timeout),
        )
        return self.http.send(request, stream=stream)

    def _request(self, call: core.Call[Any], *, stream: bool) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._attempt(call, stream)
            except httpx.TransportError as exc:
                if self._retry.should_retry_error(exc, call.idempotent, attempt):
                    time.sleep(self._retry.delay(attempt))
                    continue
                raise core.transport_error(exc, call) from exc
            if response.status_code >= 400:
                if self._retry.should_retry_status(response.status_code, call.idempotent, attempt):
                    response.close()
                    time.sleep(self._retry.delay(attempt))
                    continue
                try:
                    response.read()
                finally:
                    response.close()
                core.raise_for_status(response)
            return response

    def _send(self, call: core.Call[T]) -> T:
        return call.parse(self._request(call, stream=False))

    @contextlib.contextmanager
    def _stream(self, call: core.Call[Any]) -> Iterator[httpx.Response]:
        response = self._request(call, stream=True)
        try:
            yield response
        except httpx.TransportError as exc:
            raise core.transport_error(exc, call) from exc
        finally:
            response.close()

    def _events(self, call: core.Call[Any]) -> Iterator[m.StreamEvent]:
        with self._stream(call) as response:
            for line in response.iter_lines():
                if (event := core.parse_event(line)) is not None:
                    yield event


class Sandboxes:
    """`client.sandboxes`: create, find and delete sandboxes."""

    def __init__(self, client: Orchard) -> None:
        self._client = client

    def create(self, image: str, **opts: Unpack[CreateOptions]) -> Sandbox:
        """Start one sandbox; use it as a context manager to delete it on exit."""
        return Sandbox(self._client, self._client._send(core.create_sandbox(image, opts)))

    def create_batch(self, image: str, count: int, **opts: Unpack[CreateOptions]) -> Batch:
        """Start `count` sandboxes in one request; failures are listed in `.errors`."""
        result = self._client._send(core.create_batch(image, count, opts))
        return Batch([Sandbox(self._client, s) for s in result.sandboxes], result.errors)

    def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self._client, self._client._send(core.get_sandbox(sandbox_id)))

    def list(self, labels: dict[str, str] | None = None) -> list[Sandbox]:
        """The caller's sandboxes, filtered by all of `labels`."""
        infos = self._client._send(core.list_sandboxes(labels))
        return [Sandbox(self._client, info) for info in infos]

    def delete(self, sandbox_id: str) -> None:
        self._client._send(core.delete_sandbox(sandbox_id))


@dataclass
class Batch:
    """The outcome of `create_batch`; as a context manager it deletes every sandbox on exit."""

    sandboxes: list[Sandbox]
    errors: list[m.ErrorBody] = field(default_factory=list)

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __getitem__(self, index: int) -> Sandbox:
        return self.sandboxes[index]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def delete(self) -> None:
        for sb in self.sandboxes:
            sb.delete(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()


class Sandbox:
    """One sandbox: `exec`, `process`, `files`, `network`, lifetime. A context manager."""

    def __init__(self, client: Orchard, info: m.Sandbox) -> None:
        self._client = client
        self.info = info
        self.process = Processes(self)
        self.files = Files(self)
        self.network = Network(self)

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.info.image!r}, status={self.info.status!r})"

    def refresh(self) -> m.Sandbox:
        self.info = self._client._send(core.get_sandbox(self.id))
        return self.info

    def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        """Run to completion. A string runs under /bin/sh -c; a list runs as argv."""
        return self._client._send(core.exec_call(self.id, cmd, opts))

    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> Iterator[m.StreamEvent]:
        """Output chunks as they happen, then one `exit` event."""
        return self._client._events(core.exec_stream(self.id, cmd, opts))

    def set_timeout(self, timeout_s: float) -> m.Sandbox:
        """Expire `timeout_s` seconds from now (extends or shortens)."""
        self.info = self._client._send(core.set_timeout(self.id, timeout_s))
        return self.info

    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        """URL of a server listening on `port` inside the sandbox, through the service.

        `client.http` reaches it for any target (Unix sockets included); `with_key` puts
        the API key in the query for clients that cannot send headers.
        """
        return _port_url(self._client.target, self.id, port, path, with_key)

    def delete(self, *, missing_ok: bool = True) -> None:
        try:
            self._client._send(core.delete_sandbox(self.id))
        except NotFound:
            if not missing_ok:
                raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.delete()


class Processes:
    """`sb.process`: background processes that outlive the connection (re-attach by id)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _send(self, call: core.Call[T]) -> T:
        return self._sb._client._send(call)

    def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        return self._send(core.start_process(self._sb.id, cmd, opts))

    def list(self) -> list[m.ProcessInfo]:
        return self._send(core.list_processes(self._sb.id))

    def get(self, pid: str) -> m.ProcessInfo:
        return self._send(core.get_process(self._sb.id, pid))

    def output(
        self,
        pid: str,
        stream: Stream = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: m.Encoding = "text",
    ) -> m.ProcessOutput:
        """A page of one stream from a byte offset; continue from `next_offset`."""
        return self._send(core.process_output(self._sb.id, pid, stream, offset, limit, encoding))

    def follow(
        self,
        pid: str,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: m.Encoding = "text",
    ) -> Iterator[m.StreamEvent]:
        """Live output from the given offsets, ending with the `exit` event."""
        call = core.follow_process(self._sb.id, pid, stdout_offset, stderr_offset, encoding)
        return self._sb._client._events(call)

    def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        self._send(core.write_stdin(self._sb.id, pid, data, close))

    def close_stdin(self, pid: str) -> None:
        self._send(core.write_stdin(self._sb.id, pid, "", True))

    def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        self._send(core.signal_process(self._sb.id, pid, signal, group))

    def resize(self, pid: str, rows: int, cols: int) -> None:
        self._send(core.resize_process(self._sb.id, pid, rows, cols))

    def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        """Block until it exits (or `timeout_s` passes: then `status` is still `running`)."""
        return self._send(core.wait_process(self._sb.id, pid, timeout_s))

    def kill(self, pid: str) -> None:
        """SIGKILL its process group; it stays listed with its exit status."""
        self.signal(pid, "KILL")

    def remove(self, pid: str) -> None:
        """Kill it if running and forget it."""
        self._send(core.remove_process(self._sb.id, pid))


class Files:
    """`sb.files`: the sandbox's file system (absolute paths)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _send(self, call: core.Call[T]) -> T:
        return self._sb._client._send(call)

    def read(self, path: str, *, offset: int | None = None, length: int | None = None) -> bytes:
        return self._send(core.read_file(self._sb.id, path, offset, length))

    def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        """Write bytes, text or a binary file object (streamed in chunks); parents are created."""
        return self._send(core.write_file(self._sb.id, path, data, mode, overwrite))

    def list(self, path: str) -> list[m.FileStat]:
        return self._send(core.list_files(self._sb.id, path))

    def stat(self, path: str) -> m.FileStat:
        return self._send(core.stat_file(self._sb.id, path))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except NotFound:
            return False
        return True

    def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        return self._send(core.mkdir(self._sb.id, path, mode, parents))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        self._send(core.remove_file(self._sb.id, path, recursive))

    def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        return self._send(core.move_file(self._sb.id, src, dst, overwrite))

    def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        """Copy a local folder's contents into `remote_dir`, as a tar built while it is sent."""
        return self._send(core.upload_tar(self._sb.id, local_dir, remote_dir))

    def download_dir(self, remote_dir: str, local_dir: str | os.PathLike[str]) -> m.TarResult:
        """Copy `remote_dir`'s contents into `local_dir`, extracting as it arrives (safely)."""
        with self._sb._client._stream(core.download_tar(self._sb.id, remote_dir)) as response:
            reader = core.IterReader(response.iter_bytes())
            return core.extract_tar(_buffered(reader), local_dir)


class Network:
    """`sb.network`: the egress policy, changeable at run time."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    @property
    def policy(self) -> m.NetworkPolicy:
        return self._sb.info.network

    def update(self, egress: Egress, allow: Iterable[str] | None = None) -> m.Sandbox:
        call = core.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = self._sb._client._send(call)
        return self._sb.info


def _buffered(raw: core.IterReader) -> IO[bytes]:
    return io.BufferedReader(raw, buffer_size=core.CHUNK)


# ================================================================ async


async def _aiter_body(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Read a (blocking, disk-backed) body in a worker thread, chunk by chunk."""
    it = core.coalesce(chunks)
    while (chunk := await asyncio.to_thread(next, it, None)) is not None:
        yield chunk


class AsyncOrchard:
    """Asynchronous twin of `Orchard`: the same names, awaited."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
    ) -> None:
        self.target, self._service = _connect(base_url, api_key, service_config)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        # Every SDK call goes over the lean asyncio transport; httpx only where it must
        # (proxies), and as `http` for callers reaching sandbox ports.
        self._lean = async_lean_transport(self.target, core.auth_headers(self.target))
        self._http: httpx.AsyncClient | None = None
        self.sandboxes = AsyncSandboxes(self)

    @property
    def http(self) -> httpx.AsyncClient:
        """An httpx client for this service (e.g. for `sb.port_url(...)`), made on first use."""
        if self._http is None:
            uds = self.target.uds
            self._http = httpx.AsyncClient(
                base_url=self.target.base_url,
                headers=core.auth_headers(self.target),
                timeout=self._timeout,
                transport=httpx.AsyncHTTPTransport(uds=uds) if uds else None,
            )
        return self._http

    async def health(self) -> m.Health:
        return await self._send(core.health())

    async def close(self) -> None:
        if self._lean is not None:
            await self._lean.aclose()
        if self._http is not None:
            await self._http.aclose()
        if self._service is not None:
            service, self._service = self._service, None
            await asyncio.to_thread(service.stop)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- transport

    async def _attempt(self, call: core.Call[Any], stream: bool) -> httpx.Response:
        if self._lean is not None:
            return await self._lean.request(call, self._timeout, stream=stream)
        body = call.body() if call.body else None
        content = body if body is None or isinstance(body, bytes) else _aiter_body(body)
        request = self.http.build_request(
            call.method,
            call.path,
            params=httpx.QueryParams(call.params),
            json=call.json,
            content=content,
            timeout=call.timeout(self._timeout),
        )
        return await self.http.send(request, stream=stream)

    async def _request(self, call: core.Call[Any], *, stream: bool) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._attempt(call, stream)
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

    def create(self, image: str, **opts: Unpack[CreateOptions]) -> _PendingSandbox:
        """`await` it for the sandbox, or `async with` it to also delete the sandbox on exit."""
        call = core.create_sandbox(image, opts)  # validates now, before anything is awaited
        return _PendingSandbox(self._client, call)

    async def create_batch(
        self, image: str, count: int, **opts: Unpack[CreateOptions]
    ) -> AsyncBatch:
        result = await self._client._send(core.create_batch(image, count, opts))
        return AsyncBatch([AsyncSandbox(self._client, s) for s in result.sandboxes], result.errors)

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._client, await self._client._send(core.get_sandbox(sandbox_id)))

    async def list(self, labels: dict[str, str] | None = None) -> list[AsyncSandbox]:
        infos = await self._client._send(core.list_sandboxes(labels))
        return [AsyncSandbox(self._client, info) for info in infos]

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
    sandboxes: list[AsyncSandbox]
    errors: list[m.ErrorBody] = field(default_factory=list)

    def __iter__(self) -> Iterator[AsyncSandbox]:
        return iter(self.sandboxes)

    def __getitem__(self, index: int) -> AsyncSandbox:
        return self.sandboxes[index]

    def __len__(self) -> int:
        return len(self.sandboxes)

    async def delete(self) -> None:
        await asyncio.gather(*(sb.delete(missing_ok=True) for sb in self.sandboxes))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()


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

    async def refresh(self) -> m.Sandbox:
        self.info = await self._client._send(core.get_sandbox(self.id))
        return self.info

    async def exec(self, cmd: str | list[str], **opts: Unpack[ExecOptions]) -> m.ExecResult:
        return await self._client._send(core.exec_call(self.id, cmd, opts))

    def exec_stream(
        self, cmd: str | list[str], **opts: Unpack[ExecOptions]
    ) -> AsyncIterator[m.StreamEvent]:
        return self._client._events(core.exec_stream(self.id, cmd, opts))

    async def set_timeout(self, timeout_s: float) -> m.Sandbox:
        self.info = await self._client._send(core.set_timeout(self.id, timeout_s))
        return self.info

    def port_url(self, port: int, path: str = "", *, with_key: bool = False) -> str:
        return _port_url(self._client.target, self.id, port, path, with_key)

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

    async def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        return await self._send(core.start_process(self._sb.id, cmd, opts))

    async def list(self) -> list[m.ProcessInfo]:
        return await self._send(core.list_processes(self._sb.id))

    async def get(self, pid: str) -> m.ProcessInfo:
        return await self._send(core.get_process(self._sb.id, pid))

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

    def follow(
        self,
        pid: str,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: m.Encoding = "text",
    ) -> AsyncIterator[m.StreamEvent]:
        call = core.follow_process(self._sb.id, pid, stdout_offset, stderr_offset, encoding)
        return self._sb._client._events(call)

    async def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        await self._send(core.write_stdin(self._sb.id, pid, data, close))

    async def close_stdin(self, pid: str) -> None:
        await self._send(core.write_stdin(self._sb.id, pid, "", True))

    async def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        await self._send(core.signal_process(self._sb.id, pid, signal, group))

    async def resize(self, pid: str, rows: int, cols: int) -> None:
        await self._send(core.resize_process(self._sb.id, pid, rows, cols))

    async def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        return await self._send(core.wait_process(self._sb.id, pid, timeout_s))

    async def kill(self, pid: str) -> None:
        await self.signal(pid, "KILL")

    async def remove(self, pid: str) -> None:
        await self._send(core.remove_process(self._sb.id, pid))


class AsyncFiles:
    """`sb.files` (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def _send(self, call: core.Call[T]) -> T:
        return await self._sb._client._send(call)

    async def read(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        return await self._send(core.read_file(self._sb.id, path, offset, length))

    async def write(
        self, path: str, data: FileData, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        return await self._send(core.write_file(self._sb.id, path, data, mode, overwrite))

    async def list(self, path: str) -> list[m.FileStat]:
        return await self._send(core.list_files(self._sb.id, path))

    async def stat(self, path: str) -> m.FileStat:
        return await self._send(core.stat_file(self._sb.id, path))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFound:
            return False
        return True

    async def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        return await self._send(core.mkdir(self._sb.id, path, mode, parents))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._send(core.remove_file(self._sb.id, path, recursive))

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        return await self._send(core.move_file(self._sb.id, src, dst, overwrite))

    async def upload_dir(self, local_dir: str | os.PathLike[str], remote_dir: str) -> m.TarResult:
        return await self._send(core.upload_tar(self._sb.id, local_dir, remote_dir))

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
        return self._sb.info.network

    async def update(self, egress: Egress, allow: Iterable[str] | None = None) -> m.Sandbox:
        call = core.set_network(self._sb.id, egress, list(allow or []))
        self._sb.info = await self._sb._client._send(call)
        return self._sb.info
