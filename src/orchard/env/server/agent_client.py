"""Async client for the in-sandbox agent (docs/agent-api.md), over a Unix socket or HTTP.

One `AgentClient` per sandbox; it keeps a keep-alive connection pool because the
service makes many small calls. Agent error JSON becomes the typed errors of
`orchard.env.errors`; a connection failure becomes `AgentUnavailable`. Besides one
typed method per route there are `forward` and `stream`, which pass a request and
its response through verbatim, for the service's proxy routes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Literal, TypedDict, Unpack
from urllib.parse import urlencode

import httpx

from orchard.env.agent_http import AgentHTTP, Reply, StreamReply
from orchard.env.backends.base import AgentEndpoint
from orchard.env.errors import (
    AgentUnavailable,
    BadRequest,
    Conflict,
    Forbidden,
    Internal,
    InvalidRequest,
    NotFound,
    OrchardError,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_from_response,
)
from orchard.env.models import (
    Encoding,
    ExecRequest,
    ExecResult,
    FileList,
    FileStat,
    ProcessInfo,
    ProcessOutput,
    TarResult,
)
from orchard.env.wire import NOT_FORWARDED

Body = bytes | AsyncIterable[bytes]
# Query strings as a proxy receives them: raw, or multi-valued pairs via httpx.QueryParams.
ForwardParams = httpx.QueryParams | Mapping[str, Any] | str | None
StreamName = Literal["stdout", "stderr"]

# Agent error codes -> our typed errors (the agent's own code is kept on the exception).
_AGENT_CODES: dict[str, type[OrchardError]] = {
    "bad_request": BadRequest,
    "method_not_allowed": BadRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "no_shell": InvalidRequest,
    "exec_failed": InvalidRequest,
    # Nothing listens on the proxied port (yet): transient from the caller's side.
    "bad_gateway": Unavailable,
    "internal": Internal,
}

# The relay's one list, plus Content-Length: httpx re-frames the body it is given.
_HOP_HEADERS = NOT_FORWARDED | {"content-length"}


# For streams and uploads: connect quickly, then wait as long as the data takes.
_STREAMING = httpx.Timeout(None, connect=10.0)


class ExecOptions(TypedDict, total=False):
    """Optional fields of an exec request (see ExecRequest in models.py)."""

    cwd: str
    env: dict[str, str]
    user: str
    stdin: str
    stdin_b64: str
    timeout_s: float
    max_output_bytes: int
    output_encoding: Encoding


class ProcessOptions(ExecOptions, total=False):
    pty: bool
    rows: int
    cols: int
    tag: str


def agent_error(status: int, body: Any) -> OrchardError:
    """Turn an agent error response (or an NDJSON `error` line) into a typed error."""
    code = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        code = body["error"].get("code")
    cls = _AGENT_CODES.get(str(code))
    if cls is None:
        return error_from_response(status, body)
    err = body["error"]
    exc = cls(str(err.get("message", f"HTTP {status}")), details=err.get("details"))
    if cls.code != code:
        exc.code = str(code)  # type: ignore[misc]
    return exc


async def _raise_for_error(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    raw = await resp.aread()
    try:
        body: Any = json.loads(raw)
    except ValueError:
        body = {"error": {"code": None, "message": raw.decode(errors="replace")[:500]}}
    raise agent_error(resp.status_code, body)


def _exec_body(cmd: str | list[str] | ExecRequest, options: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(cmd, ExecRequest):
        body = cmd.model_dump(exclude_none=True)
        body.update({k: v for k, v in options.items() if v is not None})
        return body
    return {"cmd": cmd, **{k: v for k, v in options.items() if v is not None}}


def _read_timeout(timeout_s: float | None, margin: float = 30.0) -> httpx.Timeout:
    """An HTTP timeout that outlives the command's own (none if the command has none)."""
    read = None if not timeout_s else float(timeout_s) + margin
    return httpx.Timeout(read, connect=10.0)


