"""The asynchronous client, `AsyncOrchard`: `Orchard`'s names, awaited.

Each method is the awaited twin of the sync method of the same name and carries its
documentation (`core.twin`), so the two cannot drift apart in what they promise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

import httpx

from orchard.env import models as m
from orchard.env.http11 import async_transport_for
from orchard.env.sdk import calls, core
from orchard.env.sdk.aio.resources import AsyncPools, AsyncSnapshots, AsyncVolumes
from orchard.env.sdk.aio.sandboxes import AsyncSandboxes
from orchard.env.sdk.core import RetryPolicy, twin
from orchard.env.sdk.send import connect, send_async
from orchard.env.sdk.sync.client import Orchard

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig

T = TypeVar("T")


class AsyncOrchard:
    """Asynchronous client of an Orchard service: `Orchard`'s names, awaited.

    :param base_url: `http(s)://host:port`, or `unix:///path/to.sock`; default ORCHARD_URL
    :param api_key: sent as a bearer token; default ORCHARD_API_KEY
    :param timeout: default timeouts of a call, in seconds or an `httpx.Timeout`
        (commands with `timeout_s` wait longer)
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
        timeout: float | httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.target, self._service = connect(
            base_url, api_key, service_config, embed=transport is None
        )
        self._timeout = timeout = core.as_timeout(timeout)
        self._retry = retry or RetryPolicy()
        self._transport = transport or async_transport_for(self.target.base_url, self.target.uds)
        self._http: httpx.AsyncClient | None = None
        self.sandboxes = AsyncSandboxes(self)
        self.snapshots = AsyncSnapshots(self)
        self.volumes = AsyncVolumes(self)
        self.pools = AsyncPools(self)

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

    @twin(Orchard.health)
    async def health(self) -> m.Health:
        return await self._send(calls.health())

    @twin(Orchard.usage)
    async def usage(self) -> m.Usage:
        return await self._send(calls.usage())

    @twin(Orchard.close)
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
                if self._retry.should_retry_response(response, call, attempt):
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
                if (event := calls.parse_event(line)) is not None:
                    yield event
