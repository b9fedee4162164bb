"""The service's client of one sandbox's agent (docs/agent-api.md): Unix socket or HTTP(S).

One `AgentClient` per sandbox, over a keep-alive `AsyncPool` (orchard.env.http11), since
the service makes many small calls. There is one generic path, not a method per route:
`send` passes a request through and returns the agent's answer as it is (the relay's
hot path, error answers included); `request` raises the agent's error as the typed
error of `orchard.env.errors`; `stream` and `events` read an answer as it arrives. A
failure to reach the agent, or to read its answer, is `AgentUnavailable`.

A call the agent has not answered after PROBE_AFTER_S has the agent's liveness checked
(`alive`: its /health on a connection of its own, shared by every call waiting then):
a long exec, a `wait` or a quiet server behind /proxy pass, since the agent answers its
health check while they run; an agent that answers nothing at all (stopped: a debugger
attached to PID 1, SIGSTOP) fails every waiting call with `SandboxUnresponsive` within
about PROBE_AFTER_S + PROBE_TIMEOUT_S, instead of each waiting out its own read timeout.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Self, TypedDict, Unpack
from urllib.parse import urlencode

import httpx
from pydantic import BaseModel

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
    SandboxUnresponsive,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_from_response,
)
from orchard.env.http11 import AsyncPool
from orchard.env.http11.aio import Request
from orchard.env.http11.framing import Answer
from orchard.env.wire import NOT_FORWARDED

Content = bytes | AsyncIterable[bytes]
# Query strings as a proxy receives them: raw, or multi-valued pairs via httpx.QueryParams.
Params = httpx.QueryParams | Mapping[str, Any] | str | None
Headers = Mapping[str, str] | Sequence[tuple[str, str]] | None


class Options(TypedDict, total=False):
    """What a request may carry besides its method and path (see `AgentClient.send`)."""

    params: Params
    headers: Headers
    content: Content | None
    json: Any
    length: int | None
    timeout: httpx.Timeout | None


# The agent closes a connection whose next request does not arrive within 30 s (its
# ReadHeaderTimeout), so an idle connection is dropped well before that.
IDLE_EXPIRY_S = 15.0
# For streams and uploads: connect quickly, then wait as long as the data takes.
STREAMING = httpx.Timeout(None, connect=10.0)
# The liveness check of a call left unanswered (issue 31): after PROBE_AFTER_S, then every
# PROBE_EVERY_S while it waits; the agent must answer /health within PROBE_TIMEOUT_S (it
# does in milliseconds, even while it runs long commands), and a probe that only timed
# out is tried once more on a new connection before the verdict, so a host under heavy
# load does not fail a busy but live sandbox; a verdict stands for VERDICT_S. A stopped
# agent is reported within PROBE_AFTER_S + PROBE_TRIES * PROBE_TIMEOUT_S (12 s).
PROBE_AFTER_S = 2.0
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 5.0
PROBE_TRIES = 2
VERDICT_S = 1.0
# The relay's one list, plus Content-Length: the body is framed anew for this hop.
_DROPPED = NOT_FORWARDED | {"content-length"}

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


def error_of(status: int, raw: bytes) -> OrchardError:
    """The typed error for an agent's error answer (its JSON body, or whatever it sent)."""
    try:
        body: Any = jsonlib.loads(raw)
    except ValueError:
        body = {"error": {"code": None, "message": raw.decode(errors="replace")[:500]}}
    return agent_error(status, body)


def read_timeout(timeout_s: float | None, margin: float = 30.0) -> httpx.Timeout:
    """An HTTP timeout that outlives a command's own (none if the command has none)."""
    read = None if not timeout_s else float(timeout_s) + margin
    return httpx.Timeout(read, connect=10.0)