async def _ndjson(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in resp.aiter_lines():
        if not line.strip():
            continue
        event: dict[str, Any] = json.loads(line)
        if event.get("type") == "error":
            raise agent_error(422, {"error": event})
        yield event


class AgentClient:
    """Talk to one sandbox's agent. Use as `async with AgentClient(...) as agent:`."""

    def __init__(
        self,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        max_connections: int = 64,
    ) -> None:
        if (socket_path is None) == (base_url is None):
            raise ValueError("give exactly one of socket_path or base_url")
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=30.0,
        )
        # The agent speaks plain HTTP; loading the CA bundle would cost ~20 ms of CPU and
        # ~0.8 MiB per client (one client per sandbox), so only an https:// URL gets it.
        tls = base_url is not None and base_url.startswith("https://")
        transport = httpx.AsyncHTTPTransport(
            uds=os.fspath(socket_path) if socket_path is not None else None,
            limits=limits,
            verify=tls,
        )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.socket_path = os.fspath(socket_path) if socket_path is not None else None
        self.base_url = base_url or "http://agent"
        self._http = httpx.AsyncClient(
            transport=transport,
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )
        self._timeout = timeout
        # Buffered calls (exec and the other JSON routes) go through the lean client; httpx
        # keeps streams, streamed uploads and https.
        self._plain = (
            None
            if tls
            else AgentHTTP(
                socket_path=self.socket_path,
                base_url=base_url if socket_path is None else None,
                token=token,
                max_connections=max_connections,
            )
        )

    @classmethod
    def for_endpoint(cls, endpoint: AgentEndpoint, token: str, **kw: Any) -> AgentClient:
        """A client for where a backend says the sandbox's agent listens."""
        return cls(socket_path=endpoint.socket_path, base_url=endpoint.base_url, token=token, **kw)

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._plain is not None:
            await self._plain.aclose()
        await self._http.aclose()

    def _where(self) -> str:
        return self.socket_path or self.base_url

    # ------------------------------------------------------------ primitives

    def _build(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Body | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Request:
        ext = {"timeout": timeout.as_dict()} if timeout is not None else None
        if json_body is not None:
            return self._http.build_request(
                method, path, params=params, json=json_body, headers=headers, extensions=ext
            )
        return self._http.build_request(
            method, path, params=params, content=content, headers=headers, extensions=ext
        )

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            return await self._http.send(request, stream=stream)
        except httpx.TimeoutException as e:
            raise AgentUnavailable(
                f"agent at {self._where()} did not answer in time ({type(e).__name__})"
            ) from e
        except httpx.TransportError as e:
            raise AgentUnavailable(f"agent at {self._where()} is not reachable: {e!r}") from e

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Body | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Send one request; raise the typed error if the agent answers with one."""
        req = self._build(
            method,
            path,
            params=params,
            json_body=json_body,
            content=content,
            headers=headers,
            timeout=timeout,
        )
        resp = await self._send(req)
        await _raise_for_error(resp)
        return resp

    async def forward(
        self,
        method: str,
        path: str,
        *,
        params: ForwardParams = None,
        headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
        content: Body | None = None,
        timeout: httpx.Timeout | None = None,
        length: int | None = None,
    ) -> httpx.Response:
        """Send a request as given and return the agent's response as it is (errors included).

        Hop-by-hop headers and the caller's Authorization are dropped; the agent's token is
        added. `length`, a streamed `content`'s exact size, is sent as Content-Length (the
        body is then not chunked). Only a connection failure raises (AgentUnavailable).
        """
        req = self._forward_request(method, path, params, headers, content, timeout, length)
        resp = await self._send(req)
        await resp.aread()
        return resp

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: ForwardParams = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> Reply:
        """One buffered request; the agent's answer comes back whole, errors included.

        The service's hot path: the lean keep-alive client when the agent speaks plain
        HTTP (https falls back to httpx). Only a connection failure raises (AgentUnavailable).
        """
        query = _query(params)
        target = path + ("?" + query if query else "")
        headers = [("Content-Type", content_type)] if content_type and body is not None else []
        if self._plain is None:
            resp = await self.forward(
                method, target, headers=headers, content=body, timeout=timeout
            )
            return Reply(resp.status_code, dict(resp.headers), resp.content)
        read: float | None = self._timeout
        connect = 10.0
        if timeout is not None:
            read, connect = timeout.read, timeout.connect or 10.0
        return await self._plain.request(
            method, target, body=body, headers=headers, read_timeout=read, connect_timeout=connect
        )

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: ForwardParams = None,
        headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
        content: Body | None = None,
        json_body: Any = None,
        timeout: httpx.Timeout | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """Like `forward`, but the body is not read: iterate `resp.aiter_raw()` yourself.

        No read timeout unless `timeout` says otherwise: streams may stay quiet for long.
        """
        timeout = timeout or _STREAMING
        if json_body is not None:
            content = json.dumps(json_body).encode()
            headers = {**dict(headers or {}), "Content-Type": "application/json"}
        req = self._forward_request(method, path, params, headers, content, timeout)
        resp = await self._send(req, stream=True)
        try:
            yield resp
        except httpx.TransportError as e:
            raise AgentUnavailable(f"agent at {self._where()} broke off a stream: {e!r}") from e
        finally:
            await resp.aclose()

    @asynccontextmanager
    async def download(
        self, path: str, *, params: ForwardParams = None
    ) -> AsyncIterator[StreamReply]:
        """GET a byte stream (a file, a tar) to relay as is, errors included.

        On a plain-HTTP agent this is the lean client's stream: 1 MiB pieces and none of
        httpx's per-read cost, which is most of the service's CPU on a big download.
        """
        if self._plain is None:
            async with self.stream("GET", path, params=params) as resp:
                headers = {k.lower(): v for k, v in resp.headers.items()}
                yield StreamReply(resp.status_code, headers, resp.aiter_raw())
            return
        query = _query(params)
        target = path + ("?" + query if query else "")
        async with self._plain.stream("GET", target) as reply:
            yield reply

    def _forward_request(
        self,
        method: str,
        path: str,
        params: ForwardParams,
        headers: Mapping[str, str] | list[tuple[str, str]] | None,
        content: Body | None,
        timeout: httpx.Timeout | None,
        length: int | None = None,
    ) -> httpx.Request:
        items = headers.items() if isinstance(headers, Mapping) else (headers or [])
        kept = [(k, v) for k, v in items if k.lower() not in _HOP_HEADERS]
        if length is not None:
            kept.append(("Content-Length", str(length)))
        ext = {"timeout": timeout.as_dict()} if timeout is not None else None
        return self._http.build_request(
            method, path, params=params, headers=kept, content=content, extensions=ext
        )

    async def _json(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        timeout: httpx.Timeout | None = None,
    ) -> Any:
        body = None if json_body is None else json.dumps(json_body).encode()
        reply = await self.call(
            method,
            path,
            params=params,
            body=body,
            content_type="application/json",
            timeout=timeout,
        )
        if reply.status >= 400:
            try:
                err: Any = json.loads(reply.body)
            except ValueError:
                text = reply.body.decode(errors="replace")[:500]
                err = {"error": {"code": None, "message": text}}
            raise agent_error(reply.status, err)
        data: Any = json.loads(reply.body)
        return data

    @asynccontextmanager
    async def _open_stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
    ) -> AsyncIterator[httpx.Response]:
        req = self._build(
            method,
            path,
            params=params,
            json_body=json_body,
            timeout=_STREAMING,
        )
        resp = await self._send(req, stream=True)
        try:
            await _raise_for_error(resp)
            yield resp
        except httpx.TransportError as e:
            raise AgentUnavailable(f"agent at {self._where()} broke off a stream: {e!r}") from e
        finally:
            await resp.aclose()

    # ------------------------------------------------------------ health

    async def health(self) -> dict[str, Any]:
        """`{"status": "ok", "version", "uptime_s", "pid"}`; needs no token."""
        data: dict[str, Any] = await self._json("GET", "/health")
        return data

    async def wait_ready(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll /health until the agent answers; fast at first (2 ms), backing off to 100 ms."""
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while True:
            try:
                return await self.health()
            except AgentUnavailable as e:
                if time.monotonic() + delay > deadline:
                    raise AgentUnavailable(
                        f"agent at {self._where()} not ready after {timeout_s:g} s: {e.message}"
                    ) from e
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.1)

    # ------------------------------------------------------------ exec

    async def exec(
        self, cmd: str | list[str] | ExecRequest, **options: Unpack[ExecOptions]
    ) -> ExecResult:
        """Run a command to completion (a string runs under /bin/sh -c)."""
        body = _exec_body(cmd, options)
        data = await self._json(
            "POST", "/exec", json_body=body, timeout=_read_timeout(body.get("timeout_s"))
        )
        return ExecResult.model_validate(data)

    async def exec_stream(
        self, cmd: str | list[str] | ExecRequest, **options: Unpack[ExecOptions]
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield `stdout`/`stderr` chunk events as they happen, then the `exit` event."""
        async with self._open_stream(
            "POST", "/exec/stream", json_body=_exec_body(cmd, options)
        ) as resp:
            async for event in _ndjson(resp):
                yield event

    # ------------------------------------------------------------ processes

    async def start_process(
        self, cmd: str | list[str] | ExecRequest, **options: Unpack[ProcessOptions]
    ) -> ProcessInfo:
        return ProcessInfo.model_validate(
            await self._json("POST", "/processes", json_body=_exec_body(cmd, options))
        )

    async def list_processes(self) -> list[ProcessInfo]:
        data = await self._json("GET", "/processes")
        return [ProcessInfo.model_validate(p) for p in data["processes"]]

    async def get_process(self, process_id: str) -> ProcessInfo:
        return ProcessInfo.model_validate(await self._json("GET", f"/processes/{process_id}"))

    async def process_output(
        self,
        process_id: str,
        *,
        stream: StreamName = "stdout",
        offset: int = 0,
        limit: int | None = None,
        encoding: Encoding = "text",
    ) -> ProcessOutput:
        params: dict[str, Any] = {"stream": stream, "offset": offset, "encoding": encoding}
        if limit is not None:
            params["limit"] = limit
        data = await self._json("GET", f"/processes/{process_id}/output", params=params)
        return ProcessOutput.model_validate(data)

    async def follow_process(
        self,
        process_id: str,
        *,
        stdout_offset: int = 0,
        stderr_offset: int = 0,
        encoding: Encoding = "text",
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the process's output chunks from the given offsets on, live, then `exit`."""
        params = {
            "stdout_offset": stdout_offset,
            "stderr_offset": stderr_offset,
            "encoding": encoding,
        }
        async with self._open_stream(
            "GET", f"/processes/{process_id}/follow", params=params
        ) as resp:
            async for event in _ndjson(resp):
                yield event

    async def write_stdin(
        self, process_id: str, data: str | bytes = "", *, close: bool = False
    ) -> None:
        """Write to the process's stdin (bytes travel base64-encoded); `close` sends EOF."""
        if isinstance(data, bytes):
            body = {"data": base64.b64encode(data).decode(), "encoding": "base64", "close": close}
        else:
            body = {"data": data, "encoding": "text", "close": close}
        await self.request("POST", f"/processes/{process_id}/stdin", json_body=body)

    async def signal_process(
        self, process_id: str, signal: str | int = "TERM", *, group: bool = True
    ) -> None:
        await self.request(
            "POST",
            f"/processes/{process_id}/signal",
            json_body={"signal": signal, "group": group},
        )

    async def resize_process(self, process_id: str, rows: int, cols: int) -> None:
        await self.request(
            "POST", f"/processes/{process_id}/resize", json_body={"rows": rows, "cols": cols}
        )

    async def wait_process(self, process_id: str, timeout_s: float | None = None) -> ProcessInfo:
        """Wait for the process to exit; its `status` stays `running` if `timeout_s` passed."""
        params = {"timeout_s": timeout_s} if timeout_s is not None else None
        data = await self._json(
            "GET",
            f"/processes/{process_id}/wait",
            params=params,
            timeout=_read_timeout(timeout_s),
        )
        return ProcessInfo.model_validate(data)

    async def delete_process(self, process_id: str) -> None:
        """Kill the process if it runs, and forget it."""
        await self.request("DELETE", f"/processes/{process_id}")

    # ------------------------------------------------------------ files

    async def read_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> bytes:
        resp = await self.request("GET", "/files", params=_range(path, offset, length))
        return resp.content

    async def iter_file(
        self, path: str, *, offset: int | None = None, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """Stream a file's bytes (for files too big to hold in memory)."""
        async with self._open_stream("GET", "/files", params=_range(path, offset, length)) as resp:
            async for chunk in resp.aiter_bytes():
                yield chunk

    async def write_file(
        self, path: str, data: Body, *, mode: int | None = None, overwrite: bool = True
    ) -> FileStat:
        """Write a file (parents created). `data` may be an async byte iterator, streamed."""
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
            timeout=_STREAMING,
        )
        return FileStat.model_validate(resp.json())

    async def stat(self, path: str) -> FileStat:
        return FileStat.model_validate(
            await self._json("GET", "/files/stat", params={"path": path})
        )

    async def list_dir(self, path: str) -> FileList:
        return FileList.model_validate(
            await self._json("GET", "/files/list", params={"path": path})
        )

    async def mkdir(self, path: str, *, mode: int = 0o755, parents: bool = True) -> FileStat:
        body = {"path": path, "mode": mode, "parents": parents}
        return FileStat.model_validate(await self._json("POST", "/files/mkdir", json_body=body))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self.request(
            "POST", "/files/remove", json_body={"path": path, "recursive": recursive}
        )

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> FileStat:
        body = {"src": src, "dst": dst, "overwrite": overwrite}
        return FileStat.model_validate(await self._json("POST", "/files/move", json_body=body))

    async def upload_tar(self, path: str, data: Body) -> TarResult:
        """Unpack a tar (or tar.gz) stream into the folder `path` (created if missing)."""
        resp = await self.request(
            "PUT",
            "/files/tar",
            params={"path": path},
            content=data,
            headers={"Content-Type": "application/x-tar"},
            timeout=_STREAMING,
        )
        return TarResult.model_validate(resp.json())

    async def download_tar(self, path: str) -> AsyncIterator[bytes]:
        """Stream a tar of the folder's contents (names relative to it)."""
        async with self._open_stream("GET", "/files/tar", params={"path": path}) as resp:
            async for chunk in resp.aiter_bytes():
                yield chunk


def _query(params: ForwardParams) -> str:
    """Encode query parameters as httpx would (multi-valued pairs kept, booleans lower-case)."""
    if not params:
        return ""
    if isinstance(params, str):
        return params.lstrip("?")
    multi = getattr(params, "multi_items", None)
    items = multi() if callable(multi) else list(params.items())
    return urlencode([(k, _query_value(v)) for k, v in items])


def _query_value(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    return "" if v is None else str(v)


def _range(path: str, offset: int | None, length: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"path": path}
    if offset is not None:
        params["offset"] = offset
    if length is not None:
        params["length"] = length
    return params
