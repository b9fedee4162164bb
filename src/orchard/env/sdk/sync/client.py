"""The synchronous client, `Orchard`: where it connects, how it sends a `Call` (retries,
streams), and its resources (`sandboxes`, `snapshots`, `volumes`, `pools`).

Every public method of the sync resources carries its `:param`/`:return:`/`:raises`
documentation, which the async twins reuse (`core.twin`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

import httpx

from orchard.env import models as m
from orchard.env.http11 import transport_for
from orchard.env.sdk import calls, core
from orchard.env.sdk.core import RetryPolicy
from orchard.env.sdk.send import connect, send
from orchard.env.sdk.sync.resources import Pools, Snapshots, Volumes
from orchard.env.sdk.sync.sandboxes import Sandboxes

if TYPE_CHECKING:
    from orchard.env.config import ServiceConfig

T = TypeVar("T")


class Orchard:
    """Synchronous client of an Orchard service. A context manager: `close()` on exit.

    With no URL (argument or ORCHARD_URL) it runs the service in this process on the
    local Docker engine (the `server` extra) and stops it on `close()`.

    Every call raises the service's error as its class of `orchard.env.errors`
    (docs/sdk.md): besides what each method lists, Unauthorized (a bad key), RateLimited
    (too many requests), and Unavailable when the service cannot be reached after the
    retries.

    :param base_url: `http(s)://host:port`, or `unix:///path/to.sock`; default ORCHARD_URL
    :param api_key: sent as a bearer token; default ORCHARD_API_KEY
    :param timeout: default timeouts of a call, in seconds or an `httpx.Timeout`
        (commands with `timeout_s` wait longer)
    :param retry: how transient failures are retried (idempotent calls only, once sent)
    :param service_config: the in-process service's settings, when there is no URL
    :param transport: how requests are sent (default: Orchard's lean HTTP/1.1 transport;
        httpx's for https and proxies); e.g. `httpx.MockTransport(handler)` in tests. With a
        transport and no URL, no service is started: the transport answers.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = core.DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        service_config: ServiceConfig | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.target, self._service = connect(
            base_url, api_key, service_config, embed=transport is None
        )
        self._timeout = timeout = core.as_timeout(timeout)
        self._retry = retry or RetryPolicy()
        self._transport = transport or transport_for(self.target.base_url, self.target.uds)
        # For requests of the caller's own (e.g. to `sb.port_url(...)`), over the same transport.
        self.http = httpx.Client(
            base_url=self.target.base_url,
            headers=core.auth_headers(self.target),
            timeout=timeout,
            transport=self._transport,
        )
        self.sandboxes = Sandboxes(self)
        self.snapshots = Snapshots(self)
        self.volumes = Volumes(self)
        self.pools = Pools(self)

    def health(self) -> m.Health:
        """The service's health.

        :return: status (`ok` or `degraded`), version, backend and sandbox count
        :raises Unavailable: the service cannot be reached
        """
        return self._send(calls.health())

    def usage(self) -> m.Usage:
        """What this key holds now against its limits (`GET /v1/usage`).

        :return: sandboxes (incl. creating), cpu and memory summed over running ones, limits
        :raises Unauthorized: no key, or one the service does not know
        """
        return self._send(calls.usage())

    def close(self) -> None:
        """Close the connections, and stop the in-process service if this client started it.

        Raises nothing: a client closed twice is closed.
        """
        self.http.close()  # closes the transport too
        if self._service is not None:
            self._service.stop()
            self._service = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- sending

    def _request(self, call: core.Call[Any], *, stream: bool) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = send(self._transport, self.target, call, self._timeout, stream=stream)
            except httpx.TransportError as exc:
                if self._retry.should_retry_error(exc, call.idempotent, attempt):
                    time.sleep(self._retry.delay(attempt))
                    continue
                raise core.transport_error(exc, call) from exc
            if response.status_code >= 400:
                if self._retry.should_retry_response(response, call, attempt):
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
                if (event := calls.parse_event(line)) is not None:
                    yield event
