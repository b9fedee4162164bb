"""What the SDK twins share besides the calls: where to connect, and how a call is sent.

`connect` resolves the service (an argument, ORCHARD_URL, or an in-process service);
`build_request` turns a `Call` into the httpx.Request a transport sends, the same way for
`Orchard` and `AsyncOrchard`, whatever the transport (lean, httpx's, a MockTransport).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx

from orchard.env.http11 import IDEMPOTENT_EXTENSION
from orchard.env.sdk import core
from orchard.env.sdk.core import Target
from orchard.env.sdk.tar import coalesce

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig
    from orchard.env.server import EmbeddedService


def embedded_service(config: ServiceConfig | None) -> EmbeddedService:
    """The in-process service of the no-URL mode; it needs the `server` extra installed."""
    try:
        # Imported here: the service (FastAPI, uvicorn, a Docker client) is only needed now.
        from orchard.env.server import EmbeddedService
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"Orchard() without a URL runs the service in this process, which needs "
            f"{e.name!r}: pip install 'orchard[server]' (or pass base_url=, or set "
            f"ORCHARD_URL, to use a running service)",
            name=e.name,
        ) from e
    return EmbeddedService(config)


def connect(
    base_url: str | None,
    api_key: str | None,
    service_config: ServiceConfig | None,
    *,
    embed: bool = True,
) -> tuple[Target, EmbeddedService | None]:
    """The service to talk to, and the in-process one started for it (None for a URL).

    With no URL and `embed` False (a transport was given), nothing is started: the
    transport decides where requests go.
    """
    target = core.resolve_target(base_url, api_key)
    if target is not None:
        return target, None
    if not embed:
        return core.resolve_target(core.UDS_HOST, api_key) or Target(core.UDS_HOST), None
    service = embedded_service(service_config).start()
    return Target(core.UDS_HOST, uds=service.socket_path), service


def port_url(target: Target, sandbox_id: str, port: int, path: str, with_key: bool) -> str:
    url = f"{target.base_url}{core.sandbox_path(sandbox_id)}/ports/{port}/{path.lstrip('/')}"
    if with_key and target.api_key:
        url += "?" + urlencode({"orchard_key": target.api_key})
    return url


@functools.lru_cache(maxsize=1024)
def _url(url: str) -> httpx.URL:
    # Parsing a URL is most of what building a request costs (~15 us); an agent loop sends
    # to the same few URLs over and over, and httpx.URL is immutable.
    return httpx.URL(url)


def build_request(
    target: Target, call: core.Call[Any], timeout: httpx.Timeout, content: Any = None
) -> httpx.Request:
    """The request for one attempt of `call` (`content`: this attempt's body, if any)."""
    url = target.base_url + call.path
    if call.params:
        url += "?" + str(httpx.QueryParams(call.params))
    headers = core.auth_headers(target)
    if call.length is not None:
        headers["Content-Length"] = str(call.length)
    if call.json is not None:
        # As httpx encodes json=: compact, UTF-8, no NaN (a bad argument fails here, unsent).
        text = json.dumps(call.json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        content = text.encode()
        headers["Content-Type"] = "application/json"
    return httpx.Request(
        call.method,
        _url(url),
        headers=headers,
        content=content,
        extensions={
            "timeout": call.timeout(timeout).as_dict(),
            IDEMPOTENT_EXTENSION: call.idempotent,
        },
    )


def send(
    transport: httpx.BaseTransport,
    target: Target,
    call: core.Call[Any],
    timeout: httpx.Timeout,
    *,
    stream: bool,
) -> httpx.Response:
    """One attempt of `call` over a sync transport; the answer read whole unless `stream`."""
    body = call.body() if call.body else None  # once per attempt: a fresh source
    response = transport.handle_request(build_request(target, call, timeout, body))
    if not stream:
        try:
            response.read()
        finally:
            response.close()
    return response


async def send_async(
    transport: httpx.AsyncBaseTransport,
    target: Target,
    call: core.Call[Any],
    timeout: httpx.Timeout,
    *,
    stream: bool,
) -> httpx.Response:
    """One attempt of `call` over an async transport (a blocking body read in a thread)."""
    body = call.body() if call.body else None
    content = body if body is None or isinstance(body, bytes) else aiter_body(body)
    response = await transport.handle_async_request(build_request(target, call, timeout, content))
    if not stream:
        try:
            await response.aread()
        finally:
            await response.aclose()
    return response


async def aiter_body(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """Read a (blocking, disk-backed) body in a worker thread, coalesced into big pieces."""
    it = coalesce(chunks)
    while (chunk := await asyncio.to_thread(next, it, None)) is not None:
        yield chunk
