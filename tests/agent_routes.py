"""Typed agent routes for tests, over `AgentClient`'s one generic path.

The service relays per-sandbox requests without re-shaping them, so the agent client has
no method per route; the tests that drive an agent directly use these instead, each a
line or two over `request` / `events` / `stream` with the wire models as bodies.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from orchard.env import models as m
from orchard.env.server.agent_client import (
    STREAMING,
    AgentClient,
    Content,
    error_of,
    read_timeout,
)


def _range(path: str, offset: int | None, length: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"path": path}
    if offset is not None:
        params["offset"] = offset
    if length is not None:
        params["length"] = length
    return params


def _exec_body(cmd: str | list[str], options: dict[str, Any]) -> dict[str, Any]:
    return {"cmd": cmd, **{k: v for k, v in options.items() if v is not None}}


class TypedAgent(AgentClient):
    """An AgentClient with one method per agent route (docs/agent-api.md)."""

    async def exec(self, cmd: str | list[str], **options: Any) -> m.ExecResult:
        body = _exec_body(cmd, options)
        resp = await self.request(
            "POST", "/exec", json=body, timeout=read_timeout(body.get("timeout_s"))
        )
        return m.ExecResult.model_validate_json(resp.content)

    def exec_stream(self, cmd: str | list[str], **options: Any) -> AsyncIterator[dict[str, Any]]:
        return self.events("POST", "/exec/stream", json=_exec_body(cmd, options))

    async def start_process(self, cmd: str | list[str], **options: Any) -> m.ProcessInfo:
        resp = await self.request("POST", "/processes", json=_exec_body(cmd, options))
        return m.ProcessInfo.model_validate_json(resp.content)

    async def list_processes(self) -> list[m.ProcessInfo]:
        resp = await self.request("GET", "/processes")
        return m.ProcessList.model_validate_json(resp.content).processes

    async def get_process(self, process_id: str) -> m.ProcessInfo:
        resp = await self.request("GET", f"/processes/{process_id}")
        return m.ProcessInfo.model_validate_json(resp.content)

    async def process_output(
        self,
        process_id: str,
        *,
        stream: str = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: str = "text",
    ) -> m.ProcessOutput:
        params: dict[str, Any] = {"stream": stream, "offset": offset, "encoding": encoding}
        if limit is not None:
            params["limit"] = limit
        resp = await self.request("GET", f"/processes/{process_id}/output", params=params)
        return m.ProcessOutput.model_validate_json(resp.content)

    def follow_process(
        self,
        process_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: str = "text",
    ) -> AsyncIterator[dict[str, Any]]:
        params = {
            "stdout_offset": stdout_offset,
            "stderr_offset": stderr_offset,
            "encoding": encoding,
        }
        return self.events("GET", f"/processes/{process_id}/follow", params=params)

    async def write_stdin(
        self, process_id: str, data: str | bytes = "", *, close: bool = False
    ) -> None:
        if isinstance(data, bytes):
            body = m.StdinWrite(
                data=base64.b64encode(data).decode(), encoding="base64", close=close
            )
        else:
            body = m.StdinWrite(data=data, encoding="text", close=close)
        await self.request("POST", f"/processes/{process_id}/stdin", json=body)

    async def signal_process(
        self, process_id: str, signal: str | int = "TERM", *, group: bool = True
    ) -> None:
        body = m.SignalRequest(signal=signal, group=group)
        await self.request("POST", f"/processes/{process_id}/signal", json=body)

    async def resize_process(self, process_id: str, rows: int, cols: int) -> None:
        body = m.ResizeRequest(rows=rows, cols=cols)
        await self.request("POST", f"/processes/{process_id}/resize", json=body)

    async def wait_process(self, process_id: str, timeout_s: float | None = None) -> m.ProcessInfo:
        params = {"timeout_s": timeout_s} if timeout_s is not None else None
        resp = await self.request(
            "GET", f"/processes/{process_id}/wait", params=params, timeout=read_timeout(timeout_s)
        )
        return m.ProcessInfo.model_validate_json(resp.content)

    async def delete_process(self, process_id: str) -> None:
        await self.request("DELETE", f"/processes/{process_id}")

    async def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        return (await self.request("GET", "/files", params=_range(path, offset, length))).content

    async def iter_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> AsyncIterator[bytes]:
        async for chunk in self._download("/files", _range(path, offset, length)):
            yield chunk

    async def write_file(
        self, path: str, data: Content, *, mode: int | None = None, overwrite: bool = True
    ) -> m.FileStat:
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = f"{mode:04o}"
        if not overwrite:
            params["overwrite"] = "false"
        resp = await self.request(
            "PUT",
            "/files",
            params=params,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
            timeout=STREAMING,
        )
        return m.FileStat.model_validate_json(resp.content)

    async def stat(self, path: str) -> m.FileStat:
        resp = await self.request("GET", "/files/stat", params={"path": path})
        return m.FileStat.model_validate_json(resp.content)

    async def list_dir(self, path: str) -> m.FileList:
        resp = await self.request("GET", "/files/list", params={"path": path})
        return m.FileList.model_validate_json(resp.content)

    async def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> m.FileStat:
        body = m.MkdirRequest(path=path, mode=mode, parents=parents)
        resp = await self.request("POST", "/files/mkdir", json=body)
        return m.FileStat.model_validate_json(resp.content)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self.request(
            "POST", "/files/remove", json=m.RemoveRequest(path=path, recursive=recursive)
        )

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> m.FileStat:
        body = m.MoveRequest(src=src, dst=dst, overwrite=overwrite)
        resp = await self.request("POST", "/files/move", json=body)
        return m.FileStat.model_validate_json(resp.content)

    async def upload_tar(self, path: str, data: Content) -> m.TarResult:
        resp = await self.request(
            "PUT",
            "/files/tar",
            params={"path": path},
            content=data,
            headers={"Content-Type": "application/x-tar"},
            timeout=STREAMING,
        )
        return m.TarResult.model_validate_json(resp.content)

    async def download_tar(self, path: str) -> AsyncIterator[bytes]:
        async for chunk in self._download("/files/tar", {"path": path}):
            yield chunk

    async def _download(self, path: str, params: dict[str, Any]) -> AsyncIterator[bytes]:
        async with self.stream("GET", path, params=params) as resp:
            if resp.status_code >= 400:
                raise error_of(resp.status_code, await resp.aread())
            async for chunk in resp.aiter_bytes():
                yield chunk


def typed(client: AgentClient) -> TypedAgent:
    """The typed routes over an existing client (e.g. the service's), sharing its pool."""
    agent = TypedAgent.__new__(TypedAgent)
    agent.__dict__ = client.__dict__
    return agent
