"""`sb.process` (async): `Processes`' names, awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar, Unpack

from orchard.env import models as m
from orchard.env.sdk import calls
from orchard.env.sdk.calls import ProcessOptions
from orchard.env.sdk.core import AsyncClient, Call, twin
from orchard.env.sdk.sync.processes import Processes, Stream

T = TypeVar("T")


class AsyncProcesses:
    """`sb.process` (async)."""

    def __init__(self, client: AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._id = sandbox_id

    async def _send(self, call: Call[T]) -> T:
        return await self._client._send(call)

    @twin(Processes.start)
    async def start(self, cmd: str | list[str], **opts: Unpack[ProcessOptions]) -> m.ProcessInfo:
        return await self._send(calls.start_process(self._id, cmd, opts))

    @twin(Processes.list)
    async def list(self) -> list[m.ProcessInfo]:
        return await self._send(calls.list_processes(self._id))

    @twin(Processes.get)
    async def get(self, pid: str) -> m.ProcessInfo:
        return await self._send(calls.get_process(self._id, pid))

    @twin(Processes.output)
    async def output(
        self,
        pid: str,
        stream: Stream = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: m.Encoding = "text",
    ) -> m.ProcessOutput:
        call = calls.process_output(self._id, pid, stream, offset, limit, encoding)
        return await self._send(call)

    @twin(Processes.follow)
    def follow(
        self,
        pid: str,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: m.Encoding = "text",
    ) -> AsyncIterator[m.StreamEvent]:
        call = calls.follow_process(self._id, pid, stdout_offset, stderr_offset, encoding)
        return self._client._events(call)

    @twin(Processes.stdin)
    async def stdin(self, pid: str, data: str | bytes, *, close: bool = False) -> None:
        await self._send(calls.write_stdin(self._id, pid, data, close))

    @twin(Processes.close_stdin)
    async def close_stdin(self, pid: str) -> None:
        await self._send(calls.write_stdin(self._id, pid, "", True))

    @twin(Processes.signal)
    async def signal(self, pid: str, signal: str | int = "TERM", *, group: bool = True) -> None:
        await self._send(calls.signal_process(self._id, pid, signal, group))

    @twin(Processes.resize)
    async def resize(self, pid: str, rows: int, cols: int) -> None:
        await self._send(calls.resize_process(self._id, pid, rows, cols))

    @twin(Processes.wait)
    async def wait(self, pid: str, timeout_s: float | None = None) -> m.ProcessInfo:
        return await self._send(calls.wait_process(self._id, pid, timeout_s))

    @twin(Processes.kill)
    async def kill(self, pid: str) -> None:
        await self.signal(pid, "KILL")

    @twin(Processes.remove)
    async def remove(self, pid: str) -> None:
        await self._send(calls.remove_process(self._id, pid))
