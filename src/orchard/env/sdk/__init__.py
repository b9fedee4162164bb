"""The Orchard SDK: `Orchard` (sync) and `AsyncOrchard` (async), twins with the same names.

    from orchard import Orchard

    with Orchard() as client, client.sandboxes.create(image="debian:12") as sb:
        print(sb.exec("uname -a").stdout)

Each route is described once in `calls/` (one module per resource: what to send, whether
it is safe to retry, how to parse the answer) over the `Call` of `core`; `sync/` and
`aio/` only send, through an httpx transport (`orchard.env.http11` by default; any other,
e.g. httpx.MockTransport, by `transport=`), and `send` turns a `Call` into the request.
With no URL (argument or ORCHARD_URL) the client runs the service in-process on the local
Docker engine (the `server` extra) and stops it on `close()`.

Everything public is exported here; the modules under it are internal.
"""

from __future__ import annotations

from orchard.env.sdk.aio.client import AsyncOrchard
from orchard.env.sdk.aio.files import AsyncFiles
from orchard.env.sdk.aio.processes import AsyncProcesses
from orchard.env.sdk.aio.resources import AsyncPools, AsyncSnapshots, AsyncVolumes
from orchard.env.sdk.aio.sandboxes import (
    AsyncBatch,
    AsyncFork,
    AsyncNetwork,
    AsyncSandbox,
    AsyncSandboxes,
)
from orchard.env.sdk.calls import CreateOptions, ExecOptions, FileData, PoolOptions, ProcessOptions
from orchard.env.sdk.core import RetryPolicy
from orchard.env.sdk.send import embedded_service
from orchard.env.sdk.sync.client import Orchard
from orchard.env.sdk.sync.files import Files
from orchard.env.sdk.sync.processes import Processes
from orchard.env.sdk.sync.resources import Pools, Snapshots, Volumes
from orchard.env.sdk.sync.sandboxes import Batch, Fork, Network, Sandbox, Sandboxes

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
    "AsyncVolumes",
    "Batch",
    "CreateOptions",
    "ExecOptions",
    "FileData",
    "Files",
    "Fork",
    "Network",
    "Orchard",
    "PoolOptions",
    "Pools",
    "ProcessOptions",
    "Processes",
    "RetryPolicy",
    "Sandbox",
    "Sandboxes",
    "Snapshots",
    "Volumes",
    "embedded_service",
]
