"""Transport-free core of the SDK: where to connect, what a call is, how answers parse.

`Orchard` and `AsyncOrchard` are thin twins over this module: every route is described
once as a `Call` (in `calls/`, one module per resource), and each client only sends it
(through its httpx transport, with the retry policy below) and hands the answer to the
call's parser. The resources reach their client through `Client` / `AsyncClient`, the
Protocols here, and the async methods carry their sync twin's documentation (`twin`).
"""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar
from urllib.parse import quote, unquote, urlsplit

import httpx
from pydantic import BaseModel, ValidationError

from orchard.env import models as m
from orchard.env.errors import (
    NOT_APPLIED,
    InvalidRequest,
    OrchardError,
    Unavailable,
    error_from_response,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])

# Extra read time granted on top of a server-side timeout, so the server reports it, not us.
TIMEOUT_MARGIN_S = 30.0
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


def as_timeout(timeout: float | httpx.Timeout) -> httpx.Timeout:
    """A client's default timeouts: seconds for every phase, or httpx's own object."""
    return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)


# Host name used in URLs sent over a Unix socket (it only fills the Host header).
UDS_HOST = "http://orchard.local"


# ---------------------------------------------------------------- where to connect


@dataclass(frozen=True)
class Target:
    """A resolved service address: an HTTP base URL, plus a Unix socket when it is one."""

    base_url: str
    uds: str | None = None
    api_key: str | None = None


def resolve_target(
    base_url: str | None, api_key: str | None, environ: Mapping[str, str] | None = None
) -> Target | None:
    """Explicit arguments win over ORCHARD_URL/ORCHARD_API_KEY; None means "run one in-process".

    `unix:///run/orchard.sock` (and `http+unix://%2Frun%2Forchard.sock`) name a Unix socket.
    """
    env = os.environ if environ is None else environ
    url = base_url or env.get("ORCHARD_URL") or None
    key = api_key or env.get("ORCHARD_API_KEY") or None
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = parts.path or parts.netloc
        if not path:
            raise ValueError(f"no socket path in {url!r}")
        return Target(UDS_HOST, uds=path, api_key=key)
    if parts.scheme == "http+unix":
        return Target(UDS_HOST, uds=unquote(parts.netloc), api_key=key)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"unsupported service URL {url!r}: use http(s)://host[:port] or unix:///path"
        )
    return Target(url.rstrip("/"), api_key=key)


def auth_headers(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}


# ---------------------------------------------------------------- retries


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded in attempts and per-wait delay.

    Only idempotent calls are retried once a request may have reached the server, unless
    the answer says the server took no effect of it (a replica that is stopping, e.g. in a
    rolling update); a connection that never opened is retried for every call, since
    nothing was sent.
    """

    attempts: int = 4
    base_s: float = 0.2
    cap_s: float = 5.0
    statuses: frozenset[int] = frozenset({502, 503, 504})

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0, ceiling)

    def should_retry_status(
        self, status: int, idempotent: bool, attempt: int, not_applied: bool = False
    ) -> bool:
        return (idempotent or not_applied) and status in self.statuses and attempt < self.attempts

    def should_retry_response(
        self, response: httpx.Response, call: Call[Any], attempt: int
    ) -> bool:
        not_applied = response.headers.get(NOT_APPLIED) == "1"
        return self.should_retry_status(response.status_code, call.idempotent, attempt, not_applied)

    def should_retry_error(self, exc: Exception, idempotent: bool, attempt: int) -> bool:
        if attempt >= self.attempts:
            return False
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            return True  # the request was never sent
        return idempotent and isinstance(exc, httpx.TransportError)


NO_RETRY = RetryPolicy(attempts=1)


def transport_error(exc: Exception, call: Call[Any]) -> OrchardError:
    """A network failure after retries, as the typed transient error."""
    what = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    sent = "" if call.idempotent else " (it may or may not have taken effect)"
    err = Unavailable(f"{call.method} {call.path} {what}{sent}: {exc!r}")
    err.__cause__ = exc
    return err


# ---------------------------------------------------------------- calls


Default = Literal["default"]
BodyFactory = Callable[[], bytes | Iterable[bytes]]
Params = list[tuple[str, str | int | float | bool | None]]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request, described without sending it."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Params = field(default_factory=list)
    json: Any = None
    # Called once per attempt, so a retried upload re-reads its source from the start.
    body: BodyFactory | None = None
    # The exact size of a streamed body, when known: sent as Content-Length, so every hop
    # passes the bytes straight through instead of framing (and copying) chunks.
    length: int | None = None
    idempotent: bool = False
    read_timeout: float | Default | None = "default"

    def timeout(self, base: httpx.Timeout) -> httpx.Timeout:
        if self.read_timeout == "default":
            return base
        return httpx.Timeout(
            connect=base.connect, read=self.read_timeout, write=base.write, pool=base.pool
        )


def raise_for_status(response: httpx.Response) -> None:
    """Turn an error answer (already read) into its typed exception."""
    if response.status_code < 400:
        return
    try:
        body: Any = response.json()
    except ValueError:
        body = {"error": {"code": "", "message": response.text[:500] or response.reason_phrase}}
    raise error_from_response(response.status_code, body)


def parse_model(model: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        return model.model_validate_json(response.content)

    return parse


def parse_none(response: httpx.Response) -> None:
    return None


def parse_bytes(response: httpx.Response) -> bytes:
    return response.content


def validated(model: type[M], **fields: Any) -> M:
    """Check a body locally so a bad argument fails before any request, as the server would."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidRequest(str(exc), details={"errors": exc.errors(include_url=False)}) from None


def dump(obj: BaseModel) -> Any:
    return obj.model_dump(mode="json", exclude_unset=True)


def sandbox_path(sandbox_id: str) -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}"


# ---------------------------------------------------------------- what resources need of a client


class Client(Protocol):
    """What the sync resources (`Sandbox`, `Files`, `Pools`, ...) need of `Orchard`."""

    target: Target

    def _send(self, call: Call[T]) -> T: ...

    def _stream(self, call: Call[Any]) -> AbstractContextManager[httpx.Response]: ...

    def _events(self, call: Call[Any]) -> Iterator[m.StreamEvent]: ...


class AsyncClient(Protocol):
    """What the async resources need of `AsyncOrchard`: the same, awaited."""

    target: Target

    async def _send(self, call: Call[T]) -> T: ...

    def _stream(self, call: Call[Any]) -> AbstractAsyncContextManager[httpx.Response]: ...

    def _events(self, call: Call[Any]) -> AsyncIterator[m.StreamEvent]: ...


def twin(sync_method: Callable[..., Any]) -> Callable[[F], F]:
    """Give an async method the documentation of its sync twin, so the two cannot drift
    apart in what they promise (the one way the async SDK documents itself)."""

    def copy(method: F) -> F:
        method.__doc__ = sync_method.__doc__
        return method

    return copy
