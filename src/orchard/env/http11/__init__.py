"""The lean HTTP/1.1 transports: one framing module, a sync pool and an asyncio pool.

Every hop Orchard makes itself goes through these: the sync SDK (`LeanTransport`), the
async SDK (`AsyncLeanTransport`) and the service -> agent hop (`AsyncPool`, used by the
agent client). Both SDK transports fill httpx's transport seam, so a client can be given
any other (`Orchard(transport=httpx.MockTransport(handler))`). `transport_for` picks the
default once per client: the lean one, or httpx's own where the lean one does not go
(proxies from the environment; https for the sync client).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import httpx

from orchard.env.http11.aio import AsyncLeanTransport, AsyncPool
from orchard.env.http11.framing import IDEMPOTENT_EXTENSION, remove_dot_segments
from orchard.env.http11.sync import LeanTransport, Pool

__all__ = [
    "IDEMPOTENT_EXTENSION",
    "AsyncLeanTransport",
    "AsyncPool",
    "ClientTransport",
    "LeanTransport",
    "Pool",
    "async_transport_for",
    "remove_dot_segments",
    "transport_for",
]

PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def _proxied() -> bool:
    return any(os.environ.get(v) for v in PROXY_VARS)


class ClientTransport(httpx.BaseTransport):
    """An httpx.Client as a transport: its proxy settings (from the environment) and TLS."""

    def __init__(self) -> None:
        self.client = httpx.Client(timeout=None)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.client.send(request, stream=True)

    def close(self) -> None:
        self.client.close()


class AsyncClientTransport(httpx.AsyncBaseTransport):
    """The async twin of `ClientTransport`."""

    def __init__(self) -> None:
        self.client = httpx.AsyncClient(timeout=None)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.client.send(request, stream=True)

    async def aclose(self) -> None:
        await self.client.aclose()


def transport_for(base_url: str, uds: str | None = None) -> httpx.BaseTransport:
    """The sync client's transport: lean for a Unix socket or plain http, else httpx's."""
    if uds is not None:
        return LeanTransport.to(base_url, uds)
    if urlsplit(base_url).scheme != "http" or _proxied():
        return ClientTransport()
    return LeanTransport.to(base_url)


def async_transport_for(base_url: str, uds: str | None = None) -> httpx.AsyncBaseTransport:
    """The async client's transport: lean (TLS included) unless a proxy is configured."""
    if uds is None and _proxied():
        return AsyncClientTransport()
    return AsyncLeanTransport.to(base_url, uds)