class AgentClient:
    """Talk to one sandbox's agent. Use as `async with AgentClient(...) as agent:`.

    :param socket_path: the agent's Unix socket (Docker and local backends)
    :param base_url: or its `http(s)://` URL (Kubernetes: the pod IP)
    :param token: the sandbox's agent token (every route but /health needs it)
    :param timeout: the read timeout of a call that names none
    """

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
        self.socket_path = os.fspath(socket_path) if socket_path is not None else None
        self.base_url = base_url or "http://agent"
        self._fixed = [("Host", httpx.URL(self.base_url).netloc.decode("ascii") or "agent")]
        if token:
            self._fixed.append(("Authorization", f"Bearer {token}"))
        self._pool = self._new_pool(max_connections)
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._probing: asyncio.Task[bool] | None = None
        self._verdict = (-VERDICT_S, True)  # (when, alive)
        self._held = 0  # > 0 while the service itself has the sandbox frozen (`held`)
        self._first: tuple[str, str, str] | None = None  # see `first`
        self._firsts_made: set[tuple[str, str, str]] = set()
        self._settling: asyncio.Future[None] | None = None

    def _new_pool(self, max_connections: int) -> AsyncPool:
        opts: dict[str, Any] = {
            "headers": self._fixed,
            "max_connections": max_connections,
            "idle_expiry_s": IDLE_EXPIRY_S,
        }
        if self.socket_path is not None:
            return AsyncPool(uds=self.socket_path, **opts)
        return AsyncPool.for_url(self.base_url, **opts)

    @classmethod
    def for_endpoint(cls, endpoint: AgentEndpoint, token: str, **kw: Any) -> AgentClient:
        """A client for where a backend says the sandbox's agent listens."""
        if endpoint.socket_path:
            return cls(socket_path=endpoint.socket_path, token=token, **kw)
        return cls(base_url=endpoint.base_url, token=token, **kw)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._pool.aclose()

    def _where(self) -> str:
        return self.socket_path or self.base_url

    def _unavailable(self, exc: httpx.TransportError) -> AgentUnavailable:
        if isinstance(exc, httpx.TimeoutException):
            return AgentUnavailable(
                f"agent at {self._where()} did not answer in time ({type(exc).__name__})"
            )
        return AgentUnavailable(f"agent at {self._where()} is not reachable: {exc!r}")

    # ------------------------------------------------------------ a call before all others

    def first(self, method: str, path: str, body: str) -> None:
        """Make this call (a JSON body) before any other through this client, once: a
        claimed sandbox's defaults (PUT /defaults), which must reach the agent before the
        sandbox's first command whichever replica serves it. A no-op once made."""
        call = (method, path, body)
        if call not in self._firsts_made:
            self._first = call

    async def settle(self) -> None:
        """Make the call `first` named, if not made yet (one for all waiting callers);
        its failure is each caller's error, and the next call tries again."""
        while self._first is not None:
            task = self._settling
            if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
                task = self._settling = asyncio.ensure_future(self._make_first(self._first))
            await asyncio.shield(task)

    async def _make_first(self, call: tuple[str, str, str]) -> None:
        method, path, body = call
        target, request = self._request(
            path, {"content": body.encode(), "headers": [("Content-Type", "application/json")]}
        )
        try:
            resp = await self._pool.send(method, target, **request)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e
        if resp.status_code >= 400:
            raise error_of(resp.status_code, resp.content)
        self._firsts_made.add(call)
        if self._first == call:
            self._first = None

    # ------------------------------------------------------------ the generic path

    async def send(
        self, method: str, path: str, *, stream: bool = False, **opts: Unpack[Options]
    ) -> httpx.Response:
        """Send a request as given; the agent's answer comes back as it is (errors included).

        :param method: the HTTP method
        :param path: the agent route (already encoded), e.g. `/exec`
        :param opts: `params` (the query: a mapping, multi-valued `httpx.QueryParams`, or a
            string); `headers` (passed on, but for hop-by-hop ones and the caller's
            credentials: the agent sees only its own token); `content` (bytes, or an async
            stream: then `length`, if known, goes as Content-Length, else it is chunked) or
            `json` (a pydantic model or plain data); `timeout` (default: this client's)
        :param stream: leave the body unread (then `aclose()` the response)
        :return: the agent's answer; only a failure to reach it raises (AgentUnavailable)
        """
        if self._first is not None:
            await self.settle()
        target, request = self._request(path, opts)
        try:
            with _Watch(self):
                return await self._pool.send(method, target, stream=stream, **request)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e

    async def call(self, method: str, path: str, **opts: Unpack[Options]) -> Answer:
        """As `send`, the answer read whole into a plain `Answer` (status, raw headers,
        content): the relay's hot path, which passes the bytes on as they are."""
        if self._first is not None:
            await self.settle()
        target, request = self._request(path, opts)
        try:
            with _Watch(self):
                return await self._pool.answer(method, target, **request)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e

    def _request(self, path: str, opts: Options) -> tuple[str, Request]:
        headers = _kept(opts.get("headers"))
        content = opts.get("content")
        if (body := opts.get("json")) is not None:
            content = _json_bytes(body)
            headers.append(("Content-Type", "application/json"))
        query = _query(opts.get("params"))
        return path + ("?" + query if query else ""), {
            "headers": headers,
            "body": content,
            "length": opts.get("length"),
            "timeout": opts.get("timeout") or self._timeout,
        }

    async def request(self, method: str, path: str, **opts: Unpack[Options]) -> httpx.Response:
        """As `send`, read whole; an error answer raises as its typed error.

        :return: the agent's (successful) answer
        """
        resp = await self.send(method, path, **opts)
        if resp.status_code >= 400:
            raise error_of(resp.status_code, resp.content)
        return resp

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, **opts: Unpack[Options]
    ) -> AsyncIterator[httpx.Response]:
        """As `send`, with the body read as the caller iterates (`resp.aiter_raw()`).

        No read timeout unless `timeout` says otherwise: streams may stay quiet for long.
        A failure while reading raises AgentUnavailable.
        """
        if not opts.get("timeout"):
            opts["timeout"] = STREAMING
        resp = await self.send(method, path, stream=True, **opts)
        try:
            yield resp
        except httpx.TransportError as e:
            raise AgentUnavailable(f"agent at {self._where()} broke off a stream: {e!r}") from e
        finally:
            await resp.aclose()

    async def events(
        self, method: str, path: str, *, params: Params = None, json: Any = None
    ) -> AsyncIterator[dict[str, Any]]:
        """An NDJSON stream's events (exec/stream, follow); an error answer or line raises."""
        async with self.stream(method, path, params=params, json=json) as resp:
            if resp.status_code >= 400:
                raise error_of(resp.status_code, await resp.aread())
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                event: dict[str, Any] = jsonlib.loads(line)
                if event.get("type") == "error":
                    raise agent_error(422, {"error": event})
                yield event

    # ------------------------------------------------------------ liveness

    @contextmanager
    def held(self) -> Iterator[None]:
        """While the service itself freezes the sandbox (a snapshot's commit or dump),
        calls in flight wait for it instead of failing as unresponsive."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1

    async def alive(self) -> bool:
        """Whether the agent answers at all: its /health within PROBE_TIMEOUT_S, on a
        connection of its own. One check at a time, shared by every caller; its verdict
        stands for VERDICT_S. Alive by definition while `held`."""
        if self._held:
            return True
        at, verdict = self._verdict
        if time.monotonic() - at < VERDICT_S:
            return verdict
        probing = self._probing
        if (
            probing is None
            or probing.done()
            or probing.get_loop() is not asyncio.get_running_loop()
        ):
            probing = self._probing = asyncio.ensure_future(self._probe())
        return await asyncio.shield(probing)

    async def _probe(self) -> bool:
        # A connection of its own, so it never waits behind the calls, and closed at once:
        # an idle one left open would outlive `aclose` (a memory snapshot's CRIU dump
        # refuses a sandbox with a Unix connection to the outside).
        alive = False
        for _ in range(PROBE_TRIES):
            pool = self._new_pool(1)
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S):
                    await pool.answer("GET", "/health", timeout=_PROBE)
                alive = True  # any answer: the agent runs
            except (TimeoutError, httpx.TimeoutException):
                continue  # slow, not refused: once more before the verdict
            except (httpx.TransportError, OSError):
                pass  # refused or reset: no agent listens
            finally:
                await pool.aclose()
            break
        self._verdict = (time.monotonic(), alive)
        return alive

    # ------------------------------------------------------------ readiness

    async def health(self) -> dict[str, Any]:
        """The agent's /health (needs no token).

        :return: `{"status": "ok", "version", "uptime_s", "pid"}` (models.AgentHealth)
        """
        data: dict[str, Any] = (await self.request("GET", "/health")).json()
        return data

    async def wait_ready(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Poll /health until the agent answers; fast at first (2 ms), backing off to 100 ms.

        :param timeout_s: give up after this long (AgentUnavailable)
        :return: the first health answer
        """
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


