"""The Orchard SDK: `Orchard` (sync) and `AsyncOrchard` (async), twins with the same names.

    from orchard import Orchard

    with Orchard() as client, client.sandboxes.create(image="debian:12") as sb:
        print(sb.exec("uname -a").stdout)

Each route is described once in `_sdk_core` (what to send, whether it is safe to retry,
how to parse the answer); `_sdk_sync` and `_sdk_async` only send, through an httpx
transport (`orchard.env.http11` by default; any other, e.g. httpx.MockTransport, by
`transport=`). With no URL (argument or ORCHARD_URL) the client runs the service
in-process on the local Docker engine (the `server` extra) and stops it on `close()`.
"""

from __future__ import annotations

from orchard.env._sdk_async import (
    AsyncBatch,
    AsyncFiles,
    AsyncFork,
    AsyncNetwork,
    AsyncOrchard,
    AsyncProcesses,
    AsyncSandbox,
    AsyncSandboxes,
)
from orchard.env._sdk_base import embedded_service
from orchard.env._sdk_core import RetryPolicy
from orchard.env._sdk_pools import AsyncPools, Pools
from orchard.env._sdk_state import AsyncSnapshots, Snapshots
from orchard.env._sdk_sync import (
    Batch,
    Files,
    Fork,
    Network,
    Orchard,
    Processes,
    Sandbox,
    Sandboxes,
)

__all__ = [
    "AsyncBatch",
    "AsyncFiles",
    "AsyncFork",
    "AsyncNetwork",
    "AsyncOrchard",
    "AsyncPools",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncSnapshots",
    "Batch",
    "Files",
    "Fork",
    "Network",
    "Orchard",
    "Pools",
    "Processes",
    "RetryPolicy",
    "Sandbox",
    "Sandboxes",
    "Snapshots",
    "embedded_service",
]