_PROBE = httpx.Timeout(PROBE_TIMEOUT_S)


class _Watch:
    """Guards one call to the agent (`with _Watch(agent): await ...`): from PROBE_AFTER_S
    on, checks that the agent is alive every PROBE_EVERY_S, and if it is not, cancels the
    call and raises SandboxUnresponsive in its place. Costs a timer on the hot path."""

    __slots__ = ("agent", "task", "timer", "tripped", "watcher")

    def __init__(self, agent: AgentClient) -> None:
        self.agent = agent
        self.watcher: asyncio.Task[None] | None = None
        self.tripped = False

    def __enter__(self) -> None:
        self.task = asyncio.current_task()
        self.timer = asyncio.get_running_loop().call_later(PROBE_AFTER_S, self._start)

    def _start(self) -> None:
        self.watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while await self.agent.alive():
            await asyncio.sleep(PROBE_EVERY_S)
        if self.task is not None:
            self.tripped = True
            self.task.cancel()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.timer.cancel()
        if self.watcher is not None:
            self.watcher.cancel()
        if self.tripped and self.task is not None:
            self.task.uncancel()  # our cancel, not the caller's: it ends here
            raise SandboxUnresponsive(
                f"the agent stopped answering (not even its health check, {PROBE_TRIES} "
                f"times {PROBE_TIMEOUT_S:g} s)"
            ) from None


def _json_bytes(body: Any) -> bytes:
    if isinstance(body, BaseModel):
        return body.model_dump_json(exclude_none=True).encode()
    return jsonlib.dumps(body).encode()


def _kept(headers: Headers) -> list[tuple[str, str]]:
    items = headers.items() if isinstance(headers, Mapping) else (headers or [])
    return [(k, v) for k, v in items if k.lower() not in _DROPPED]


def _query(params: Params) -> str:
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
